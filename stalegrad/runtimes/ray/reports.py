"""What the driver reports to summary.json: the transport's figures and, under a speed profile, each
worker's pacing (a mixin of ``driver.Driver``; ``direct.DirectDriver`` adds its own transport figures)."""
from __future__ import annotations

import sys
import time


class Reports:
    def pace_by(self, profile, seed: int) -> None:
        """Pace the workers by ``profile`` (a ``core.pacing.Profile``; None: run at full speed)."""
        self.profile, self.seed = profile, seed

    def pacer(self, m: int):
        """Worker m's ``Pacer`` (None without a profile); a replacement starts on the run's second 0."""
        if self.profile is None:
            return None
        return self.profile.pacer(m, self.seed, self.profile_t0 if self.profile_t0 is not None else time.time())

    def start_profile(self) -> None:
        """Every worker has started: the profile's second 0 (``profile_t0``, as time.time()) is now, which
        falls at the run's second ``profile_started_s``."""
        if self.profile is not None:
            self.profile_t0 = time.time() - (float(self.resume["now"]) if self.resume else 0.0)
            self.profile_started_s = time.perf_counter() - self.t0
            self.ray.get([a.start_profile.remote(self.profile_t0) for a in self.actors.values()])

    def report_pacing(self) -> None:
        """summary.json's ``pacing``: each live worker's figures (a lost worker's went with its actor: zeros)."""
        live = sorted(m for m in self.live if m in self.actors)
        try:
            got = self.ray.get([self.actors[m].pacing.remote() for m in live], timeout=30)
        except Exception:   # (an actor lost at the very end: its figures go missing, the run does not)
            got = [None] * len(live)
        figures, text = self.profile.summary(dict(zip(live, got)), self.server, self.profile_started_s)
        self.training.note(text, pacing=figures)
        if text is not None:
            print(f"stalegrad: warning: {text}", file=sys.stderr, flush=True)

    def transport(self) -> dict:
        """summary.json's ``transport``: a push's round trip (the driver's call to the shards), the bytes
        of weights a message moves, the pulls that went with a push."""
        s = sorted(self.push_s)
        return {"push_ms_median": round(1000 * s[len(s) // 2], 4) if s else None,
                "push_ms_p90": round(1000 * s[int(0.9 * len(s))], 4) if s else None,
                "weight_bytes_per_message": 2 * 4 * int(self.server.w.numel()),
                "pulls_with_push": self.pulls_with_push,
                "shards": self.K}

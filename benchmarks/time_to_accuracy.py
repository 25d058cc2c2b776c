"""Time to accuracy: wall seconds until the test accuracy first reaches a target.

    .venv/bin/python benchmarks/time_to_accuracy.py --quick   # make bench: target 0.75, 60 s cap, three arms
    .venv/bin/python benchmarks/time_to_accuracy.py           # target 0.85, 300 s cap, every arm (< 30 min)

Fashion-MNIST (60,000 / 10,000), agn-mlp (784-1000-2000-1000-10), batch 128,
Adam with lr 0.001 everywhere (AGN's local optimizer and its default), seed 0:

- ``plain``: a plain PyTorch loop (``torch.optim.Adam``, one process, torch's
  threads), the baseline;
- ``sim agn n=M w=W``: ``stalegrad.train`` with AGN in the simulator, one worker
  at a time (n=8 w=10; and n=40 w=40, the AGN paper's cluster, without --quick);
- ``sim agn n=40 w=40 vectorised``: the same with ``Simulator(vectorised=True)``
  (without --quick; a note saying it fell back to one worker at a time is shown);
- ``local agn n=2 w=W``: the local runtime, 2 worker processes (one thread each;
  w=10, and w=40 without --quick).

Every arm evaluates the whole test set every ``EVAL_EVERY`` epochs of samples;
the time of an evaluation done in this process is not counted (the plain loop's
and the simulator's), the local runtime evaluates in a process of its own while
training goes on. The clock of a stalegrad arm starts when its run is built
(``wall_s`` of ``metrics.jsonl``), so the local runtime's process start-up is
counted: that is what a user waits. On a busy machine ``--clock cpu`` times the
single-process arms in CPU seconds of one thread instead, and leaves the local
runtime out. An arm stops at the target or at the cap;
then its ratio is a lower bound ("> x"). Ratios are time / plain's time, all
arms in one run, one after the other.
"""
from __future__ import annotations

import time

import common  # stalegrad first: its OMP_WAIT_POLICY default must reach libgomp
import torch
import torch.nn.functional as F

import stalegrad as sg
from stalegrad.core.worker import FlatModel
from stalegrad.models import build_model

MODEL, BATCH, LR, SEED = "agn-mlp", 128, 0.001, 0
EVAL_EVERY = 0.05                 # epochs: 3,000 samples
TARGET, CAP_S = 0.85, 300.0
QUICK_TARGET, QUICK_CAP_S = 0.75, 60.0


class Stop(Exception):
    """Raised from on_eval: the target is reached, or the arm's time is up."""


class EvalClock:
    """Times every FlatModel.evaluate of this process, so that arms can leave evaluation out."""

    def __init__(self):
        self.spans: list[tuple[float, float]] = []   # (start, seconds)

    def __enter__(self):
        self.original = FlatModel.evaluate
        clock = self

        def timed(model, *a, **kw):
            t, c = time.perf_counter(), common.clock()
            try:
                return clock.original(model, *a, **kw)
            finally:
                clock.spans.append((t, common.clock() - c))
        FlatModel.evaluate = timed
        return self

    def __exit__(self, *exc):
        FlatModel.evaluate = self.original

    def before(self, moment: float) -> float:
        return sum(s for t, s in self.spans if t < moment)


def plain_adam(train, test, target: float, cap: float) -> dict:
    torch.manual_seed(SEED)
    model = build_model(MODEL, tuple(train.x.shape[1:]), 10)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(SEED)
    n, every = len(train.y), int(EVAL_EVERY * len(train.y))
    perm, pos, samples, next_eval = torch.randperm(n, generator=gen), 0, 0, every
    trained, acc, best = 0.0, 0.0, 0.0
    while True:
        t = common.clock()
        model.train()
        while samples < next_eval:
            if pos + BATCH > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos:pos + BATCH]
            pos += BATCH
            samples += BATCH
            opt.zero_grad()
            F.cross_entropy(model(train.x.index_select(0, idx)), train.y.index_select(0, idx)).backward()
            opt.step()
        trained += common.clock() - t
        next_eval += every
        model.eval()
        with torch.no_grad():
            acc = sum((model(test.x[i:i + 1000]).argmax(1) == test.y[i:i + 1000]).sum().item()
                      for i in range(0, len(test.y), 1000)) / len(test.y)
        best = max(best, acc)
        if acc >= target or trained >= cap:
            return {"seconds": trained, "reached": acc >= target, "best_acc": best, "samples": samples}


def stalegrad_arm(train, test, algorithm, workers: int, runtime, target: float, cap: float,
                  evals_elsewhere: bool) -> dict:
    out = {"reached": False, "best_acc": 0.0, "notes": []}
    start, start_cpu = time.perf_counter(), common.clock()
    cpu = common.clock_name() == "cpu"

    def on_eval(record):
        if cpu:   # in-process runtimes only: this process's CPU time, every evaluation so far left out
            seconds = common.clock() - start_cpu - sum(s for _, s in clock.spans)
        else:
            moment = start + record["wall_s"]      # when the weights were evaluated (its record was made)
            seconds = record["wall_s"] - clock.before(moment)
        out.update(seconds=seconds, samples=record["samples"], best_acc=max(out["best_acc"], record["test_acc"]))
        if record["test_acc"] >= target:
            out["reached"] = True
            raise Stop
        if seconds >= cap:
            raise Stop

    with EvalClock() as clock:
        try:
            res = sg.train(MODEL, train, test, algorithm, workers=workers, runtime=runtime, epochs=1000,
                           batch_size=BATCH, lr=LR, seed=SEED, eval_every=EVAL_EVERY, on_eval=on_eval)
            out["notes"] = res.summary["notes"]
        except Stop:
            pass
    out["evaluation"] = "own process" if evals_elsewhere else "not counted"
    out["loadavg"] = common.load()
    return out


class Rows(list):
    """The table's rows, each printed as it comes (a full run takes many minutes)."""

    def append(self, row: dict) -> None:
        super().append(row)
        if "seconds" in row:
            print(f"  {row['arm']}: {row['seconds']:.1f} s, target {'reached' if row['reached'] else 'not reached'}, "
                  f"best accuracy {row['best_acc']:.4f}, load average {row['loadavg']}", flush=True)


def fell_back(row: dict) -> dict:
    """A vectorised arm that ran one worker at a time says so."""
    if any("vectorised simulation not used" in n for n in row.get("notes", [])):
        row["evaluation"] += "; fell back to one worker at a time"
    return row


def run(quick: bool = False, target: float | None = None, cap: float | None = None) -> dict:
    target = target if target is not None else (QUICK_TARGET if quick else TARGET)
    cap = cap if cap is not None else (QUICK_CAP_S if quick else CAP_S)
    train, test = sg.load_pair("fashion-mnist")
    rows = Rows()
    rows.append(dict(arm="plain Adam (baseline)", **plain_adam(train, test, target, cap), evaluation="not counted",
                     loadavg=common.load()))
    sims = [(8, 10, False)] + ([] if quick else [(40, 40, False), (40, 40, True)])
    for workers, window, vectorised in sims:
        row = dict(arm=f"sim agn n={workers} w={window}" + (" vectorised" if vectorised else ""),
                   **stalegrad_arm(train, test, sg.AGN(window=window), workers, sg.Simulator(vectorised=vectorised),
                                   target, cap, False))
        rows.append(fell_back(row))
    for window in (10,) if quick else (10, 40):
        if common.clock_name() == "cpu":
            rows.append({"arm": f"local agn n=2 w={window}", "absent": "wall clock only (several processes)"})
            continue
        rows.append(dict(arm=f"local agn n=2 w={window}",
                         **stalegrad_arm(train, test, sg.AGN(window=window), 2, sg.LocalRuntime(), target, cap, True)))
    base = rows[0]["seconds"] if rows[0]["reached"] else None
    for r in rows:
        if "seconds" in r and base:
            r["ratio"] = r["seconds"] / base
    return {"rows": list(rows), "target_acc": target, "cap_s": cap, "eval_every_epochs": EVAL_EVERY}


def table(rows: list[dict], target: float, cap: float) -> dict:
    cols = ["arm", f"s to {target:.2f}", "x plain", "samples", "best acc", "evaluation"]
    body = []
    for r in rows:
        if "absent" in r:
            body.append([r["arm"], "-", "-", "-", "-", r["absent"]])
            continue
        bound = "" if r["reached"] else "> "
        ratio = f"{bound}{r['ratio']:.2f}" if "ratio" in r else "-"
        body.append([r["arm"], f"{bound}{r['seconds']:.1f}", ratio, f"{r['samples']:,}", f"{r['best_acc']:.4f}",
                     r["evaluation"]])
    return common.page_table(f"agn-mlp on Fashion-MNIST, Adam lr 0.001, batch 128: seconds to a test accuracy of "
                             f"{target:.2f} (an arm stops at {cap:g} s: then '>')", cols, body)


def main(argv=None) -> int:   # --clock cpu: the local runtime's rows are left out (several processes)
    ap = common.options(__doc__)
    ap.add_argument("--target", type=float, default=None, help="test accuracy [0.85; --quick 0.75]")
    ap.add_argument("--cap", type=float, default=None, help="seconds per arm [300; --quick 60]")
    args = ap.parse_args(argv)
    common.settle(ap, args)
    bench = common.Benchmark("time_to_accuracy", args.quick)
    result = run(args.quick, args.target, args.cap)
    bench.finish([table(result["rows"], result["target_acc"], result["cap_s"])], result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

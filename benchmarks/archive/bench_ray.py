"""Throughput of ``--runtime ray`` against ``--runtime local`` on the same configuration, in one run.

    .venv/bin/python benchmarks/archive/bench_ray.py                 # ~3 min on a quiet 2-core machine
    .venv/bin/python benchmarks/archive/bench_ray.py --epochs 0.5    # a quicker look

For agn-mlp on Fashion-MNIST (synthetic 1x28x28 data of the same size when it
is not installed), batch 128, AGN with local Adam and window 10 and 40, M = 2
workers with one thread each, it runs the local runtime and the Ray runtime
(one server shard; a Ray instance started once, before the runs) and measures
samples/s in steady state: between the first and the last evaluation after
epoch 0, from ``metrics.jsonl``'s ``samples`` and ``wall_s``, so that start-up
is left out. The target is Ray >= 0.8 of local for window >= 10.

It also times one pull and one push through Ray's object store against a
server shard of 4.8M parameters (agn-mlp's size), the per-update transport
cost, and reports the bytes of weights one message moves.

Writes benchmarks/archive/results/ray.json and prints a markdown table.

Since issue 33 a one-shard run of an asynchronous rule takes Ray's direct path; ``--small`` still
profiles the driver's path (its runtimes make ``driver.Driver`` subclasses), as in issue 19.
``benchmarks/archive/ray_overhead.py`` compares both paths with the local runtime and a bare round trip.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# numpy and torch before stalegrad, as this script has always run (the local baseline's workers and Ray's
# actors are processes of their own, which import stalegrad first)
import numpy as np
import torch

import common

import stalegrad as sg
from stalegrad.runtimes.ray import LOCAL_SYSTEM_CONFIG


def steady_rate(metrics: list[dict]) -> float:
    points = [(m["wall_s"], m["samples"]) for m in metrics if m["samples"] > 0]
    (t0, s0), (t1, s1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0)


def run(runtime, window: int, epochs: float, train, test) -> dict:
    algo = sg.make_algorithm("agn", window=window)
    res = sg.train("agn-mlp", train, test, algo, 2, runtime, epochs=epochs, batch_size=128, eval_every=epochs / 5,
                   seed=0)
    return {"samples_per_s": steady_rate(res.metrics), "wall_s": res.summary["wall_s"],
            "final_test_acc": res.summary["final_test_acc"], "transport": res.summary.get("transport")}


def transport_cost(numel: int, repeats: int = 20) -> dict:
    """One pull and one push (prepare + commit) of ``numel`` float32 through a Ray server shard."""
    import ray

    from stalegrad.runtimes.ray.actors import ShardActor, to_numpy
    algo = sg.make_algorithm("asgd")
    shard = ray.remote(num_cpus=0)(ShardActor).remote(algo, numel, 2, "skip")
    server = sg.ParameterServer(algo, torch.zeros(numel), 2)
    ray.get(shard.load.remote(to_numpy(server.state_dict())))
    msg = ray.put(np.zeros(numel, np.float32))
    pulls, pushes = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        w = ray.get(shard.pull.remote(0))
        pulls.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get(shard.prepare.remote(0, msg, 0.1, True))
        ray.get(shard.commit.remote(True))
        pushes.append(time.perf_counter() - t)
    del w
    ray.kill(shard)
    return {"parameters": numel, "pull_ms_median": 1000 * common.median(pulls),
            "push_ms_median": 1000 * common.median(pushes), "bytes_per_message": 2 * 4 * numel}


def apply_cost(numel: int, repeats: int = 10) -> dict:
    """Milliseconds of one ParameterServer.push at ``numel`` parameters, one thread (a shard's)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for rule in ("asgd", "dcasgd-a", "agn"):
            server = sg.ParameterServer(sg.make_algorithm(rule), torch.zeros(numel), 2)
            msg = torch.full((numel,), 1e-3)
            times = []
            for _ in range(repeats):
                server.pull(0)
                t = time.perf_counter()
                server.push(0, msg, 0.1)
                times.append(time.perf_counter() - t)
            out[rule] = 1000 * common.median(times)
    finally:
        torch.set_num_threads(threads)
    return out


def round_trip_ms(arg=0, repeats: int = 300) -> float:
    """A bare actor round trip: ``ray.get(actor.ping.remote(arg))``, median milliseconds (``arg``: 0, or
    an array of a message's size, which travels through the object store and back)."""
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self, x=None):
            return x
    echo = Echo.remote()
    ray.get(echo.ping.remote())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ray.get(echo.ping.remote(arg))
        times.append(time.perf_counter() - t)
    ray.kill(echo)
    return 1000 * common.median(times)


# ---- the profile of a Ray update (--small) ---------------------------------------------------------
class Profile:
    """Exclusive wall time per nested label ("push/ray.get"): a label's time less its children's."""

    def __init__(self):
        self.stack: list[str] = []
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.mark = time.perf_counter()

    def _charge(self, now: float) -> None:
        if self.stack:
            path = "/".join(self.stack)
            self.seconds[path] = self.seconds.get(path, 0.0) + now - self.mark
        self.mark = now

    def enter(self, label: str) -> None:
        self._charge(time.perf_counter())
        self.stack.append(label)
        path = "/".join(self.stack)
        self.calls[path] = self.calls.get(path, 0) + 1

    def leave(self) -> None:
        self._charge(time.perf_counter())
        self.stack.pop()

    def wrap(self, label: str, fn):
        def timed(*args, **kwargs):
            self.enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()
        return timed


class TimedRay:
    """The ``ray`` module as the driver sees it, with ``wait`` and ``get`` timed (a single ref: a
    worker's meta or a shard's answer; a list: message slices, shard states)."""

    def __init__(self, ray, profile: Profile):
        self._ray, self._profile, self.waited = ray, profile, 0.0

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def wait(self, *args, **kwargs):
        out = self._profile.wrap("ray.wait", self._ray.wait)(*args, **kwargs)
        self.waited = time.perf_counter()
        return out

    def get(self, refs, *args, **kwargs):
        label = "ray.get[list]" if isinstance(refs, list) else "ray.get"
        return self._profile.wrap(label, self._ray.get)(refs, *args, **kwargs)


def cpu_seconds(root: int) -> dict:
    """CPU seconds (user + system) so far of ``root`` and every process below it (a local Ray: its GCS,
    raylet and workers), by command name, from /proc (Linux; empty elsewhere)."""
    procs, tick, out = common.processes(), os.sysconf("SC_CLK_TCK"), {}
    for pid in common.descendants(root, procs) & procs.keys():
        name, _, ticks = procs[pid]
        name = "driver" if pid == root else name
        out[name] = out.get(name, 0.0) + ticks / tick
    return out


def profiled_runtime(profile: bool = True, fuse: bool = True, **options):
    """A ``RayRuntime`` whose driver times its loop (``Profile``) and whose actors time their methods;
    after the run, ``runtime.profile`` holds the driver's figures and the actors' timestamps.
    ``profile=False``: no timing; ``fuse=False``: no pull travels with a push (the driver before issue 19)."""
    from stalegrad.runtimes.ray import RayRuntime
    from stalegrad.runtimes.ray.actors import ShardActor, WorkerActor
    from stalegrad.runtimes.ray.driver import Driver

    class TimedWorker(WorkerActor):
        """Per step: (entry, slices loaded, message started, message built), perf_counter (one clock
        for every process of a machine). A step loads the pulled slices, computes (``Worker.compute``, timed
        at both ends) and builds its message, which it returns."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.times, self.now = [], []
            compute = self.worker.compute

            def timed_compute(*a, **k):
                self.now.append(time.perf_counter())      # the slices are loaded
                out = compute(*a, **k)
                self.now.append(time.perf_counter())      # the message is started
                return out
            self.worker.compute = timed_compute

        def step(self, lr, *slices):
            self.now = [time.perf_counter()]
            out = super().step(lr, *slices)
            self.times.append((*self.now, time.perf_counter()))
            return out

        def profile(self):
            return self.times

    class TimedShard(ShardActor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.times = []

        def _timed(self, name, fn, *args):
            t = time.perf_counter()
            out = fn(*args)
            self.times.append((name, t, time.perf_counter()))
            return out

        def pull(self, *args):
            return self._timed("pull", super().pull, *args)

        def prepare_commit(self, *args):
            return self._timed("prepare_commit", super().prepare_commit, *args)

        def state(self, *args):
            return self._timed("state", super().state, *args)

        def prepare_commit_pull(self, *args):
            return self._timed("prepare_commit_pull", super().prepare_commit_pull, *args)

        def profile(self):
            return self.times

    class ProfilingDriver(Driver):
        shard_actor, worker_actor = TimedShard, TimedWorker

        def __init__(self, runtime, training, resume):
            super().__init__(runtime, training, resume)
            self.prof = Profile()
            self.ray = TimedRay(self.ray, self.prof)
            self.launched, self.ready, self.pushed = [], [], []
            for name, label in (("next_message", "receive"), ("push", "push"), ("sync", "sync"),
                                ("launch", "launch")):
                setattr(self, name, self.prof.wrap(label, getattr(self, name)))
            training.after_push = self.prof.wrap("account", training.after_push)

        def start(self):
            super().start()
            push = self.prof.wrap("shards", self.sharded.push)

            def timed_push(*args, **kwargs):
                t = time.perf_counter()
                out = push(*args, **kwargs)
                self.pushed.append((t, time.perf_counter()))
                return out
            self.sharded.push = timed_push

        def launch(self, m):   # (wrapped by __init__ as "launch")
            t = time.perf_counter()
            super().launch(m)
            self.launched.append((m, t))

        def next_message(self, launch=True):
            out = super().next_message(launch)
            self.ready.append((out[0], self.ray.waited))
            return out

        def run(self):
            self.cpu0 = cpu_seconds(os.getpid())
            self.prof.enter("loop")
            try:
                super().run()
            finally:
                if self.prof.stack:
                    self.prof.leave()

        def finish(self):
            self.prof.leave()   # the loop ends here: the final sync and the notes are not per update
            cpu = cpu_seconds(os.getpid())
            self.rt.profile = {
                "cpu_s": {k: v - self.cpu0.get(k, 0.0) for k, v in cpu.items()}, "loop_s": self.prof.seconds.get(
                    "loop", 0.0) + sum(v for k, v in self.prof.seconds.items() if k.startswith("loop/")),
                "seconds": self.prof.seconds, "calls": self.prof.calls, "updates": len(self.pushed),
                "launched": self.launched, "ready": self.ready, "pushed": self.pushed,
                "workers": {m: self.ray.get(a.profile.remote()) for m, a in self.actors.items()},
                "shards": self.ray.get([s.profile.remote() for s in self.shards])}
            super().finish()

    class Unfused(Driver):
        def relaunch_follows(self, m, samples):
            return False

    class UnfusedProfilingDriver(ProfilingDriver):
        def relaunch_follows(self, m, samples):
            return False

    class ProfiledRuntime(RayRuntime):
        def make_driver(self, training, resume):
            cls = {(True, True): ProfilingDriver, (True, False): UnfusedProfilingDriver,
                   (False, True): Driver, (False, False): Unfused}[profile, fuse]
            return cls(self, training, resume)

    return ProfiledRuntime(**options)


def _ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"median": None, "mean": None, "n": 0}
    return {"median": 1000 * xs[len(xs) // 2], "mean": 1000 * sum(xs) / len(xs), "n": len(xs)}


def breakdown(p: dict) -> dict:
    """The driver's loop per update (exclusive ms by label), and a step's path from the driver's submit
    to its result seen by the driver (matched k-th launch of worker m to its k-th step and result)."""
    n = p["updates"]
    driver = {path[len("loop/"):] or "loop": 1000 * s / n   # (start-up and the end are not per update)
              for path, s in sorted(p["seconds"].items(), key=lambda kv: -kv[1])
              if path == "loop" or path.startswith("loop/")}
    per_worker_launch: dict = {}
    for m, t in p["launched"]:
        per_worker_launch.setdefault(m, []).append(t)
    per_worker_ready: dict = {}
    for m, t in p["ready"]:
        per_worker_ready.setdefault(m, []).append(t)
    parts = {"submit -> step entry (dependencies, scheduling, arguments)": [], "load the pulled slices": [],
             "compute (gradient)": [], "build the message": [],
             "step exit -> driver's ray.wait returns it": []}
    names = list(parts)
    for m, steps in p["workers"].items():
        for launch, step, ready in zip(per_worker_launch.get(m, []), steps, per_worker_ready.get(m, [])):
            entry, loaded, started, built = step
            for name, d in zip(names, (entry - launch, loaded - entry, started - loaded, built - started,
                                       ready - built)):
                parts[name].append(d)
    shard: dict = {}
    for times in p["shards"]:
        for name, a, b in times:
            shard.setdefault(name, []).append(b - a)
    push_rt = [b - a for a, b in p["pushed"]]
    cpu = {k: 1000 * v / n for k, v in sorted(p["cpu_s"].items(), key=lambda kv: -kv[1]) if v > 0}
    return {"updates": n, "driver_ms_per_update": driver, "cpu_ms_per_update": cpu,
            "wall_ms_per_update": 1000 * p["loop_s"] / n,
            "step_path_ms": {k: _ms(v) for k, v in parts.items()},
            "shard_method_ms": {k: _ms(v) for k, v in shard.items()},
            "push_round_trip_ms": _ms(push_rt)}


def small(epochs: float) -> dict:
    """digits, the mlp, dcasgd-a, M = 2, batch 128: local against Ray, before and after issue 19, with
    bare actor round trips and a profile of each Ray variant, all in one run (two Ray instances: Ray's
    defaults, then the configuration that ``RayRuntime`` gives the local instance it starts)."""
    import ray
    train, test = sg.load_pair("digits")

    def one(runtime):
        res = sg.train("mlp", train, test, "dcasgd-a", 2, runtime, epochs=epochs, batch_size=128,
                       eval_every=epochs / 5, seed=0)
        rate = steady_rate(res.metrics)
        return {"samples_per_s": rate, "ms_per_update": 1000 * 128 / rate, "wall_s": res.summary["wall_s"],
                "final_test_acc": res.summary["final_test_acc"], "weights_sha256": res.summary["weights_sha256"],
                "transport": res.summary.get("transport")}

    def on_ray(config: dict | None, fuse: bool) -> dict:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 **({"_system_config": config} if config else {}))
        try:
            out = one(profiled_runtime(profile=False, fuse=fuse, ps_shards=1, cpus_per_worker=1))
            out["actor_round_trip_ms"] = round_trip_ms()
            numel = out["transport"]["weight_bytes_per_message"] // 8
            out["actor_round_trip_with_weights_ms"] = round_trip_ms(np.zeros(numel, np.float32))
            runtime = profiled_runtime(fuse=fuse, ps_shards=1, cpus_per_worker=1)   # after: its cost stays out
            out["profiled"] = one(runtime)
            out["profile"] = breakdown(runtime.profile)
        finally:
            ray.shutdown()
        return out

    before = on_ray(None, fuse=False)
    local = one(sg.LocalRuntime(threads_per_worker=1))
    after = on_ray(LOCAL_SYSTEM_CONFIG, fuse=True)
    for r in (before, after):
        r["ratio"] = r["samples_per_s"] / local["samples_per_s"]
        r["overhead_ms_per_update"] = r["ms_per_update"] - local["ms_per_update"]
        r["overhead_in_round_trips"] = r["overhead_ms_per_update"] / r["actor_round_trip_ms"]
    return {"local": local, "ray_before": before, "ray": after}


def print_profile(label: str, r: dict) -> None:
    p = r["profile"]
    print(f"\nprofile, Ray {label} (a separate, timed run: {r['profiled']['ms_per_update']:.1f} ms per update in "
          f"steady state, {p['updates']} updates): the driver's loop, exclusive ms per update")
    total = sum(p["driver_ms_per_update"].values())
    rows = [[path, f"{ms:.3f}", f"{ms / total:.0%}"] for path, ms in p["driver_ms_per_update"].items()]
    rows.append(["total", f"{total:.3f}", ""])
    print(common.table(["driver: where", "ms / update", "share"], rows))
    print("\na worker's step, from the driver's submit to its result (ms)")
    rows = [[k, f"{v['median']:.3f}", f"{v['mean']:.3f}"] for k, v in p["step_path_ms"].items() if v["n"]]
    rows += [[f"shard: inside {k}", f"{v['median']:.3f}", f"{v['mean']:.3f}"] for k, v in p["shard_method_ms"].items()]
    rows.append(["driver: shard push round trip", f"{p['push_round_trip_ms']['median']:.3f}",
                 f"{p['push_round_trip_ms']['mean']:.3f}"])
    print(common.table(["step path", "median", "mean"], rows))
    cpu = p["cpu_ms_per_update"]
    print(f"\nCPU ms per update, by process (the loop: {p['wall_ms_per_update']:.2f} ms of wall time per update, "
          f"{len(os.sched_getaffinity(0))} cores): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
          + f"; all {sum(cpu.values()):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--windows", default="10,40")
    ap.add_argument("--small", type=float, default=None, metavar="EPOCHS",
                    help="only the small model: digits mlp dcasgd-a M=2 for EPOCHS epochs, local vs Ray")
    ap.add_argument("--out", default=str(common.RESULTS))
    args = ap.parse_args()
    import ray
    if args.small is not None:
        load_before = common.load()
        r = small(args.small)
        payload = {"command": common.command(python=".venv/bin/python"),
                   "machine": common.machine(), "load_before": load_before, "load_after": common.load(), "small": r}
        path = common.write_json("ray_small", payload, Path(args.out))
        print(f"digits mlp dcasgd-a M=2, {args.small:g} epochs, samples/s in steady state (ms per update = 128 / rate)")
        rows = [["local", f"{r['local']['samples_per_s']:.0f}", f"{r['local']['ms_per_update']:.2f}", "", "", "", ""]]
        for label, v in (("ray before (Ray's defaults, pull after push)", r["ray_before"]),
                         ("ray after (inline objects, pull with push)", r["ray"])):
            t = v["transport"]
            rows.append([label, f"{v['samples_per_s']:.0f}", f"{v['ms_per_update']:.2f}", f"{v['ratio']:.2f}",
                         f"{v['overhead_ms_per_update']:.2f} ms = {v['overhead_in_round_trips']:.1f} round trips",
                         f"{v['actor_round_trip_ms']:.2f} / {v['actor_round_trip_with_weights_ms']:.2f}",
                         f"{t['push_ms_median']:.2f}"])
        print(common.table(["runtime", "samples/s", "ms/update", "ray / local", "overhead per update",
                            "bare round trip ms (small / weights-sized arg)", "push ms median"], rows))
        for label, v in (("before", r["ray_before"]), ("after", r["ray"])):
            print_profile(label, v)
        print(f"\nload average {load_before} -> {payload['load_after']} -> {path}")
        return
    train, test, name = common.image_data(60_000, 10_000)
    load_before = common.load()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _system_config=LOCAL_SYSTEM_CONFIG)
    rows, results = [], []
    try:
        for window in [int(w) for w in args.windows.split(",")]:
            local = run(sg.LocalRuntime(threads_per_worker=1), window, args.epochs, train, test)
            on_ray = run(sg.RayRuntime(ps_shards=1, cpus_per_worker=1), window, args.epochs, train, test)
            ratio = on_ray["samples_per_s"] / local["samples_per_s"]
            results.append({"window": window, "local": local, "ray": on_ray, "ratio": ratio})
            rows.append([f"agn-mlp, window {window}, M 2", f"{local['samples_per_s']:.0f}",
                         f"{on_ray['samples_per_s']:.0f}", f"{ratio:.2f} {common.verdict(ratio >= 0.8)}",
                         f"{on_ray['transport']['push_ms_median']:.1f}"])
        cost = transport_cost(4_798_010)
        cost["apply_ms_median"] = apply_cost(4_798_010)
    finally:
        ray.shutdown()
    payload = {"command": common.command(python=".venv/bin/python"),
               "data": name, "machine": common.machine(), "load_before": load_before, "load_after": common.load(),
               "runs": results, "transport_4_8M": cost}
    path = common.write_json("ray", payload, Path(args.out))
    print(common.table(["configuration", "local samples/s", "ray samples/s", "ray / local (>=0.8)",
                        "ray push ms (median)"], rows))
    print(f"\none update through Ray at {cost['parameters']:,} parameters: pull {cost['pull_ms_median']:.1f} ms, "
          f"push {cost['push_ms_median']:.1f} ms, {cost['bytes_per_message'] / 2**20:.1f} MiB of weights moved; "
          "server apply (1 thread): " + ", ".join(f"{k} {v:.1f} ms" for k, v in cost["apply_ms_median"].items()))
    print(f"data {name}; load average {load_before} -> {payload['load_after']} -> {path}")


if __name__ == "__main__":
    main()

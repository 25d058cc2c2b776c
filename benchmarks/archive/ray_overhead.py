"""What an update costs on Ray beyond the local runtime, against the transport's floor, in one run.

    .venv/bin/python benchmarks/archive/ray_overhead.py                  # 4 min 0 s on the 2-core machine at load 3-8
    .venv/bin/python benchmarks/archive/ray_overhead.py --quick          # 1 min 46 s there (CPU figures rough)
    .venv/bin/python benchmarks/archive/ray_overhead.py --json out.json  # also write every figure
    .venv/bin/python benchmarks/archive/ray_overhead.py --table out.json # print a saved result's tables again
    .venv/bin/python benchmarks/archive/ray_overhead.py --inline-compare # also: the direct path on Ray's default inline limit
    .venv/bin/python benchmarks/archive/ray_overhead.py --profile        # also: where an update's time goes, each Ray path

On one local Ray instance (``ray.init(num_cpus=...)``, with the system configuration that
``RayRuntime`` gives the instance it starts itself), it measures:

- **a bare actor round trip**: ``ray.get(actor.ping.remote(0))`` from the driver, and from one actor to
  another (what a worker's call to the server shard costs at least); also the actor-to-actor call
  with a message-sized array as argument and result (a push that returns the next weights);
- **the small model**: digits, the mlp, dcasgd-a, M = 4 workers of one thread, batch 128, one shard:
  ``--runtime local`` against ``--runtime ray`` (the direct path: workers push to and pull from the
  shard, through its socket as on one machine by default, and as Ray calls, ``--no-same-node-socket``,
  as between machines) and against Ray's driver path (the driver between every push and pull: the only path before
  issue 33, still used with several shards, elastic and synchronous rules), in interleaved rounds;
  per update: ms (wall time / updates in steady state), the overhead (Ray's ms - local's ms, in ms and
  in bare round trips) and the CPU ms of every process of the run (this one and its children);
- **the large model**: agn-mlp on Fashion-MNIST, AGN with window 10, M = 4, batch 128, local against
  Ray (direct path: Ray calls, its 19 MB being above the socket's limit), in as many interleaved rounds;
- **the transport alone, by size**: an actor -> actor call carrying 0.2 to 19 MB both ways, as a Ray
  call and through the direct path's socket.

Throughput is measured in steady state: samples/s between the evaluations at 20% and 80% of the
budget, from the run's metrics. The goals of issue 33: overhead per update <= 3 bare round trips;
Ray / local >= 0.5 on the small model and >= 0.9 on agn-mlp. The load average before and after goes
with the figures: on a shared 2-core machine, read the ratios, not the absolute times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import echo_actors, md_table  # noqa: E402  (first: it imports stalegrad before torch)
import stalegrad as sg  # noqa: E402
from stalegrad.runtimes.ray import LOCAL_SYSTEM_CONFIG, RayRuntime  # noqa: E402
from stalegrad.runtimes.ray.driver import Driver  # noqa: E402

M = 4


class DriverPath(RayRuntime):
    """Ray with the driver between every push and pull (``driver.Driver``), whatever the run."""

    def make_driver(self, training, resume):
        return Driver(self, training, resume)


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(name, parent, CPU seconds) of a process, from /proc (Linux); None once it has ended."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return text[text.index("(") + 1:text.rindex(")")], int(rest[1]), \
        (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def tree(root: int) -> set[int]:
    """Process ``root`` and every process below it."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            parent[int(d.name)] = st[1]
    found, grown = {root}, True
    while grown:
        more = {p for p, pp in parent.items() if pp in found} - found
        found |= more
        grown = bool(more)
    return found


def tree_cpu_s(root: int, pids: set[int] | None = None) -> dict:
    """CPU seconds so far of ``pids`` (default: ``root`` and every process below it), by process:
    {pid: (name, seconds)}, the name "driver" for ``root`` (Ray's actors are "ray::<class>")."""
    out = {}
    for pid in tree(root) if pids is None else pids:
        st = _stat(pid)
        if st is not None:
            out[pid] = ("driver" if pid == root else st[0], st[2])
    return out


def cpu_between(before: dict, after: dict) -> dict:
    """CPU seconds by process name spent between two ``tree_cpu_s`` readings (a process that ended in
    between is not counted: the runs' processes live from start to end)."""
    spent: dict = {}
    for pid, (name, seconds) in after.items():
        spent[name] = spent.get(name, 0.0) + seconds - before.get(pid, (name, 0.0))[1]
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class CpuSampler(threading.Thread):
    """Reads ``tree_cpu_s`` of this process every ``every`` seconds while a run is on (the processes of the
    tree found again every quarter second; ``samples``: (perf_counter, reading)); ``at(t)``, the first reading at
    or after ``t``. (The local runtime completes its evaluations in another process and reports some of
    them late, so a reading taken when an evaluation is reported is not one taken when it was made.)
    /proc counts CPU in ticks of 10 ms a process: read over a few seconds, not less."""

    def __init__(self, every: float = 0.05):
        super().__init__(daemon=True)
        self.every, self.samples, self.stop = every, [], threading.Event()

    def run(self):
        root, found, since = os.getpid(), set(), -1.0
        while not self.stop.is_set():
            now = time.perf_counter()
            if now - since >= 0.25:   # (new processes: the local runtime's workers start after the run)
                found, since = tree(root), now
            self.samples.append((now, tree_cpu_s(root, found)))
            self.stop.wait(self.every)

    def at(self, t: float) -> dict:
        return next((reading for when, reading in self.samples if when >= t), self.samples[-1][1])


def train(model, data, algo, runtime, epochs: float, batch: int = 128, by_name: bool = False) -> dict:
    """One run; figures in steady state, between the first evaluation after epoch 0 and the last before the
    end (four evaluations a run, at 20%, 40%, 60% and 80% of its budget, so 60% of the run): samples/s
    and ms per update from the run's metrics (the updates and wall_s each evaluation records), CPU ms per
    update of every process of the run (this one and its children: Ray's, the local runtime's) over the
    same stretch of time (``CpuSampler``)."""
    (tr, te), start, sampler = data, [], CpuSampler()
    sampler.start()
    try:   # (on_start: the run's clock, which metrics' wall_s counts from, starts just before)
        res = sg.train(model, tr, te, algo, M, runtime, epochs=epochs, batch_size=batch, eval_every=epochs / 5,
                       seed=0, on_start=lambda config, metrics: start.append(time.perf_counter()))
    finally:
        sampler.stop.set()
        sampler.join()
    # the evaluations during the run (not the first, at epoch 0, nor the last, after the workers stopped)
    points = [(m["wall_s"], m["samples"], m["updates"]) for m in res.metrics
              if 0 < m["samples"] < res.summary["samples"]]
    (t0, s0, u0), (t1, s1, u1) = points[0], points[-1]
    cpu = cpu_between(sampler.at(start[0] + t0), sampler.at(start[0] + t1))
    if by_name:   # CPU ms per update by process
        return {"cpu_ms_per_update_by_process": {k: 1000 * v / (u1 - u0) for k, v in cpu.items()},
                "ms_per_update": 1000 * (t1 - t0) / (u1 - u0), "transport": res.summary.get("transport")}
    return {"samples_per_s": (s1 - s0) / (t1 - t0), "ms_per_update": 1000 * (t1 - t0) / (u1 - u0),
            "cpu_ms_per_update": 1000 * sum(cpu.values()) / (u1 - u0), "updates": res.summary["updates"],
            "wall_s": res.summary["wall_s"], "final_test_acc": res.summary["final_test_acc"],
            "transport": res.summary.get("transport")}


def profiled(path: str) -> RayRuntime:
    """Ray whose actors time their parts (``--profile``): a worker's compute, and the time inside each
    method of the shard; after the run, ``runtime.profile`` holds the medians (ms) and counts."""
    from stalegrad.runtimes.ray.actors import ShardActor, WorkerActor
    from stalegrad.runtimes.ray.direct import DirectDriver

    class TimedWorker(WorkerActor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.times, inner = {"worker: compute (the gradient)": []}, self.worker.compute

            def compute(pulled, lr):
                t = time.perf_counter()
                out = inner(pulled, lr)
                self.times["worker: compute (the gradient)"].append(time.perf_counter() - t)
                return out
            self.worker.compute = compute

        def profile(self):
            return self.times

    class TimedShard(ShardActor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.times = {}

        def _timed(self, name, method, *args, **kwargs):
            t = time.perf_counter()
            out = method(*args, **kwargs)
            self.times.setdefault(f"shard: inside {name}", []).append(time.perf_counter() - t)
            return out

        def push_direct(self, *a):
            return self._timed("push_direct", super().push_direct, *a)

        def poll(self, *a):
            return self._timed("poll", super().poll, *a)

        def prepare_commit_pull(self, *a):
            return self._timed("prepare_commit_pull", super().prepare_commit_pull, *a)

        def prepare_commit(self, *a):
            return self._timed("prepare_commit", super().prepare_commit, *a)

        def profile(self):
            return self.times

    base = DirectDriver if path == "direct" else Driver

    class Timed(base):
        shard_actor, worker_actor = TimedShard, TimedWorker

        def finish(self):
            import ray
            times: dict = {}
            for part in ray.get([a.profile.remote() for a in self.actors.values()] +
                                [s.profile.remote() for s in self.shards]):
                for k, v in part.items():
                    times.setdefault(k, []).extend(v)
            self.rt.profile = {k: {"median_ms": 1000 * statistics.median(v), "n": len(v)} for k, v in times.items()}
            super().finish()

    class Profiled(RayRuntime):
        def make_driver(self, training, resume):
            return Timed(self, training, resume)
    return Profiled()


def round_trips(ray, numel: int, repeats: int) -> dict:
    """Median ms of a bare round trip: driver -> actor, actor -> actor, actor -> actor with ``numel``
    float32 as argument and as result."""

    echo, caller = echo_actors(ray, numel)
    ray.get([echo.ping.remote(), caller.calls.remote(echo, 0, 3)])
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ray.get(echo.ping.remote(0))
        times.append(time.perf_counter() - t)
    out = {"driver_to_actor_ms": 1000 * statistics.median(times),
           "actor_to_actor_ms": ray.get(caller.calls.remote(echo, 0, repeats)),
           "message_bytes": 4 * numel}
    before = tree_cpu_s(os.getpid())   # the CPU of all processes for these calls (Ray's own included)
    out["actor_to_actor_with_message_ms"] = ray.get(caller.calls.remote(echo, np.zeros(numel, np.float32), repeats))
    out["actor_to_actor_with_message_cpu_ms"] = 1000 * sum(cpu_between(before, tree_cpu_s(os.getpid())).values()) \
        / repeats
    for actor in (echo, caller):
        ray.kill(actor)
    return out


def transport_by_size(ray, sizes: list[int], repeats: int) -> list[dict]:
    """Median ms of an actor -> actor call carrying ``numel`` float32 both ways, as a Ray call and through
    the direct path's socket (``channel.py``), for each size: where the socket stops paying."""
    echo, caller = echo_actors(ray)
    channel = ray.get(echo.listen.remote())
    out = []
    for numel in sizes:
        x = np.zeros(numel, np.float32)
        ray.get([caller.calls.remote(echo, x, 3), caller.socket_calls.remote(channel, x, 3)])   # (warm)
        out.append({"message_bytes": 4 * numel, "ray_call_ms": ray.get(caller.calls.remote(echo, x, repeats)),
                    "socket_ms": ray.get(caller.socket_calls.remote(channel, x, repeats))})
    for actor in (echo, caller):
        ray.kill(actor)
    return out


def ray_session(ray, config: dict) -> None:
    ray.init(address="local", num_cpus=max(M, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             _system_config=config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, shorter runs (under 2 minutes)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the small model (default 3)")
    ap.add_argument("--inline-compare", action="store_true",
                    help="also run the direct path on a Ray instance with Ray's default inline limit (100 KiB)")
    ap.add_argument("--profile", action="store_true",
                    help="also a timed run of each Ray path on the small model, and of the direct path on agn-mlp: "
                         "CPU by process, the parts of an update")
    ap.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    ap.add_argument("--table", metavar="PATH", help="print the tables of a result that --json saved, and stop")
    args = ap.parse_args()
    if args.table:
        try:
            saved = json.loads(Path(args.table).read_text())
            report(saved)
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"ray_overhead.py: error: --table {args.table}: not a result of --json ({type(e).__name__}: {e})")
        return
    import ray
    rounds = args.rounds or (1 if args.quick else 3)
    # (seconds in steady state: at 0.7 ms an update, 100 epochs of digits were half a second of it)
    small_epochs, agn_epochs = (40.0, 0.25) if args.quick else (400.0, 0.5)
    digits = sg.load_pair("digits")
    tr, te = sg.load_pair("fashion-mnist")
    # 2,000 test images: an evaluation costs both runtimes the same, and less
    fashion = (tr, sg.Dataset(te.name, te.x[:2000], te.y[:2000], te.num_classes))
    out = {"command": " ".join([".venv/bin/python", "benchmarks/archive/ray_overhead.py", *sys.argv[1:]]),
           "machine": {"nproc": os.cpu_count(), "cpu": platform.processor() or _cpu_model(), "ray": ray.__version__,
                       "python": platform.python_version()},
           "time": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": load()}
    ray_session(ray, dict(LOCAL_SYSTEM_CONFIG))
    try:
        out["round_trip"] = round_trips(ray, 50_826, 200 if args.quick else 400)
        # the digits mlp's message, 1 MiB (channel.MAX_BYTES), 4 MiB, agn-mlp's
        out["transport_by_size"] = transport_by_size(ray, [50_826, 262_144, 1_048_576, 4_798_010],
                                                     20 if args.quick else 50)
        small = {"local": [], "ray": [], "ray_calls": [], "ray_driver_path": []}
        for _ in range(rounds):   # interleaved, so that a change of load hits every runtime alike
            small["local"].append(train("mlp", digits, "dcasgd-a", sg.LocalRuntime(threads_per_worker=1), small_epochs))
            small["ray"].append(train("mlp", digits, "dcasgd-a", RayRuntime(), small_epochs))
            small["ray_calls"].append(train("mlp", digits, "dcasgd-a", RayRuntime(same_node_socket=False), small_epochs))
            small["ray_driver_path"].append(train("mlp", digits, "dcasgd-a", DriverPath(), small_epochs))
        out["small"] = small
        agn, large = sg.make_algorithm("agn", window=10), {"local": [], "ray": []}
        for _ in range(rounds):   # (19 MB weights: Ray calls, above the socket's channel.MAX_BYTES)
            large["local"].append(train("agn-mlp", fashion, agn, sg.LocalRuntime(threads_per_worker=1), agn_epochs))
            large["ray"].append(train("agn-mlp", fashion, agn, RayRuntime(), agn_epochs))
        out["agn_mlp"] = large
        if args.profile:
            out["profile"] = {}
            for path in ("direct", "driver"):
                runtime = profiled(path)
                out["profile"][path] = train("mlp", digits, "dcasgd-a", runtime, small_epochs, by_name=True)
                out["profile"][path]["parts"] = runtime.profile
            runtime = profiled("direct")   # the large model: where its CPU goes beside the workers' steps
            out["profile"]["direct, agn-mlp"] = train("agn-mlp", fashion, agn, runtime, agn_epochs, by_name=True)
            out["profile"]["direct, agn-mlp"]["parts"] = runtime.profile
            out["profile"]["local, agn-mlp"] = train("agn-mlp", fashion, agn, sg.LocalRuntime(
                threads_per_worker=1), agn_epochs, by_name=True)
    finally:
        ray.shutdown()
    if args.inline_compare:   # Ray's default limit: a 203 KB message goes through the shared-memory store
        ray_session(ray, {})
        try:
            out["small_default_inline"] = [train("mlp", digits, "dcasgd-a", RayRuntime(), small_epochs)
                                           for _ in range(rounds)]
            out["round_trip_default_inline"] = round_trips(ray, 50_826, 200)
        finally:
            ray.shutdown()
    out["load_after"] = load()
    summarise(out)
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"-> {args.json}")


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarise(out: dict) -> None:
    rt = out["round_trip"]["driver_to_actor_ms"]
    small, s = out["small"], {}
    local = med(small["local"], "ms_per_update")
    for name in ("ray", "ray_calls", "ray_driver_path"):
        ms = med(small[name], "ms_per_update")
        ratios = [lo["ms_per_update"] / r["ms_per_update"]   # per round: the same minute's load
                  for lo, r in zip(small["local"], small[name])]
        s[name] = {"ms_per_update": ms, "ratio_vs_local": statistics.median(ratios), "overhead_ms": ms - local,
                   "overhead_in_round_trips": (ms - local) / rt, "cpu_ms_per_update": med(small[name], "cpu_ms_per_update")}
    s["local"] = {"ms_per_update": local, "cpu_ms_per_update": med(small["local"], "cpu_ms_per_update")}
    agn = out["agn_mlp"]
    s["agn_mlp_ratio_vs_local"] = statistics.median(r["samples_per_s"] / lo["samples_per_s"]
                                                    for lo, r in zip(agn["local"], agn["ray"]))
    out["summary"] = s


def report(out: dict) -> None:
    rt, s = out["round_trip"], out["summary"]
    print(f"bare round trip: driver -> actor {rt['driver_to_actor_ms']:.3f} ms, actor -> actor "
          f"{rt['actor_to_actor_ms']:.3f} ms, actor -> actor with a {rt['message_bytes'] / 1000:.0f} KB message "
          f"both ways {rt['actor_to_actor_with_message_ms']:.3f} ms ({rt['actor_to_actor_with_message_cpu_ms']:.2f} CPU ms, "
          "all processes)")
    if out.get("transport_by_size"):
        print("\nan actor -> actor call carrying the message both ways, median ms:\n")
        print(md_table(["message", "Ray call", "the shard's socket"],
                       [[f"{t['message_bytes'] / 1e6:.2f} MB", f"{t['ray_call_ms']:.2f}", f"{t['socket_ms']:.2f}"]
                        for t in out["transport_by_size"]]))
    print(f"\ndigits mlp dcasgd-a, M = {M}, batch 128, one shard (medians of {len(out['small']['local'])} "
          "interleaved rounds)")
    rows = [["local", f"{s['local']['ms_per_update']:.2f}", f"{s['local']['cpu_ms_per_update']:.2f}", "", "", ""]]
    for name, label in (("ray", "ray (direct path, the shard's socket)"),
                        ("ray_calls", "ray (direct path, Ray calls: --no-same-node-socket)"),
                        ("ray_driver_path", "ray (driver path)")):
        if name in s:   # (not in a result from before that runtime was measured)
            r = s[name]
            rows.append([label, f"{r['ms_per_update']:.2f}", f"{r['cpu_ms_per_update']:.2f}",
                         f"{r['ratio_vs_local']:.2f}", f"{r['overhead_ms']:.2f} ms", f"{r['overhead_in_round_trips']:.1f}"])
    print(md_table(["runtime", "ms per update", "CPU ms per update", "Ray / local", "overhead per update",
                    "in bare round trips"], rows))
    agn = {k: v if isinstance(v, list) else [v] for k, v in out["agn_mlp"].items()}   # (one round, before)
    print(f"\nagn-mlp agn window 10, M = {M} (medians of {len(agn['local'])} interleaved rounds): local "
          f"{med(agn['local'], 'samples_per_s'):.0f} samples/s, ray {med(agn['ray'], 'samples_per_s'):.0f} samples/s "
          f"({sum((r['transport'] or {}).get('socket_calls', 0) for r in agn['ray'])} calls through the socket): Ray / local "
          f"{s['agn_mlp_ratio_vs_local']:.2f} (by round "
          + ", ".join(f"{r['samples_per_s'] / lo['samples_per_s']:.2f}" for lo, r in zip(agn["local"], agn["ray"]))
          + ")")
    if "small_default_inline" in out:
        runs, rtd = out["small_default_inline"], out["round_trip_default_inline"]
        print(f"\nRay's default inline limit (100 KiB): direct path {med(runs, 'ms_per_update'):.2f} ms per update, "
              f"{med(runs, 'cpu_ms_per_update'):.2f} CPU ms; actor -> actor with the message "
              f"{rtd['actor_to_actor_with_message_ms']:.3f} ms")
    profiles = out.get("profile", {})
    if profiles:   # CPU ms per update by process, and its share of all, one column per profiled run
        labels = {"direct": "Ray, direct path", "driver": "Ray, driver path", "direct, agn-mlp": "Ray, direct path, "
                  "agn-mlp", "local, agn-mlp": "local runtime, agn-mlp"}
        names = list(dict.fromkeys(k for p in profiles.values() for k, v in p["cpu_ms_per_update_by_process"].items()
                                   if v > 0.005))
        rows = []
        for name in names + ["all"]:
            cells = [name]
            for p in profiles.values():
                cpu = p["cpu_ms_per_update_by_process"]
                v = sum(cpu.values()) if name == "all" else cpu.get(name, 0.0)
                share = "" if name == "all" else f" ({v / sum(cpu.values()):.0%})"
                cells.append(f"{v:.2f}{share}" if v > 0.005 else "")
            rows.append(cells)
        print("\nprofile: CPU ms per update by process (share of all)\n")
        print(md_table([""] + [f"{labels.get(path, path)} ({p['ms_per_update']:.2f} ms per update)"
                               for path, p in profiles.items()], rows))
    for path, p in profiles.items():
        if "parts" in p:
            print(f"\nprofile, {path}:")
            print("  median ms: " + ", ".join(f"{k} {v['median_ms']:.3f} (n {v['n']})" for k, v in p["parts"].items())
                  + f"; a push's round trip ({'as its worker sees it' if path.startswith('direct') else 'the driver waiting for the shard'}) "
                  f"{p['transport']['push_ms_median']:.3f}")
    print(f"\nload average {out['load_before']} -> {out['load_after']}; {out['machine']}")


if __name__ == "__main__":
    main()

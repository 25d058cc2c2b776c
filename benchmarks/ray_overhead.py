"""What an update costs on Ray beyond the local runtime, against the transport's floor, in one run.

    .venv/bin/python benchmarks/ray_overhead.py --quick   # make bench: one round, shorter runs (about 2 min)
    .venv/bin/python benchmarks/ray_overhead.py           # three rounds (4 min on the 2-core machine at load 3-8)

Where an update's time goes (by process and by part) and Ray's default inline limit are measured by the
archived version: benchmarks/archive/ray_overhead.py --profile --inline-compare.

On one local Ray instance (``ray.init(num_cpus=...)``, with the system configuration that
``RayRuntime`` gives the instance it starts itself), it measures:

- **a bare actor round trip**: ``ray.get(actor.ping.remote(0))`` from the driver, and from one actor to
  another (what a worker's call to the server shard costs at least); also the actor-to-actor call
  with a message-sized array as argument and result (a push that returns the next weights);
- **the small model**: digits, the mlp, dcasgd-a, M = 4 workers of one thread, batch 128, one shard:
  ``--runtime local`` against ``--runtime ray`` (the direct path: workers push to and pull from the
  shard, through its socket as on one machine by default, and as Ray calls, ``--no-same-node-socket``,
  as between machines) and against Ray's driver path (the driver between every push and pull: the path of
  several shards, elastic and synchronous rules), in interleaved rounds;
  per update: ms (wall time / updates in steady state), the overhead (Ray's ms - local's ms, in ms and
  in bare round trips) and the CPU ms of every process of the run (this one and its children);
- **the large model**: agn-mlp on Fashion-MNIST, AGN with window 10, M = 4, batch 128, local against
  Ray (direct path: Ray calls, its 19 MB being above the socket's limit), in as many interleaved rounds;
- **the transport alone, by size**: an actor -> actor call carrying 0.2 to 19 MB both ways, as a Ray
  call and through the direct path's socket.

Throughput is measured in steady state: samples/s between the evaluations at 20% and 80% of the
budget, from the run's metrics. The goals: overhead per update <= 3 bare round trips;
Ray / local >= 0.5 on the small model and >= 0.9 on agn-mlp. The load average before and after goes
with the figures: on a shared 2-core machine, read the ratios, not the absolute times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import common  # (first: it imports stalegrad before torch)
import numpy as np

import stalegrad as sg
from stalegrad.runtimes.ray import LOCAL_SYSTEM_CONFIG, RayRuntime
from stalegrad.runtimes.ray.driver import Driver

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


def train(model, data, algo, runtime, epochs: float, batch: int = 128) -> dict:
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
    return {"samples_per_s": (s1 - s0) / (t1 - t0), "ms_per_update": 1000 * (t1 - t0) / (u1 - u0),
            "cpu_ms_per_update": 1000 * sum(cpu.values()) / (u1 - u0), "updates": res.summary["updates"],
            "wall_s": res.summary["wall_s"], "final_test_acc": res.summary["final_test_acc"],
            "transport": res.summary.get("transport")}


def echo_actors(ray, numel: int = 50_826):
    """Two zero-CPU actors that time Ray's transport alone: ``Echo.ping(x)`` returns ``x`` and ``Echo.make()``
    a ``numel`` float32 array (a digits-mlp message by default); ``Caller.calls(other, arg, n)`` returns the
    median ms of ``n`` calls of ``other.ping(arg)`` from inside an actor (what a worker's push costs at least),
    ``Caller.socket_calls(Echo.listen(), arg, n)`` the same through the direct path's socket."""

    @ray.remote(num_cpus=0)
    class Echo:
        def make(self):
            return np.zeros(numel, np.float32)

        def ping(self, x=None):
            return x

        def listen(self):
            """The direct path's socket (``channel.py``), answering each call with its argument."""
            import threading
            from stalegrad.runtimes.ray.channel import ShardListener
            self.listener = ShardListener(lambda op, x: x, threading.Lock())
            return self.listener.channel

    @ray.remote(num_cpus=0)
    class Caller:
        def calls(self, other, arg, n):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                ray.get(other.ping.remote(arg))
                times.append(time.perf_counter() - t)
            return 1000 * statistics.median(times)

        def socket_calls(self, channel, arg, n):
            """The same through the socket of ``Echo.listen``."""
            from stalegrad.runtimes.ray.channel import connect
            conn, times = connect(channel), []
            for _ in range(n):
                t = time.perf_counter()
                conn.call("ping", arg)
                times.append(time.perf_counter() - t)
            conn.close()
            return 1000 * statistics.median(times)

    return Echo.remote(), Caller.remote()


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the size `make bench` runs: one round, shorter runs")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds of each model [3; --quick 1]")
    args = ap.parse_args(argv)
    import ray
    bench = common.Benchmark("ray_overhead", args.quick)
    rounds = args.rounds or (1 if args.quick else 3)
    # (seconds in steady state: at 0.7 ms an update, 100 epochs of digits were half a second of it)
    small_epochs, agn_epochs = (40.0, 0.25) if args.quick else (400.0, 0.5)
    digits = sg.load_pair("digits")
    tr, te = sg.load_pair("fashion-mnist")
    # 2,000 test images: an evaluation costs both runtimes the same, and less
    fashion = (tr, sg.Dataset(te.name, te.x[:2000], te.y[:2000], te.num_classes))
    out = {"rounds": rounds, "small_epochs": small_epochs, "agn_epochs": agn_epochs}
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
    finally:
        ray.shutdown()
    summarise(out)
    bench.finish(tables(out), out, notes=notes(out))
    return 0


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


def tables(out: dict) -> list[dict]:
    s, rounds = out["summary"], out["rounds"]
    rows = [["local", f"{s['local']['ms_per_update']:.2f}", f"{s['local']['cpu_ms_per_update']:.2f}", "", "", ""]]
    for name, label in (("ray", "ray (direct path, the shard's socket)"),
                        ("ray_calls", "ray (direct path, Ray calls: --no-same-node-socket)"),
                        ("ray_driver_path", "ray (driver path)")):
        r = s[name]
        rows.append([label, f"{r['ms_per_update']:.2f}", f"{r['cpu_ms_per_update']:.2f}", f"{r['ratio_vs_local']:.2f}",
                     f"{r['overhead_ms']:.2f} ms", f"{r['overhead_in_round_trips']:.1f}"])
    small = common.page_table(f"digits mlp, dcasgd-a, M = {M}, batch 128, one shard (medians of {rounds} interleaved "
                              "round(s))", ["runtime", "ms per update", "CPU ms per update", "Ray / local",
                                            "overhead per update", "in bare round trips"], rows)
    agn = out["agn_mlp"]
    large = common.page_table(
        f"agn-mlp, AGN window 10, M = {M} (Ray calls: 19 MB of weights; medians of {rounds} round(s))",
        ["runtime", "samples/s", "Ray / local, by round"],
        [["local", f"{med(agn['local'], 'samples_per_s'):,.0f}", ""],
         ["ray", f"{med(agn['ray'], 'samples_per_s'):,.0f}",
          ", ".join(f"{r['samples_per_s'] / lo['samples_per_s']:.2f}" for lo, r in zip(agn["local"], agn["ray"]))]])
    size = common.page_table("An actor -> actor call carrying the message both ways, median ms",
                             ["message", "Ray call", "the shard's socket"],
                             [[f"{t['message_bytes'] / 1e6:.2f} MB", f"{t['ray_call_ms']:.2f}", f"{t['socket_ms']:.2f}"]
                              for t in out["transport_by_size"]])
    return [small, large, size]


def notes(out: dict) -> list[str]:
    rt = out["round_trip"]
    return [f"A bare round trip: driver -> actor {rt['driver_to_actor_ms']:.3f} ms, actor -> actor "
            f"{rt['actor_to_actor_ms']:.3f} ms; with a {rt['message_bytes'] / 1000:.0f} KB message both ways "
            f"{rt['actor_to_actor_with_message_ms']:.3f} ms ({rt['actor_to_actor_with_message_cpu_ms']:.2f} CPU ms, "
            f"all processes). Ray / local on agn-mlp: {out['summary']['agn_mlp_ratio_vs_local']:.2f}."]


if __name__ == "__main__":
    sys.exit(main())

"""Throughput of ``--runtime ray`` against ``--runtime local`` on the same configuration, in one run.

    .venv/bin/python benchmarks/bench_ray.py                 # ~3 min on a quiet 2-core machine
    .venv/bin/python benchmarks/bench_ray.py --epochs 0.5    # a quicker look

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

Writes benchmarks/results/ray.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

import stalegrad as sg  # noqa: E402


def data():
    try:
        return sg.load_pair("fashion-mnist"), "fashion-mnist"
    except sg.UsageError:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(60000, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (60000,), generator=g)
        tx, ty = x[:10000].clone(), y[:10000].clone()
        ns = __import__("types").SimpleNamespace
        return (ns(x=x, y=y, num_classes=10), ns(x=tx, y=ty, num_classes=10)), "synthetic 1x28x28"


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


def round_trip_ms(repeats: int = 300) -> float:
    """A bare actor round trip: ``ray.get(actor.ping.remote())``, median milliseconds."""
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
        ray.get(echo.ping.remote(0))
        times.append(time.perf_counter() - t)
    ray.kill(echo)
    return 1000 * common.median(times)


def small(epochs: float) -> dict:
    """digits, the mlp, dcasgd-a, M = 2, batch 128: local against Ray, and where a Ray update's time goes."""
    train, test = sg.load_pair("digits")

    def one(runtime):
        res = sg.train("mlp", train, test, "dcasgd-a", 2, runtime, epochs=epochs, batch_size=128,
                       eval_every=epochs / 5, seed=0)
        rate = steady_rate(res.metrics)
        return {"samples_per_s": rate, "ms_per_update": 1000 * 128 / rate, "wall_s": res.summary["wall_s"],
                "final_test_acc": res.summary["final_test_acc"], "transport": res.summary.get("transport")}
    local = one(sg.LocalRuntime(threads_per_worker=1))
    on_ray = one(sg.RayRuntime(ps_shards=1, cpus_per_worker=1))
    rtt = round_trip_ms()
    return {"local": local, "ray": on_ray, "ratio": on_ray["samples_per_s"] / local["samples_per_s"],
            "actor_round_trip_ms": rtt, "overhead_ms_per_update": on_ray["ms_per_update"] - local["ms_per_update"]}


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
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        try:
            r = small(args.small)
        finally:
            ray.shutdown()
        payload = {"command": " ".join([".venv/bin/python", "benchmarks/bench_ray.py", *sys.argv[1:]]),
                   "machine": common.machine(), "load_before": load_before, "load_after": common.load(), "small": r}
        path = common.write_json("ray_small", payload, Path(args.out))
        print(f"digits mlp dcasgd-a M=2, {args.small:g} epochs: local {r['local']['samples_per_s']:.0f} samples/s "
              f"({r['local']['ms_per_update']:.1f} ms/update), ray {r['ray']['samples_per_s']:.0f} samples/s "
              f"({r['ray']['ms_per_update']:.1f} ms/update); ray / local {r['ratio']:.2f}; Ray's push (prepare + "
              f"commit) {r['ray']['transport']['push_ms_median']:.2f} ms median; a bare actor round trip "
              f"{r['actor_round_trip_ms']:.2f} ms; load average {load_before} -> {payload['load_after']} -> {path}")
        return
    (train, test), name = data()
    load_before = common.load()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
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
    payload = {"command": " ".join([".venv/bin/python", "benchmarks/bench_ray.py", *sys.argv[1:]]),
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

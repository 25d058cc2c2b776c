"""The cost of the simulator's probes (``--probe-every K``, issue 12) at K = 10 and K = 100.

One process, one torch thread, CPU time (``common.use_cpu_clock``): the same seeded run with
probes off, K = 100 and K = 10, interleaved over rounds (the median of the rounds is reported),
for a gradient rule (asgd: g_now, the exact Hessian diagonal, the fixed batch's gradient per
probe) and a commit rule (agn, window 10: the fixed batch's gradient per probe). Fashion-MNIST,
the mlp (235k parameters), M = 8, batch 128. Also checks that every run ends with the same weights.

    .venv/bin/python benchmarks/archive/probe_overhead.py            # ~3 minutes on 2 busy cores
"""
from __future__ import annotations

import argparse
import statistics

import common
import torch

import stalegrad as sg

EVERY = (0, 100, 10)
CASES = {"asgd": {"algorithm": "asgd", "epochs": 2.0},
         "agn (window 10)": {"algorithm": sg.AGN(window=10), "epochs": 2.0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dataset", default="fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(1)
    common.use_cpu_clock()
    train, test = sg.load_pair(args.dataset)
    before = common.machine()
    rows = []
    for name, case in CASES.items():
        times: dict[int, list[float]] = {k: [] for k in EVERY}
        probes, hashes = {}, set()
        for _ in range(args.rounds):
            for k in EVERY:
                t0 = common.clock()
                res = sg.train("mlp", train, test, case["algorithm"], workers=8, epochs=case["epochs"],
                               batch_size=128, seed=0, eval_every=10.0, probe_every=k)
                times[k].append(common.clock() - t0)
                probes[k] = len(res.probes or [])
                hashes.add(res.summary["weights_sha256"])
        base = statistics.median(times[0])
        updates = res.summary["updates"]
        for k in EVERY:
            t = statistics.median(times[k])
            rows.append({"case": name, "probe_every": k, "updates": updates, "probes": probes[k],
                         "cpu_s": round(t, 3), "ratio": round(t / base, 3),
                         "per_probe_s": round((t - base) / probes[k], 4) if probes[k] else None})
        assert len(hashes) == 1, f"{name}: probing changed the weights"
    after = common.machine()
    print(f"load average before {before['loadavg']}, after {after['loadavg']}; clock {before['clock']}, 1 thread")
    print(common.md_table(
        ["rule", "K", "updates", "probes", "CPU s", "against no probes", "CPU s per probe"],
        [[r["case"], r["probe_every"] or "off", r["updates"], r["probes"], f"{r['cpu_s']:.2f}", f"{r['ratio']:.2f}x",
          "–" if r["per_probe_s"] is None else f"{r['per_probe_s']:.4f}"] for r in rows]))
    common.write_json("probe_overhead", {"machine_before": before, "machine_after": after, "rows": rows})


if __name__ == "__main__":
    main()

"""The simulator against plain PyTorch: samples/s of ``stalegrad.train(..., Simulator())`` and of the same
training written directly with ``torch.optim``, on the same model, batch, threads and pre-loaded data.

    .venv/bin/python benchmarks/sim_vs_plain.py --quick --threads 1 --clock cpu   # make bench: mlp, agn-mlp
    .venv/bin/python benchmarks/sim_vs_plain.py           # also the cnn and agn on agn-mlp, five rounds, wall time

asgd with M = 1 is sequential SGD, so its ratio to the plain SGD loop is the simulator's own overhead; M = 8
and 40 add what a worker costs (a pulled copy of the weights each, read from memory at its turn). agn
(window 10, M = 8) is a commit rule: every worker takes Adam steps of its own, held against a plain Adam loop.
The plain loops gather their mini-batches with ``index_select`` from a random permutation, as the simulator's
workers do (``x[idx]`` is up to 4x slower for image tensors and would flatter the simulator). Only the
training is timed (the simulator's event loop; its evaluations and set-up are not). Memory: the peak RSS
growth during the event loop (sampled), against the weights the workers pulled (``M x params x 4`` bytes).
"""
from __future__ import annotations

import gc

import common
import torch

import stalegrad as sg
from stalegrad.models import build_model

BATCH = 128
TARGET = 0.9
# (model, rule, M): asgd is held against plain SGD (lr 0.05), agn against plain Adam (lr 0.001, its local optimizer)
ARMS = [(model, "asgd", m) for model in ("mlp", "agn-mlp", "cnn") for m in (1, 8, 40)] + \
       [("mlp", "agn", 8), ("agn-mlp", "agn", 8)]
# asgd's samples per timed run: long enough to swamp start-up; agn's: every worker's window, once (--quick) or twice
SAMPLES = {"mlp": 12_800, "agn-mlp": 10_240, "cnn": 6_400}
QUICK_SAMPLES = {"mlp": 5_120, "agn-mlp": 2_560}
QUICK_LEAVES_OUT = {("agn-mlp", "agn", 8)}   # a minute of agn-mlp's Adam steps: the full run has it
AGN_WINDOW = 10


def algorithm(rule: str):
    return sg.AGN(window=AGN_WINDOW) if rule == "agn" else sg.make_algorithm(rule)


def lr(rule: str) -> float:
    return 0.001 if rule == "agn" else 0.05


def plain_loop(model_name: str, rule: str, train, samples: int) -> float:
    """samples/s of the same training in plain PyTorch: SGD for asgd, Adam for agn."""
    torch.manual_seed(0)
    model = build_model(model_name, tuple(train.x.shape[1:]), 10)
    opt = (torch.optim.Adam if rule == "agn" else torch.optim.SGD)(model.parameters(), lr=lr(rule))
    return common.plain_samples_per_s(model, opt, train, samples // BATCH, BATCH)


def sim_run(model_name: str, rule: str, train, test, workers: int, samples: int) -> dict:
    """samples/s of the simulator's event loop, and what the run's state costs."""
    gc.collect()
    sim = common.TimedSimulator()
    with common.PeakRSS() as mem:
        res = sg.train(model_name, train, test, algorithm(rule), workers, sim, epochs=samples / len(train.y),
                       batch_size=BATCH, lr=lr(rule), eval_every=1e9, seed=0)
    n_params = res.weights.numel()
    return {"samples_per_s": res.summary["samples"] / sim.elapsed, "params": n_params,
            "rss_growth_mb": mem.growth_mb, "pulled_copies_mb": workers * n_params * 4 / 2**20}


def run(quick: bool = False) -> dict:
    budget = QUICK_SAMPLES if quick else SAMPLES
    arms = [a for a in ARMS if a[0] in budget and not (quick and a in QUICK_LEAVES_OUT)]
    train, test, source = common.image_data(60_000)
    rounds = 2 if quick else 5
    rows = []
    for model_name in budget:
        mine = [a for a in arms if a[0] == model_name]
        for rule in dict.fromkeys(r for _, r, _ in mine):   # warm-up: first calls, allocator
            plain_loop(model_name, rule, train, 4 * BATCH)
            sim_run(model_name, rule, train, test, 1, (AGN_WINDOW if rule == "agn" else 4) * BATCH)
        samples = {a: a[2] * AGN_WINDOW * BATCH * (1 if quick else 2) if a[1] == "agn" else budget[model_name]
                   for a in mine}
        plain = {a: [] for a in mine}
        sims = {a: [] for a in mine}
        info = {}
        for _ in range(rounds):   # interleaved: each arm's plain loop right before it
            for arm in mine:
                plain[arm].append(plain_loop(model_name, arm[1], train, samples[arm]))
                info[arm] = sim_run(model_name, arm[1], train, test, arm[2], samples[arm])
                sims[arm].append(info[arm]["samples_per_s"])
        for arm in mine:
            rows.append({"model": model_name, "rule": arm[1], "workers": arm[2], "params": info[arm]["params"],
                         "samples": samples[arm], "plain_samples_per_s": common.median(plain[arm]),
                         "sim_samples_per_s": common.median(sims[arm]),
                         "ratio": common.median([s / p for s, p in zip(sims[arm], plain[arm])]),
                         "rss_growth_mb": info[arm]["rss_growth_mb"],
                         "pulled_copies_mb": info[arm]["pulled_copies_mb"]})
    ok = all(r["ratio"] >= TARGET for r in rows if r["rule"] == "asgd" and r["workers"] in (1, 8))
    return {"rows": rows, "data": source, "batch": BATCH, "rounds": rounds,
            "targets": {"sim / plain >= 0.9, asgd at M = 1 and 8": ok}}


def table(rows: list[dict], rounds: int) -> dict:
    cols = ["model", "params", "rule", "M", "plain samples/s", "sim samples/s", "sim / plain (>= 0.9: asgd, M <= 8)",
            "RSS growth MB", "pulled copies MB"]
    body = []
    for r in rows:
        target = r["rule"] == "asgd" and r["workers"] in (1, 8)
        body.append([r["model"], f"{r['params']:,}", r["rule"] + (f" w={AGN_WINDOW}" if r["rule"] == "agn" else ""),
                     r["workers"], f"{r['plain_samples_per_s']:,.0f}", f"{r['sim_samples_per_s']:,.0f}",
                     f"{r['ratio']:.2f} " + (common.verdict(r["ratio"] >= TARGET) if target else "-"),
                     f"{r['rss_growth_mb']:.0f}", f"{r['pulled_copies_mb']:.0f}"])
    return common.page_table(f"The simulator's samples/s against a plain loop's (batch {BATCH}, medians of "
                             f"{rounds} interleaved rounds)", cols, body)


def main(argv=None) -> int:
    ap = common.options(__doc__)
    args = ap.parse_args(argv)
    common.settle(ap, args)
    bench = common.Benchmark("sim_vs_plain", args.quick)
    result = run(args.quick)
    targets = "; ".join(f"{k}: {common.verdict(v)}" for k, v in result["targets"].items())
    bench.finish([table(result["rows"], result["rounds"])], result,
                 notes=[f"data: {result['data']}; targets: {targets}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""2. Simulator overhead: samples/s of the simulator against a plain PyTorch loop.

``stalegrad.train(..., runtime=Simulator())`` with asgd on M = 1, 8, 40
workers, against sequential SGD written directly with torch.optim.SGD: the
same model, batch, threads and pre-loaded tensors, mini-batches gathered with
``index_select`` from a random permutation, as the simulator's workers do
(``x[idx]`` is up to 4x slower for image tensors, which would flatter the
simulator). Only the training loop is timed (the simulator's event loop;
evaluation happens outside it). asgd with M = 1 is sequential SGD, so the
M = 1 ratio is the simulator's pure overhead. Memory: the peak RSS growth
during the event loop (sampled), against what the simulator keeps per worker
for asgd (the weights each worker pulled).
"""
from __future__ import annotations

import gc

import common
import torch

import stalegrad as sg
from stalegrad.models import build_model

BATCH = 128
LR = 0.05
WORKERS = (1, 8, 40)
TARGET = 0.9
# samples per timed run: long enough to swamp start-up, short enough for a few minutes in all
SAMPLES = {"mlp": 12_800, "agn-mlp": 2_560, "cnn": 3_200}
QUICK_SAMPLES = {"mlp": 5_120, "agn-mlp": 1_280, "cnn": 1_280}


def plain_loop(model_name: str, train, samples: int) -> float:
    """samples/s of sequential SGD in plain PyTorch."""
    torch.manual_seed(0)
    model = build_model(model_name, tuple(train.x.shape[1:]), 10)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    return common.plain_samples_per_s(model, opt, train, samples // BATCH, BATCH)


def sim_run(model_name: str, train, test, workers: int, samples: int) -> dict:
    """samples/s of the simulator's event loop, and what the run's state costs."""
    gc.collect()
    sim = common.TimedSimulator()
    with common.PeakRSS() as mem:
        res = sg.train(model_name, train, test, "asgd", workers, sim, epochs=samples / len(train.y),
                       batch_size=BATCH, lr=LR, eval_every=1e9, seed=0)
    n_params = res.weights.numel()
    return {"samples_per_s": res.summary["samples"] / sim.elapsed, "params": n_params,
            "rss_growth_mb": mem.growth_mb,
            # what the simulator keeps per worker for asgd: the weights it pulled (fp32)
            "pulled_copies_mb": workers * n_params * 4 / 2**20}


def run(quick: bool = False) -> dict:
    budget = QUICK_SAMPLES if quick else SAMPLES
    train, test, source = common.image_data(max(budget.values()) * 2 if quick else 60_000)
    rounds = 1 if quick else 5
    rows = []
    for model_name, samples in budget.items():
        plain, sims = [], {m: [] for m in WORKERS}
        info = {}
        plain_loop(model_name, train, 4 * BATCH)              # warm-up: first calls, allocator
        sim_run(model_name, train, test, 1, 4 * BATCH)
        for _ in range(rounds):   # interleaved: plain, M=1, M=8, M=40, plain, ...
            plain.append(plain_loop(model_name, train, samples))
            for m in WORKERS:
                r = sim_run(model_name, train, test, m, samples)
                sims[m].append(r["samples_per_s"])
                info[m] = r
        for m in WORKERS:
            ratio = common.median([s / p for s, p in zip(sims[m], plain)])
            rows.append({"model": model_name, "workers": m, "params": info[m]["params"],
                         "plain_samples_per_s": common.median(plain),
                         "sim_samples_per_s": common.median(sims[m]), "ratio": ratio,
                         "rss_growth_mb": info[m]["rss_growth_mb"], "pulled_copies_mb": info[m]["pulled_copies_mb"],
                         "samples": samples})
    ok = all(r["ratio"] >= TARGET for r in rows if r["workers"] in (1, 8))
    return {"rows": rows, "data": source, "batch": BATCH,
            "targets": {"sim / plain >= 0.9 at M = 1 and 8": ok}, "table": table(rows)}


def table(rows: list[dict]) -> str:
    cols = ["model", "params", "M", "plain samples/s", "sim samples/s", "sim / plain (>=0.9 at M<=8)",
            "RSS growth MB", "pulled copies MB"]
    body = []
    for r in rows:
        mark = common.verdict(r["ratio"] >= TARGET) if r["workers"] in (1, 8) else "-"
        body.append([r["model"], f"{r['params']:,}", r["workers"], f"{r['plain_samples_per_s']:.0f}",
                     f"{r['sim_samples_per_s']:.0f}", f"{r['ratio']:.3f} {mark}", f"{r['rss_growth_mb']:.0f}",
                     f"{r['pulled_copies_mb']:.0f}"])
    return common.table(cols, body)


if __name__ == "__main__":
    ap = common.options(__doc__)
    args = ap.parse_args()
    common.settle(ap, args)
    common.show(run(args.quick))

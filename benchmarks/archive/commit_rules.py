"""5. Commit rules in the simulator: vectorised windows, the simulator at M = 40, memory against M.

agn (local Adam, the paper's default) with uniform delays (round robin), batch 128, Fashion-MNIST
(or MNIST-shaped synthetic data), one run, interleaved rounds:

- **vectorised**: ``Simulator(vectorised=True)`` (the windows of the waiting workers as one batched
  computation) against the one-by-one loop, M = 8 and 40, mlp and agn-mlp, window 10 and 40; with
  whether the (worker, tau) sequences agree and the largest weight difference.
- **against plain PyTorch**: the same one-by-one runs (and M = 1) against a plain loop with
  ``torch.optim.Adam`` (the same optimizer as AGN's local steps) and with ``torch.optim.SGD``, same
  model, batch and threads. Timed: the event loop after the set-up (``SteadySimulator``); the set-up
  (building M workers with their Adam moments, their first pulls) is reported apart, in seconds.
- **memory**: peak RSS growth of a run against M (each M in a fresh process), against what the
  simulator keeps per worker for agn: the pulled weights and Adam's two moments (3 vectors).
"""
from __future__ import annotations

import json
import subprocess
import sys

import common
import torch

import stalegrad as sg
from stalegrad.algorithms import make_algorithm
from stalegrad.core.worker import FlatModel
from stalegrad.data import load_pair
from stalegrad.models import build_model
from stalegrad.runtimes.events import EventLoop
from stalegrad.runtimes.vectorised import VectorisedLoop, window_group

BATCH = 128
LR = 1e-3
TARGET = 0.9
# local steps per timed run (messages = steps / window), per model: a few seconds each
STEPS = {"synthetic mlp": 3200, "mlp": 1600, "agn-mlp": 240}
QUICK_STEPS = {"synthetic mlp": 800, "mlp": 400, "agn-mlp": 80}
CONFIGS = [(model, M, window) for model in ("synthetic mlp", "mlp", "agn-mlp") for M in (8, 40) for window in (10, 40)]
PLAIN_CONFIGS = [("agn-mlp", 1, 10), ("agn-mlp", 1, 40)]
MEMORY_WORKERS = (1, 8, 40)


class SteadySimulator(sg.Simulator):
    """The simulator, timing its event loop after the set-up: ``elapsed`` excludes building the M
    workers (their optimizer state) and their first pulls, which ``setup`` times; a short run at
    large M is otherwise mostly set-up."""

    def run(self, *args, **kwargs):
        self.elapsed = 0.0
        originals = {cls: cls.__dict__["run"] for cls in (EventLoop, VectorisedLoop)}

        def timed(run):
            def wrapper(loop):
                t = common.clock()
                run(loop)
                self.elapsed += common.clock() - t
            return wrapper

        for cls, run in originals.items():
            cls.run = timed(run)
        t = common.clock()
        try:
            super().run(*args, **kwargs)
        finally:
            for cls, run in originals.items():
                cls.run = run
        self.setup = common.clock() - t - self.elapsed


def plain_loop(model_name: str, train, steps: int, optimizer: str) -> float:
    """samples/s of sequential training in plain PyTorch (Adam as AGN's local steps, or SGD)."""
    torch.manual_seed(0)
    model = build_model(model_name, tuple(train.x.shape[1:]), 10)
    opt = (torch.optim.Adam(model.parameters(), lr=LR) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05))
    return common.plain_samples_per_s(model, opt, train, steps, BATCH)


def sim_run(model: str, data: dict, workers: int, window: int, steps: int, vectorised: bool):
    """(samples/s of the event loop, set-up seconds, result) of agn; ``model`` may say "synthetic mlp"."""
    kind, _, name = model.rpartition(" ")
    train, test = data[kind or "images"]
    messages = max(1, steps // window)
    sim = SteadySimulator(vectorised=vectorised)
    res = sg.train(name, train, test, make_algorithm("agn", window=window), workers, sim,
                   epochs=messages * window * BATCH / len(train.y), batch_size=BATCH, lr=LR, eval_every=1e9, seed=0,
                   partition="iid" if kind else "shard")   # iid: 40 workers' shards of 4,096 samples are < 128
    return res.summary["samples"] / sim.elapsed, sim.setup, res


MEMORY = """
import json, sys
sys.path.insert(0, {bench!r})
from common import PeakRSS, image_data  # stalegrad, then torch
import stalegrad as sg
import torch
from stalegrad.algorithms import make_algorithm
from stalegrad.runtimes import Simulator
torch.set_num_threads(1)
train, test, _ = image_data(20_000)
sg.train("agn-mlp", train, test, make_algorithm("agn", window=2), 1, Simulator(), epochs=256 / 20_000,
         batch_size=128, eval_every=1e9)   # warm-up: torch's first calls, allocator
with PeakRSS() as mem:   # every worker built (Adam moments) and pulled, then 2 messages of 2 steps
    res = sg.train("agn-mlp", train, test, make_algorithm("agn", window=2), {M}, Simulator(),
                   epochs=4 * 128 / 20_000, batch_size=128, eval_every=1e9)
print(json.dumps({{"growth_mb": mem.growth_mb, "params": res.weights.numel()}}))
"""


def memory(workers: int) -> dict:
    """Peak RSS growth of a short agn-mlp run with ``workers`` workers, in a fresh process."""
    code = MEMORY.format(bench=str(common.ROOT / "benchmarks"), M=workers)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(common.ROOT))
    return json.loads(out.stdout.strip().splitlines()[-1])


def falls_back(model: str, data: dict) -> bool:
    """Whether --vectorised runs this model's windows one by one (too large to stack on the CPU)."""
    kind, _, name = model.rpartition(" ")
    x = data[kind or "images"][0].x
    return window_group(FlatModel(build_model(name, tuple(x.shape[1:]), 10))) < 2


def memory_rows(quick: bool):
    """Peak RSS growth against M, MB per worker (fitted from the smallest and largest M), and 100 workers."""
    mem = [{"workers": M, **memory(M)} for M in (MEMORY_WORKERS[:2] if quick else MEMORY_WORKERS)]
    n = mem[0]["params"]
    for m in mem:
        m["state_mb"] = 3 * m["workers"] * n * 4 / 2**20   # pulled weights + Adam's m and v, per worker
    slope = (mem[-1]["growth_mb"] - mem[0]["growth_mb"]) / (mem[-1]["workers"] - mem[0]["workers"])
    return mem, slope, mem[0]["growth_mb"] + slope * (100 - mem[0]["workers"])


def run(quick: bool = False, rounds: int | None = None, parts: str = "all") -> dict:
    """parts: "all", "timing" (no memory) or "memory" (only memory)."""
    if parts == "memory":
        mem, slope, at_100 = memory_rows(quick)
        return {"memory": mem, "mb_per_worker": slope, "extrapolated_mb_at_100": at_100, "targets": {},
                "table": memory_table(mem, slope, at_100)}
    steps = QUICK_STEPS if quick else STEPS
    train, test, source = common.image_data(60_000)
    data = {"images": (train, test), "synthetic": load_pair("synthetic")}
    rounds = rounds or (1 if quick else 2)
    sim_run("mlp", data, 4, 2, 8, True)         # warm-up: torch.func's set-up, first calls
    sim_run("synthetic mlp", data, 4, 2, 8, True)
    sim_run("agn-mlp", data, 2, 2, 4, False)
    rows, plain = [], {}
    runs: dict[tuple, dict] = {}
    for _ in range(rounds):
        for optimizer in ("adam", "sgd"):
            plain.setdefault(optimizer, []).append(plain_loop("agn-mlp", train, steps["agn-mlp"], optimizer))
        for model, M, window in CONFIGS + PLAIN_CONFIGS:
            modes = (False, True) if M > 1 else (False,)
            for vectorised in modes:
                if vectorised and falls_back(model, data):
                    if (model, M, window, True) not in runs:   # once, one message: the note it writes
                        runs[(model, M, window, True)] = {"res": sim_run(model, data, M, window, window, True)[2]}
                    continue
                rate, setup, res = sim_run(model, data, M, window, steps[model], vectorised)
                r = runs.setdefault((model, M, window, vectorised), {"rate": [], "setup": [], "res": None})
                r["rate"].append(rate)
                r["setup"].append(setup)
                r["res"] = res
    for model, M, window in CONFIGS:
        one, vec = runs[(model, M, window, False)], runs[(model, M, window, True)]
        ran = "rate" in vec
        rows.append({"model": model, "params": one["res"].weights.numel(), "workers": M, "window": window,
                     "one_by_one_samples_per_s": common.median(one["rate"]),
                     "vectorised_samples_per_s": common.median(vec["rate"]) if ran else None,
                     "speedup": common.median([v / o for v, o in zip(vec["rate"], one["rate"])]) if ran else None,
                     "same_tau_sequence": ran and one["res"].update_log() == vec["res"].update_log(),
                     "notes": vec["res"].summary["notes"],
                     "max_weight_diff": (one["res"].weights - vec["res"].weights).abs().max().item() if ran else None})
    against_plain = []
    for (model, M, window, vectorised), r in sorted(runs.items()):
        if model == "agn-mlp" and "rate" in r:   # (not the vectorised runs that would run one by one)
            against_plain.append({
                "workers": M, "window": window, "vectorised": vectorised,
                "samples_per_s": common.median(r["rate"]), "setup_s": common.median(r["setup"]),
                "vs_plain_adam": common.median([a / p for a, p in zip(r["rate"], plain["adam"])]),
                "vs_plain_sgd": common.median([a / p for a, p in zip(r["rate"], plain["sgd"])])})
    mem, slope, at_100 = memory_rows(quick) if parts in ("all", "memory") else ([], 0.0, 0.0)
    ok = all(r["vs_plain_adam"] >= TARGET for r in against_plain if r["workers"] == 40)
    best40 = {w: max(r["vs_plain_adam"] for r in against_plain if r["workers"] == 40 and r["window"] == w)
              for w in {r["window"] for r in against_plain if r["workers"] == 40}}
    return {"rows": rows, "against_plain": against_plain, "memory": mem, "mb_per_worker": slope,
            "extrapolated_mb_at_100": at_100, "data": source, "batch": BATCH,
            "plain_samples_per_s": {k: common.median(v) for k, v in plain.items()},
            "targets": {"agn-mlp, M = 40, window >= 10: sim / plain Adam >= 0.9 (best mode)":
                        all(v >= TARGET for v in best40.values()),
                        "every mode": ok},
            "table": table(rows, against_plain, plain, mem, slope, at_100)}


def table(rows, against_plain, plain, mem, slope, at_100) -> str:
    a = common.table(
        ["model", "params", "M", "window", "one-by-one samples/s", "vectorised samples/s", "vectorised / one-by-one",
         "same tau sequence", "max |w diff|"],
        [[r["model"], f"{r['params']:,}", r["workers"], r["window"], f"{r['one_by_one_samples_per_s']:.0f}"]
         + ([f"{r['vectorised_samples_per_s']:.0f}", f"{r['speedup']:.2f}", "yes" if r["same_tau_sequence"] else "NO",
             f"{r['max_weight_diff']:.1e}"] if r["speedup"] is not None else ["runs one by one (note)", "-", "-", "-"])
         for r in rows])
    notes = sorted({n for r in rows for n in r["notes"]})
    b = common.table(
        ["agn-mlp: M", "window", "mode", "samples/s", "/ plain Adam (>= 0.9 at M = 40)", "/ plain SGD", "set-up s"],
        [[r["workers"], r["window"], "vectorised" if r["vectorised"] else "one-by-one", f"{r['samples_per_s']:.0f}",
          f"{r['vs_plain_adam']:.2f}", f"{r['vs_plain_sgd']:.2f}", f"{r['setup_s']:.2f}"] for r in against_plain])
    return (a + "".join(f"\nnote: {n}" for n in notes) + f"\n\nplain loops, agn-mlp: Adam {common.median(plain['adam']):.0f} samples/s, "
            f"SGD {common.median(plain['sgd']):.0f} samples/s\n\n" + b + ("\n\n" + memory_table(mem, slope, at_100) if mem else ""))


def memory_table(mem, slope, at_100) -> str:
    return (common.table(["agn-mlp: M", "peak RSS growth MB", "pulled + Adam m, v: MB"],
                         [[m["workers"], f"{m['growth_mb']:.0f}", f"{m['state_mb']:.0f}"] for m in mem])
            + f"\n{slope:.0f} MB per worker; 100 workers: about {at_100 / 1024:.1f} GB (extrapolated)")


if __name__ == "__main__":   # e.g. --threads 1 --clock cpu --rounds 1 --parts timing
    ap = common.options(__doc__)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--parts", choices=("all", "timing", "memory"), default="all")
    args = ap.parse_args()
    common.settle(ap, args)
    before = common.load()
    res = run(args.quick, args.rounds, args.parts)
    res.update(machine=common.machine(), loadavg_before=before, loadavg_after=common.load())
    common.write_json(f"commit_rules_{args.parts}" + ("_quick" if args.quick else ""), res)
    print(res["table"])
    print(res["targets"], "load average", before, "->", common.load())

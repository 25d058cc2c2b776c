"""A worker's mini-batch at the caller's weights in place against copied into the model (issue 33).

``FlatModel.loss_and_grad`` used to copy the weights it is given into the model's own vector before every
mini-batch: for AGN on agn-mlp, a 19 MB copy per local step, ten per commit. It now makes the model's
parameters views of that vector instead. This measures one AGN commit (window 10,
agn-mlp, batch 128, Fashion-MNIST or synthetic data of its shape) both ways in one process, the two
alternating round by round (ABBA), M workers in turn sharing one model as the simulator runs them:

    .venv/bin/python benchmarks/archive/flat_in_place.py [--workers 8 40] [--rounds 7] [--quick]

Prints ms per commit by round, the medians (the first round left out: first touch of the workers'
state) and in place / copied; writes benchmarks/archive/results/flat_in_place.json. The bits are the same both
ways (checked here on the first commit of every worker).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from common import load, machine, median, table, write_json  # noqa: E402

import stalegrad as sg  # noqa: E402
from stalegrad.algorithms import make_algorithm  # noqa: E402
from stalegrad.core.worker import BatchStream, FlatModel, Worker  # noqa: E402
from stalegrad.models import build_model  # noqa: E402


class CopyingWorker(Worker):
    """What every mini-batch did before: the weights copied into the model's own vector first."""

    def grad_fn(self, w):
        self.model.load(w)
        return super().grad_fn(self.model.flat)   # (already there: loss_and_grad copies nothing more)


def data():
    try:
        train, _ = sg.load_pair("fashion-mnist")
        return train.x, train.y, "fashion-mnist"
    except Exception:   # (no data set here: the same shapes, synthetic)
        g = torch.Generator().manual_seed(0)
        return torch.rand(60_000, 1, 28, 28, generator=g), torch.randint(0, 10, (60_000,), generator=g), "synthetic"


def measure(workers: int, rounds: int, x, y) -> dict:
    torch.manual_seed(0)
    model = FlatModel(build_model("agn-mlp", tuple(x.shape[1:]), 10))
    algo = make_algorithm("agn", window=10)
    w0 = model.flat.clone()
    pulled = [w0.clone() for _ in range(workers)]

    def team(kind):
        return [kind(m, algo, model, x, y, BatchStream(len(y), m, workers, 128), w0, workers) for m in range(workers)]

    # each way its own workers: the same batches and Adam states
    teams = {"in place": team(Worker), "copied": team(CopyingWorker)}
    times = {"in place": [], "copied": []}
    first = {}
    for r in range(rounds):
        for mode in ("in place", "copied") if r % 2 == 0 else ("copied", "in place"):
            t = time.perf_counter()
            for m, worker in enumerate(teams[mode]):
                _, delta = worker.compute(pulled[m], 0.001)
                if r == 0:
                    first.setdefault(mode, []).append(delta.clone())
            times[mode].append((time.perf_counter() - t) / workers)
    same = all(torch.equal(a, b) for a, b in zip(first["in place"], first["copied"]))
    med = {k: median(v[1:]) for k, v in times.items()}
    return {"workers": workers, "rounds": rounds, "ms_per_commit": {k: [t * 1e3 for t in v] for k, v in times.items()},
            "median_ms": {k: v * 1e3 for k, v in med.items()}, "ratio": med["in place"] / med["copied"],
            "same_bits": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 40], help="M values [8 40]")
    ap.add_argument("--rounds", type=int, default=7, help="rounds, each both ways [7]")
    ap.add_argument("--quick", action="store_true", help="M = 2, 3 rounds: checks the script, measures nothing")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.rounds = [2], 3
    x, y, source = data()
    before = load()
    results = [measure(M, args.rounds, x, y) for M in args.workers]
    rows = [[r["workers"], ", ".join(f"{t:.0f}" for t in r["ms_per_commit"]["in place"]),
             ", ".join(f"{t:.0f}" for t in r["ms_per_commit"]["copied"]), f"{r['median_ms']['in place']:.0f}",
             f"{r['median_ms']['copied']:.0f}", f"{r['ratio']:.3f}", "yes" if r["same_bits"] else "NO"]
            for r in results]
    print(table(["M", "in place, ms per commit by round", "copied, by round", "in place, median",
                 "copied, median", "in place / copied", "same bits"], rows))
    print(f"agn-mlp, AGN window 10, batch 128, {source}, {torch.get_num_threads()} threads; "
          f"load average before {before}, after {load()}")
    write_json("flat_in_place", {"machine": machine(), "args": vars(args), "data": source, "load_before": before,
                                 "load_after": load(), "threads": torch.get_num_threads(), "results": results})
    return 0 if all(r["same_bits"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

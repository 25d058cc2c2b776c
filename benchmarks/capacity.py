"""Capacity of one server shard: how many workers it can keep up with.

    .venv/bin/python benchmarks/capacity.py --quick --threads 1 --clock cpu   # make bench: logreg, mlp, agn-mlp
    .venv/bin/python benchmarks/capacity.py                                   # every model, more rounds

One shard applies every worker's update in turn, so it saturates when the updates
arrive faster than it applies them. Per model, in the same rounds: a worker's step
(``Worker.grad_fn``: gather a batch of 128, forward, backward, through the
``FlatModel``, as every runtime's workers do) and one ``ParameterServer.push`` of
each rule at that model's parameter count, on both kernel paths (NaN/Inf checks
included; the pull's copy is not counted). Then:

- updates/s of one shard = 1 / push time;
- workers one shard serves = window x step time / push time: a gradient rule pushes
  after every step (window 1); a commit rule (agn, dynsgd) after ``window`` steps,
  so the figure is given per step of window (multiply by the window).

These are CPU figures of this machine; on a GPU a worker's step is far shorter, and
the same ratio with its step time says how many GPU workers a CPU shard serves.
"""
from __future__ import annotations

import common
import torch

from stalegrad.algorithms import make_algorithm
from stalegrad.core.worker import BatchStream, FlatModel, Worker
from stalegrad.models import build_model

BATCH = 128
MODELS = ("logreg", "mlp", "cnn", "agn-mlp")
QUICK_MODELS = ("logreg", "mlp", "agn-mlp")
CAPACITY_RULES = ("asgd", "dcasgd-c", "dcasgd-a", "agn")


def run(quick: bool = False) -> dict:
    torch.manual_seed(0)
    train, _, source = common.image_data(4096, 10)
    paths = common.kernel_paths()
    rows = []
    for name in (QUICK_MODELS if quick else MODELS):
        model = FlatModel(build_model(name, (1, 28, 28), 10))
        w = model.flat.clone()
        n = w.numel()
        worker = Worker(0, make_algorithm("asgd"), model, train.x, train.y,
                        BatchStream(len(train.y), 0, 1, BATCH), w, 1)
        gen = torch.Generator().manual_seed(1)
        servers = {(rule, path): common.pushing_server(rule, {}, n, gen, path)
                   for path in paths for rule in CAPACITY_RULES}
        items = {"step": lambda: worker.grad_fn(w)}
        for key, (server, msg) in servers.items():
            items[key] = (lambda s=server, g=msg: s.push(1, g, common.PUSH_LR))
        for f in items.values():
            f()
        rounds, calls = (3, 2) if quick else (5, 3)
        times = common.interleaved(items, rounds, calls)
        step = common.median(times["step"])
        for (rule, path) in servers:
            push = common.median(times[(rule, path)])
            rows.append({"model": name, "params": n, "step_ms": step * 1e3, "rule": rule, "kernels": path,
                         "push_ms": push * 1e3, "updates_per_s": 1 / push,
                         "workers_per_shard": common.median_ratio(times["step"], times[(rule, path)]),
                         "per_window_step": rule in ("agn", "dynsgd")})
        servers.clear()
    return {"rows": rows, "data": source, "kernels": paths}


def table(rows: list[dict], paths: list[str]) -> dict:
    """One row per model and rule: the push on each kernel path; updates/s and workers on the default (the last)."""
    default = paths[-1]
    by_key = {(r["model"], r["rule"], r["kernels"]): r for r in rows}
    cols = ["model", "params", "worker step ms", "rule"] + [f"{p}: push ms" for p in paths] + \
           [f"{default}: updates/s per shard", f"{default}: workers per shard"]
    body = []
    for (model, rule, path), r in by_key.items():
        if path == default:
            body.append([model, f"{r['params']:,}", f"{r['step_ms']:.2f}", rule]
                        + [f"{by_key[(model, rule, p)]['push_ms']:.3f}" for p in paths]
                        + [f"{r['updates_per_s']:,.0f}",
                           f"{r['workers_per_shard']:.1f}" + (" x window" if r["per_window_step"] else "")])
    return common.page_table("One shard: updates/s, and the workers whose steps it keeps up with", cols, body)


def main(argv=None) -> int:
    ap = common.options(__doc__)
    args = ap.parse_args(argv)
    common.settle(ap, args)
    bench = common.Benchmark("capacity", args.quick)
    result = run(args.quick)
    bench.finish([table(result["rows"], result["kernels"])], result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""4. Compute efficiency: FLOP/s of one agn-mlp training step against float32 matmul peak.

One step = forward + backward of the AGN paper's 784-1000-2000-1000-10 MLP
on a batch of 128 through ``FlatModel.loss_and_grad`` (weights loaded from a
separate vector, as the simulator does). FLOPs counted analytically:
2*B*in*out per Linear forward, x3 for forward + backward (the first layer's
input gradient, which autograd skips, is counted too: the count is 5.5% above
the work actually done). The peak is the best of a large square float32
matmul, timed in the same rounds. Also: the same step through the worker
(mini-batch gathered from pre-loaded tensors), and where the step's time goes
(torch.profiler: matrix products, other operators, the rest).
"""
from __future__ import annotations

import time

import common
import torch

from stalegrad.algorithms import make_algorithm
from stalegrad.core.worker import BatchStream, FlatModel, Worker
from stalegrad.models import build_model

BATCH = 128
SIZES = (784, 1000, 2000, 1000, 10)
TARGET = 0.6
MATMUL_N = 2048


def step_flops(batch: int = BATCH) -> int:
    return 3 * sum(2 * batch * a * b for a, b in zip(SIZES[:-1], SIZES[1:]))


def breakdown(model: FlatModel, w, x, y, steps: int = 5) -> dict:
    """Self CPU time of matrix products, other operators, and the rest (Python, dispatch)."""
    from torch.profiler import ProfilerActivity, profile
    model.loss_and_grad(w, x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()    # wall time, as the profiler's operator times are
        for _ in range(steps):
            model.loss_and_grad(w, x, y)
        wall = (time.perf_counter() - t) / steps
    mm = other = 0.0
    per_op = {}
    for e in prof.key_averages():
        us = e.self_cpu_time_total / steps
        if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
            mm += us
        elif e.key.startswith("aten::"):
            other += us
            per_op[e.key] = us
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:6]
    return {"wall_ms": wall * 1e3, "matmul_ms": mm / 1e3, "other_ops_ms": other / 1e3,
            "rest_ms": wall * 1e3 - (mm + other) / 1e3, "top_other_ops_ms": {k: v / 1e3 for k, v in top}}


def run(quick: bool = False) -> dict:
    torch.manual_seed(0)
    train, _, source = common.image_data(4096, 10)
    model = FlatModel(build_model("agn-mlp", (1, 28, 28), 10))
    w = model.flat.clone()
    x, y = train.x[:BATCH].contiguous(), train.y[:BATCH].contiguous()
    worker = Worker(0, make_algorithm("asgd"), model, train.x, train.y, BatchStream(len(train.y), 0, 1, BATCH),
                    w, 1)
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    c = torch.empty(MATMUL_N, MATMUL_N)
    items = {
        "matmul": lambda: torch.mm(a, b, out=c),
        "flat_step": lambda: model.loss_and_grad(w, x, y),
        "worker_step": lambda: worker.grad_fn(w),
    }
    for f in items.values():
        f()
    rounds, calls = (3, 3) if quick else (7, 5)
    times = common.interleaved(items, rounds, calls)
    flops = step_flops()
    peak = [2 * MATMUL_N ** 3 / t for t in times["matmul"]]
    rows = []
    for name, label in (("flat_step", "FlatModel.loss_and_grad (batch in place)"),
                        ("worker_step", "Worker.grad_fn (gathers the batch)")):
        frac = common.median([flops / t / p for t, p in zip(times[name], peak)])
        rows.append({"what": label, "ms": common.median(times[name]) * 1e3,
                     "gflop_s": flops / common.median(times[name]) / 1e9, "fraction_of_peak": frac})
    detail = breakdown(model, w, x, y, 3 if quick else 8)
    return {"rows": rows, "peak_gflop_s": common.median(peak) / 1e9, "step_gflop": flops / 1e9,
            "matmul_n": MATMUL_N, "data": source, "breakdown": detail,
            "targets": {"agn-mlp step >= 0.6 of matmul peak": all(r["fraction_of_peak"] >= TARGET for r in rows)},
            "table": table(rows, common.median(peak) / 1e9, flops / 1e9, detail)}


def table(rows, peak, gflop, detail) -> str:
    cols = ["agn-mlp step, batch 128", "ms", "GFLOP/s", f"fraction of matmul peak {peak:.0f} GFLOP/s (>=0.6)"]
    body = [[r["what"], f"{r['ms']:.2f}", f"{r['gflop_s']:.1f}",
             f"{r['fraction_of_peak']:.2f} {common.verdict(r['fraction_of_peak'] >= TARGET)}"] for r in rows]
    text = common.table(cols, body)
    text += (f"\n{gflop:.2f} GFLOP per step. Profiled step {detail['wall_ms']:.1f} ms: matrix products "
             f"{detail['matmul_ms']:.1f} ms, other operators {detail['other_ops_ms']:.1f} ms, rest (Python, "
             f"dispatch) {detail['rest_ms']:.1f} ms; largest others: "
             + ", ".join(f"{k.removeprefix('aten::')} {v:.2f}" for k, v in detail["top_other_ops_ms"].items()))
    return text


if __name__ == "__main__":
    ap = common.options(__doc__)
    args = ap.parse_args()
    common.settle(ap, args)
    common.show(run(args.quick))

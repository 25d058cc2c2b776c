"""Vectorised simulation: samples/s with and without Simulator(vectorised=True).

    .venv/bin/python benchmarks/vectorised.py --quick   # make bench: logreg and mlp, one round
    .venv/bin/python benchmarks/vectorised.py           # also cnn and agn-mlp, three rounds

asgd on M = 16 round-robin workers (every 16 events, one batched call
computes 16 gradients), the same run both ways, timed interleaved, on two
kinds of data: the project's ``synthetic`` set (32 features: a step is mostly
per-operation overhead, which batching removes) and MNIST-shaped images (a
step is mostly matrix products, which batching does not make cheaper). Plus
whether the (worker, tau) sequences agree and the largest difference of the
final weights, and the one-off cost of the first batched call in a process
(torch.func's set-up), which the timed runs exclude.
"""
from __future__ import annotations

import common
import torch

import stalegrad as sg
from stalegrad.data import load_pair

BATCH = 128
WORKERS = 16
TARGET = 2.0
TARGET_MODELS = ("logreg", "mlp")
# (data, model): samples per timed run
RUNS = {("synthetic", "logreg"): 81_920, ("synthetic", "mlp"): 40_960,
        ("mnist-shaped", "logreg"): 30_720, ("mnist-shaped", "mlp"): 15_360,
        ("mnist-shaped", "cnn"): 1_024, ("mnist-shaped", "agn-mlp"): 2_048}
QUICK = {("synthetic", "logreg"): 16_384, ("synthetic", "mlp"): 8_192,
         ("mnist-shaped", "logreg"): 8_192, ("mnist-shaped", "mlp"): 4_096}


def one(model, train, test, samples: int, vectorised: bool, workers: int = WORKERS):
    sim = common.TimedSimulator(vectorised=vectorised)
    res = sg.train(model, train, test, "asgd", workers, sim, epochs=samples / len(train.y), batch_size=BATCH,
                   lr=0.05, eval_every=1e9, seed=0)
    return res.summary["samples"] / sim.elapsed, res


def gradient_only(model: str, train, rounds: int) -> float:
    """Speed-up of the gradient computation alone: one batched call for 16 workers against
    16 calls of FlatModel.loss_and_grad (same weights, same mini-batches)."""
    from stalegrad.models import build_model
    from stalegrad.runtimes.vectorised import BatchedGradient
    from stalegrad.core.worker import FlatModel

    torch.manual_seed(0)
    flat = FlatModel(build_model(model, tuple(train.x.shape[1:]), 10))
    batched = BatchedGradient(flat)
    gen = torch.Generator().manual_seed(0)
    W = flat.flat + 0.01 * torch.randn(WORKERS, flat.numel, generator=gen)
    idx = torch.randint(0, len(train.y), (WORKERS * BATCH,), generator=gen)
    x = train.x.index_select(0, idx).view(WORKERS, BATCH, *train.x.shape[1:])
    y = train.y.index_select(0, idx).view(WORKERS, BATCH)
    items = {"one": lambda: [flat.loss_and_grad(W[k], x[k], y[k]) for k in range(WORKERS)],
             "batched": lambda: batched(W, x, y)}
    for f in items.values():
        f()
    times = common.interleaved(items, rounds, 3 if flat.numel < 200_000 else 1)
    return common.median_ratio(times["one"], times["batched"])


FIRST_CALL = """
import time, torch
t0 = time.perf_counter()
from stalegrad.models import build_model
from stalegrad.runtimes.vectorised import BatchedGradient
from stalegrad.core.worker import FlatModel
flat = FlatModel(build_model("logreg", (32,), 10))
batched = BatchedGradient(flat)
W, x, y = flat.flat.repeat(16, 1), torch.randn(16, 128, 32), torch.randint(0, 10, (16, 128))
t1 = time.perf_counter(); batched(W, x, y); t2 = time.perf_counter(); batched(W, x, y); t3 = time.perf_counter()
print(t2 - t1, t3 - t2)
"""


def first_call() -> tuple[float, float]:
    """Wall seconds of the first and the second batched call in a fresh process."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True,
                         cwd=str(common.ROOT), env={**__import__("os").environ, "PYTHONPATH": str(common.ROOT)})
    first, second = map(float, out.stdout.split()[-2:])
    return first, second


def sensitivity(model: str, train, test, samples: int, eps: float = 1e-7) -> float:
    """max |w diff| between two one-by-one runs whose initial weights differ by a factor 1+eps:
    how far float32 rounding differences alone carry this training run."""
    from stalegrad.models import build_model

    def factory(scale):
        def build():
            torch.manual_seed(0)
            m = build_model(model, tuple(train.x.shape[1:]), 10)
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(scale)
            return m
        return build

    a = one(factory(1.0), train, test, samples, False)[1].weights
    b = one(factory(1.0 + eps), train, test, samples, False)[1].weights
    return (a - b).abs().max().item()


def run(quick: bool = False) -> dict:
    budget = QUICK if quick else RUNS
    images = common.image_data(60_000)
    data = {"synthetic": load_pair("synthetic") + ("synthetic (32 features)",), "mnist-shaped": images}
    first_call_s, second_call_s = first_call()   # torch.func's set-up, in a fresh process
    rounds = 1 if quick else 3
    rows = []
    for (kind, model), samples in budget.items():
        train, test, source = data[kind]
        one(model, train, test, WORKERS * BATCH, True)   # warm-up of this model's shapes
        base, vec = [], []
        for _ in range(rounds):
            s0, r0 = one(model, train, test, samples, False)
            s1, r1 = one(model, train, test, samples, True)
            base.append(s0)
            vec.append(s1)
        grad_speedup = gradient_only(model, train, 3)
        rows.append({"data": source, "model": model, "params": r0.weights.numel(), "workers": WORKERS,
                     "gradient_speedup": grad_speedup,
                     "one_by_one_samples_per_s": common.median(base), "vectorised_samples_per_s": common.median(vec),
                     "speedup": common.median([v / b for v, b in zip(vec, base)]),
                     "max_weight_diff": (r0.weights - r1.weights).abs().max().item(),
                     "same_tau_sequence": r0.update_log() == r1.update_log(), "notes": r1.summary["notes"]})
    kind, model = "mnist-shaped", "mlp"
    noise = sensitivity(model, *data[kind][:2], budget[(kind, model)])
    ok = {kind: all(r["speedup"] >= TARGET for r in rows if r["model"] in TARGET_MODELS and r["data"] == src)
          for kind, src in (("synthetic", data["synthetic"][2]), ("mnist-shaped", images[2]))}
    return {"rows": rows, "batch": BATCH, "first_call_s": first_call_s, "second_call_s": second_call_s,
            "mlp_sensitivity_1e-7": noise, "sensitivity_samples": budget[(kind, model)],
            "targets": {f"vectorised / one-by-one >= 2 (logreg, mlp; M = 16; {k})": v for k, v in ok.items()}}


def table(rows: list[dict]) -> dict:
    cols = ["data", "model", "params", "M", "one-by-one samples/s", "vectorised samples/s",
            "speed-up (>= 2 logreg, mlp)", "gradients alone: speed-up", "same tau sequence", "max abs w diff"]
    body = []
    for r in rows:
        mark = common.verdict(r["speedup"] >= TARGET) if r["model"] in TARGET_MODELS else "-"
        body.append([r["data"], r["model"], f"{r['params']:,}", r["workers"], f"{r['one_by_one_samples_per_s']:,.0f}",
                     f"{r['vectorised_samples_per_s']:,.0f}", f"{r['speedup']:.2f} {mark}",
                     f"{r['gradient_speedup']:.2f}",
                     "yes" if r["same_tau_sequence"] else "NO", f"{r['max_weight_diff']:.1e}"])
    return common.page_table(f"asgd, M = {WORKERS}, batch {BATCH}: one worker at a time against vectorised", cols, body)


def notes(result: dict) -> list[str]:
    return [f"The first batched call in a fresh process (torch.func's set-up, left out above by a warm-up run) took "
            f"{result['first_call_s']:.2f} s, the second {result['second_call_s'] * 1e3:.1f} ms (logreg, 16 workers).",
            f"For scale: two one-by-one mlp runs whose initial weights differ by a factor 1 + 1e-7 end "
            f"{result['mlp_sensitivity_1e-7']:.1e} apart (max abs w diff) after the same "
            f"{result['sensitivity_samples']:,} samples."]


def main(argv=None) -> int:
    ap = common.options(__doc__)
    args = ap.parse_args(argv)
    common.settle(ap, args)
    bench = common.Benchmark("vectorised", args.quick)
    result = run(args.quick)
    bench.finish([table(result["rows"])], result, notes=notes(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

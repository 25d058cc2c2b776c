"""The simulator against plain PyTorch on the papers' model (issue 33): agn-mlp, AGN at M = 40, window 10, over one
epoch of Fashion-MNIST, set-up included, against a plain ``torch.optim.Adam`` loop on the same model, batch, data
and thread count; the simulator both with stalegrad imported first and with torch imported and used first (as a
script that builds its data with torch would). Each arm runs in a fresh process, so the import order is real, and
the arms alternate over the rounds, in the reverse order every other round.

    .venv/bin/python benchmarks/archive/sim_vs_plain.py [--threads 2] [--rounds 2] [--epochs 1.0] [--quick]
    .venv/bin/python benchmarks/archive/sim_vs_plain.py --table benchmarks/archive/results/sim_vs_plain.json   # reprint a result

Prints a table (median wall seconds, samples/s, simulator ÷ plain, also by round and
as the median of the rounds, with and without the simulator's test-set
evaluations, which the plain loop does not make, the threads each run used, weights_sha256)
and writes benchmarks/archive/results/sim_vs_plain.json. About 4 minutes at the defaults on a quiet 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load, machine, median, table, write_json  # noqa: E402

# One arm in a fresh process; prints one JSON line. ORDER is "stalegrad" (stalegrad imported first) or "torch"
# (torch imported and a forward pass computed first: MKL then starts before stalegrad can pin it).
ARM = r"""
import json, sys, time
order, kind, epochs = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0 = time.perf_counter()
if order == "torch":
    import torch
    torch.nn.Linear(784, 256)(torch.ones(128, 784))   # a forward pass: MKL starts here
import warnings
import stalegrad as sg
import torch
train, test = sg.load_pair("fashion-mnist")
t_data = time.perf_counter()
if kind == "plain":
    torch.manual_seed(0)
    from stalegrad.models import build_model
    model = build_model("agn-mlp", tuple(train.x.shape[1:]), 10)
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    x, y = train.x, train.y
    n, b = int(len(x) * epochs), 128
    g = torch.Generator().manual_seed(0)
    order_ = torch.randperm(len(x), generator=g)
    done = 0
    while done < n:
        idx = order_[done % len(x):done % len(x) + b]
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        done += len(idx)
    out = {"samples": done, "threads_used": {str(torch.get_num_threads()): None}, "sha": None, "warned": None}
else:
    # the test-set evaluations (the first and the last, at this length), which the plain loop does not make: timed
    # apart, so that the table can show the simulator without them too
    from stalegrad.core.worker import FlatModel
    evaluate, eval_s = FlatModel.evaluate, [0.0]
    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return evaluate(self, *a, **k)
        finally:
            eval_s[0] += time.perf_counter() - t
    FlatModel.evaluate = timed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sg.train("agn-mlp", train, test, sg.AGN(window=10), workers=40, runtime=sg.Simulator(delay="gamma:2"),
                       epochs=epochs, lr=0.001, batch_size=128, eval_every=10, seed=0)
    s = res.summary
    out = {"samples": int(s.get("samples", 0) or 0), "threads_used": s.get("threads_used"),
           "sha": s.get("weights_sha256", "")[:12],
           "warned": next((str(w.message) for w in caught if "thread" in str(w.message)), None),
           "eval_s": eval_s[0]}
out.update(kind=kind, order=order, wall_s=time.perf_counter() - t_data, data_s=t_data - t0)
print(json.dumps(out))
"""


def arm(order: str, kind: str, epochs: float, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", ARM, order, kind, str(epochs)], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[2])
    if proc.returncode != 0:
        sys.exit(f"sim_vs_plain: the {kind} arm ({order} first) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(runs: dict, threads: int) -> None:
    """The table: medians over the rounds, and each round's own ratio to the plain arm of the same round (the
    machine's speed may drift between rounds; within a round the arms ran within a minute of each other)."""
    plain_runs = runs[("stalegrad", "plain")]
    plain = median([r["samples"] / r["wall_s"] for r in plain_runs])
    rows = []
    for (order, kind), rs in runs.items():
        rate = median([r["samples"] / r["wall_s"] for r in rs])
        timed = all("eval_s" in r for r in rs) or kind == "plain"   # (results before eval_s was measured: "-")
        bare = median([r["samples"] / (r["wall_s"] - r.get("eval_s", 0.0)) for r in rs])
        per_round = [(r["samples"] / r["wall_s"]) / (p["samples"] / p["wall_s"]) for r, p in zip(rs, plain_runs)]
        rows.append([kind, f"{order} first", ", ".join(f"{r['wall_s']:.1f}" for r in rs), f"{rate:,.0f}",
                     f"{rate / plain:.2f}", ", ".join(f"{q:.2f}" for q in per_round), f"{median(per_round):.2f}",
                     f"{median([r.get('eval_s', 0.0) for r in rs]):.1f}" if timed else "-",
                     f"{bare / plain:.2f}" if timed else "-",
                     rs[-1]["threads_used"] if kind == "sim" else threads,
                     rs[-1]["sha"] or "-", "yes" if any(r["warned"] for r in rs) else "no"])
    print(table(["arm", "import order", "wall s, by round", "samples/s (median)", "÷ plain (medians)",
                 "÷ plain, by round", "÷ plain, median of the rounds", "of which evaluations s",
                 "÷ plain, evaluations left out", "threads used", "weights_sha256", "warned"], rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of every arm [2]")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three arms, alternated [2]")
    ap.add_argument("--epochs", type=float, default=1.0, help="epochs of Fashion-MNIST per arm [1.0]")
    ap.add_argument("--quick", action="store_true", help="0.05 epoch, one round: checks the script, measures nothing")
    ap.add_argument("--table", metavar="JSON", help="print the table of a result file this script wrote; run nothing")
    args = ap.parse_args(argv)
    if args.table:
        try:
            saved = json.loads(Path(args.table).read_text())
            runs = {tuple(reversed(k.removesuffix("-first").split("-", 1))): v for k, v in saved["runs"].items()}
            report(runs, saved["args"]["threads"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"sim_vs_plain: cannot read {args.table} as this script's result ({type(e).__name__}: {e}); "
                     "pass a file it wrote, such as benchmarks/archive/results/sim_vs_plain.json")
        print(f"load average before {saved['load_before']}, after {saved['load_after']} ({args.table})")
        return 0
    if args.quick:
        args.epochs, args.rounds = 0.05, 1
    before = load()
    arms = [("stalegrad", "plain"), ("stalegrad", "sim"), ("torch", "sim")]
    runs = {a: [] for a in arms}
    for r in range(args.rounds):
        for a in arms if r % 2 == 0 else arms[::-1]:   # ABC CBA: a drift of the machine's speed does not favour one arm
            runs[a].append(arm(*a, args.epochs, args.threads))
    report(runs, args.threads)
    print(f"load average before {before}, after {load()}; {args.threads} threads asked, {args.epochs} epoch(s), "
          f"{args.rounds} round(s)")
    write_json("sim_vs_plain", {"machine": machine(), "args": vars(args), "load_before": before, "load_after": load(),
                                "runs": {f"{k[1]}-{k[0]}-first": v for k, v in runs.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

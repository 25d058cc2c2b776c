"""Stalls: the diverging runs of issue 11 part 4, timed per sixteenth of an epoch.

Fashion-MNIST, mlp, M = 16, lr 0.1 (both rules diverge to chance accuracy
within 4 epochs), 0.5 epoch in 8 intervals of 1/16 (--quick: 1/64),
dcasgd-c and asgd, torch's default threads (one per core), next to one busy
neighbour process (a Python spin loop: "a machine otherwise nearly idle"
still has a job on one core). Each configuration runs in a fresh process,
because libgomp reads OMP_WAIT_POLICY once, when torch loads:

- ``default``: the environment without OMP_WAIT_POLICY or GOMP_SPINCOUNT, so
  what ``import stalegrad`` sets (GOMP_SPINCOUNT=10000) decides. This is the case that catches the stall
  coming back: ``active`` must take at least 2x its wall time (with the busy
  neighbour the spinning barrier always stalls; were the default to spin
  again, the two would be equal). The worst interval over the median is
  reported, not a target: a 1/16 epoch takes a tenth of a second, so one
  scheduling hiccup on a busy machine moves it.
- ``active``: OMP_WAIT_POLICY=ACTIVE, torch's own behaviour (the "before").
- ``flush``: the default plus ``torch.set_flush_denormal(True)``: if subnormal
  floats were the cause, this would be faster; the child also counts the
  subnormals of the weights and of the last gradient at every evaluation.

Each child prints one JSON line: wall and CPU seconds of every interval, the
subnormal counts, skipped non-finite updates, accuracy, ``weights_sha256``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import common  # stalegrad first, so that its OMP_WAIT_POLICY default reaches libgomp, then torch

ALGOS = ("dcasgd-c", "asgd")
MODES = ("default", "active", "flush")
EPOCHS, QUICK_EPOCHS = 0.5, 0.125
INTERVALS = 8             # timestamps per run (an evaluation each)
SPEEDUP = 2.0             # active / default total wall time, with the neighbour: the fix is in effect


def child(algo: str, flush: bool, epochs: float) -> dict:
    """One run in this process; the parent chose its OMP_WAIT_POLICY."""
    import time

    import torch

    import stalegrad as sg
    from stalegrad.runtimes import Simulator

    torch.set_flush_denormal(flush)
    tiny = torch.finfo(torch.float32).tiny

    def subnormal(t) -> int:
        return int(((t != 0) & (t.abs() < tiny)).sum())

    class Probe(Simulator):
        def run(self, training, **kw):
            self.training = training
            super().run(training, **kw)

    sim, rows = Probe(), []
    last = [time.perf_counter(), time.process_time()]

    def on_eval(record):
        wall, cpu = time.perf_counter(), time.process_time()
        run = getattr(sim, "training", None)
        if run is not None:   # epoch 0 is evaluated before the runtime starts
            rows.append({"epoch": record["epoch"], "wall_s": wall - last[0], "cpu_s": cpu - last[1],
                         "subnormal_w": subnormal(run.server.w), "subnormal_grad": subnormal(run.model.grad),
                         "nonfinite_skipped": record["nonfinite_skipped"], "test_acc": record["test_acc"]})
        last[0], last[1] = time.perf_counter(), time.process_time()   # evaluation not counted

    train, test = sg.load_pair("fashion-mnist")
    res = sg.train("mlp", train, test, algo, workers=16, runtime=sim, epochs=epochs, lr=0.1, seed=0,
                   eval_every=epochs / INTERVALS, on_eval=on_eval)
    return {"intervals": rows, "threads": torch.get_num_threads(), "final_test_acc": res.summary["final_test_acc"],
            "weights_sha256": res.summary["weights_sha256"], "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or f"spin {os.environ.get('GOMP_SPINCOUNT')}"}


def spawn(algo: str, mode: str, epochs: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if mode == "active":      # libgomp's own spinning; else the child's `import stalegrad` decides
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, __file__, "--child", algo, str(int(mode == "flush")), str(epochs)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False, neighbour: bool = True) -> dict:
    epochs = QUICK_EPOCHS if quick else EPOCHS
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    try:
        results = {(a, m): spawn(a, m, epochs) for a in ALGOS for m in MODES}
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    rows = []
    for (algo, mode), r in results.items():
        walls = sorted(i["wall_s"] for i in r["intervals"])
        rows.append({"algo": algo, "mode": mode, "omp_wait_policy": r["omp_wait_policy"], "threads": r["threads"],
                     "total_wall_s": sum(walls), "total_cpu_s": sum(i["cpu_s"] for i in r["intervals"]),
                     "median_s": common.median(walls), "worst_s": walls[-1],
                     "worst_over_median": walls[-1] / common.median(walls),
                     "subnormal_w_max": max(i["subnormal_w"] for i in r["intervals"]),
                     "subnormal_grad_max": max(i["subnormal_grad"] for i in r["intervals"]),
                     "nonfinite_skipped": r["intervals"][-1]["nonfinite_skipped"],
                     "final_test_acc": r["final_test_acc"], "weights_sha256": r["weights_sha256"],
                     "intervals": r["intervals"]})
    by = {(r["algo"], r["mode"]): r for r in rows}
    for r in rows:
        r["wall_vs_default"] = r["total_wall_s"] / by[(r["algo"], "default")]["total_wall_s"]
    fast = all(by[(a, "active")]["wall_vs_default"] >= SPEEDUP for a in ALGOS)
    same = all(by[(a, "active")]["weights_sha256"] == by[(a, "default")]["weights_sha256"] for a in ALGOS)
    return {"rows": rows, "epochs": epochs, "neighbour": neighbour,
            "targets": {f"active >= {SPEEDUP:g}x default's wall time": fast,
                        "active and default: same weights_sha256": same},
            "table": table(rows)}


def table(rows: list[dict]) -> str:
    cols = ["algo", "mode", "OMP_WAIT_POLICY", "threads", "wall s", "CPU s", "x default", "median s",
            "worst s", "worst / median", "subnormals w, grad", "skipped", "acc"]
    body = [[r["algo"], r["mode"], r["omp_wait_policy"], r["threads"], f"{r['total_wall_s']:.1f}",
             f"{r['total_cpu_s']:.1f}", f"{r['wall_vs_default']:.2f}", f"{r['median_s']:.2f}", f"{r['worst_s']:.2f}",
             f"{r['worst_over_median']:.1f}", f"{r['subnormal_w_max']}, {r['subnormal_grad_max']}",
             r["nonfinite_skipped"], f"{r['final_test_acc']:.3f}"] for r in rows]
    return common.table(cols, body)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        algo, flush, epochs = sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])
        print(json.dumps(child(algo, flush, epochs)))
    else:
        ap = common.options(__doc__, threads=False, clock=False)   # wall time, torch's threads: what stalls
        ap.add_argument("--no-neighbour", action="store_true", help="no busy process beside the runs")
        args = ap.parse_args()
        common.show(run(args.quick, neighbour=not args.no_neighbour))

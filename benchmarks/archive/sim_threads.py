"""The simulator's numerics and threads: what reproducible bits cost, and which thread count is fast.

Each case is one training run in a fresh process (MKL reads its mode once, at its start), timed by the
run itself (summary.json's wall_s, the training loop without the import and the data loading):

- ``numerics``: the same run with the reproducible numerics (MKL strict CNR, oneDNN off: the default) and
  as before them (MKL's default mode, oneDNN on), at 1 and 2 threads; and pinned to AVX2 kernels
  (``MKL_CBWR=AVX2,STRICT ATEN_CPU_CAPABILITY=avx2``), for the bits across instruction sets.
- ``threads``: 1 thread, every core, and the measured default (``auto``), on the machine as it is
  (``quiet``) and with ``--hogs K`` busy processes beside it (``busy``), interleaved in rounds.

    python benchmarks/archive/sim_threads.py                 # both parts, results/sim_threads.json
    python benchmarks/archive/sim_threads.py --part threads --hogs 2 --rounds 2

Results: benchmarks/archive/NOTES.md, "Reproducible bits" and "Threads under load".
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys

from common import ROOT, command, machine, write_json

# One run: argv = model algo workers epochs mode threads; prints summary.json's figures as JSON.
RUN = r"""
import json, sys
model, algo, workers, epochs, mode, threads = sys.argv[1:7]
if mode == "before":                       # MKL started in its default mode, as before numerics.py
    import torch
    (torch.randn(64, 64) @ torch.randn(64, 64)).sum().item()
import stalegrad as sg
from stalegrad import numerics
if mode == "before":
    numerics.make_strict = lambda: True    # no fallback to one thread
    import torch
    torch.backends.mkldnn.enabled = True
    numerics.torch.backends.mkldnn = type("On", (), {"enabled": True})()
tr, te = sg.load_pair("fashion-mnist")
r = sg.train(model, tr, te, algo, workers=int(workers), epochs=float(epochs), seed=0,
             runtime=sg.Simulator(threads=None if threads == "auto" else int(threads)))
print(json.dumps({"wall_s": r.summary["wall_s"], "sha": r.summary["weights_sha256"][:16],
                  "threads_used": r.summary.get("threads_used"), "numerics": r.config.get("numerics")}))
"""

CASES = [("mlp", "sgd", 1, 3.0), ("agn-mlp", "asgd", 8, 0.3), ("cnn", "asgd", 8, 0.2)]


def run(model, algo, workers, epochs, mode="default", threads="auto", env=None) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    environ.update(env or {})
    load = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", RUN, model, algo, str(workers), str(epochs), mode, str(threads)],
                       capture_output=True, text=True, env=environ, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out.update(load_before=round(load, 2), load_after=round(os.getloadavg()[0], 2))
    return out


def hog(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def part_numerics(rounds: int) -> list[dict]:
    rows = []
    for model, algo, workers, epochs in CASES:
        results: dict[str, list] = {}
        for _ in range(rounds):
            for label, mode, threads, env in (("reproducible t=1", "default", 1, None),
                                              ("reproducible t=2", "default", 2, None),
                                              ("before t=1", "before", 1, None),
                                              ("before t=2", "before", 2, None),
                                              ("avx2 t=2", "default", 2, {"MKL_CBWR": "AVX2,STRICT",
                                                                          "ATEN_CPU_CAPABILITY": "avx2"})):
                results.setdefault(label, []).append(run(model, algo, workers, epochs, mode, threads, env))
        for label, runs in results.items():
            rows.append({"case": f"{model} {algo} M={workers} {epochs:g} ep", "setting": label,
                         "wall_s": statistics.median(r["wall_s"] for r in runs), "sha": runs[0]["sha"],
                         "same_sha_each_round": len({r["sha"] for r in runs}) == 1,
                         "load": [r["load_before"] for r in runs]})
    return rows


def part_threads(rounds: int, hogs: int) -> list[dict]:
    rows = []
    for load in ("quiet", "busy"):
        stop, procs = mp.Event(), []
        if load == "busy":
            procs = [mp.Process(target=hog, args=(stop,), daemon=True) for _ in range(hogs)]
            for p in procs:
                p.start()
        try:
            for model, algo, workers, epochs in CASES[:2]:
                results: dict[str, list] = {}
                for _ in range(rounds):
                    for threads in ("1", "2", "auto"):
                        results.setdefault(threads, []).append(run(model, algo, workers, epochs, threads=threads))
                for threads, runs in results.items():
                    rows.append({"case": f"{model} {algo} M={workers} {epochs:g} ep", "machine": load,
                                 "hogs": hogs if load == "busy" else 0, "threads": threads,
                                 "wall_s": statistics.median(r["wall_s"] for r in runs),
                                 "walls": [r["wall_s"] for r in runs], "sha": runs[0]["sha"],
                                 "threads_used": runs[-1]["threads_used"],
                                 "load": [r["load_before"] for r in runs]})
        finally:
            stop.set()
            for p in procs:
                p.join()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("numerics", "threads", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hogs", type=int, default=2, help="busy processes beside the runs in the 'busy' machine")
    a = ap.parse_args()
    out = {"machine": machine(), "command": command()}
    if a.part in ("numerics", "all"):
        out["numerics"] = part_numerics(a.rounds)
        for r in out["numerics"]:
            print(f"{r['case']:28} {r['setting']:18} {r['wall_s']:7.1f} s  {r['sha']}  load {r['load']}")
    if a.part in ("threads", "all"):
        out["threads"] = part_threads(a.rounds, a.hogs)
        for r in out["threads"]:
            print(f"{r['case']:28} {r['machine']:6} t={r['threads']:4} {r['wall_s']:7.1f} s  {r['walls']}  "
                  f"used {r['threads_used']}  load {r['load']}")
    print("->", write_json(f"sim_threads_{a.part}", out))


if __name__ == "__main__":
    main()

"""GPU: the simulator and the vectorised commit rules on one CUDA device, M = 40, agn-mlp.

    python benchmarks/gpu.py                          # on a machine with CUDA: about 3 minutes
    python benchmarks/gpu.py --device cpu --quick     # a dry run of this script on a CPU (writes nothing)

It needs a CUDA build of torch (the Makefile installs the CPU build: ``make install
TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126'`` or
whatever the machine offers). Without a CUDA device it prints one line and exits
0, so that ``make bench`` passes it by (an earlier results/gpu.json stays). Rows
(Fashion-MNIST when installed, else synthetic MNIST-shaped data; batch 128; seed 0):

- ``plain adam``: a plain PyTorch Adam loop on the device (the baseline);
- ``sim agn w=W``: AGN, 40 workers, window W in (10, 40), one worker at a time;
- ``sim agn w=W vectorised``: the same with ``Simulator(vectorised=True)``
  (when the run cannot batch commit rules it says so in its notes, and the row
  is marked ``fell back``);
- ``sim asgd`` and ``sim asgd vectorised``: the gradient rule.

Each stalegrad row is two rounds of all 40 workers' messages, timed around the
event loop with ``torch.cuda.synchronize``; samples/s, the ratio to plain, and
the device's peak memory. On a GPU an absolute time means something, so the
JSON keeps the seconds too.
"""
from __future__ import annotations

import argparse
import sys
import time

import common  # (stalegrad, then torch)
import torch
import torch.nn.functional as F

import stalegrad as sg
from stalegrad.models import build_model

MODEL, BATCH, WORKERS, WINDOWS = "agn-mlp", 128, 40, (10, 40)


def plain_adam(train, device: str, samples: int) -> float:
    torch.manual_seed(0)
    model = build_model(MODEL, tuple(train.x.shape[1:]), 10).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    x, y = train.x.to(device), train.y.to(device)
    gen = torch.Generator().manual_seed(0)
    steps = samples // BATCH
    perm = torch.randperm(len(y), generator=gen).to(device)

    def step(i):
        j = (i * BATCH) % (len(y) - BATCH)
        idx = perm[j:j + BATCH]
        opt.zero_grad()
        F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx)).backward()
        opt.step()

    for i in range(10):   # warm-up: kernels, allocator
        step(i)
    common.sync(device)
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    common.sync(device)
    return steps * BATCH / (time.perf_counter() - t)


def sim_row(train, test, device: str, algorithm, vectorised: bool, samples: int) -> dict:
    sim = common.TimedSimulator(vectorised=vectorised)
    sim.device = device
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    res = sg.train(MODEL, train, test, algorithm, WORKERS, sim, epochs=samples / len(train.y), batch_size=BATCH,
                   eval_every=1e9, seed=0, device=device)
    fell_back = any("vectorised simulation not used" in n for n in res.summary["notes"])
    return {"samples": res.summary["samples"], "seconds": sim.elapsed,
            "samples_per_s": res.summary["samples"] / sim.elapsed, "fell_back": fell_back,
            "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None,
            "final_test_acc": res.summary["final_test_acc"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    ap.add_argument("--quick", action="store_true", help="one round, tiny budgets (a dry run)")
    ap.add_argument("--out", default=None, help="the folder for gpu.json [benchmarks/results; a dry run on the "
                    "CPU writes nothing unless given]")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"gpu.py: skipped, no CUDA device (torch {torch.__version__} is {build})")
        return 0
    bench = common.Benchmark("gpu", args.quick)
    extra = {}
    if args.device.startswith("cuda"):
        extra = {"gpu": torch.cuda.get_device_name(torch.device(args.device)), "cuda": torch.version.cuda}
    print(f"device: {args.device} {extra}", flush=True)
    train, test, source = common.image_data(60_000, 10_000)
    rounds = 1 if args.quick else 2
    plain_samples = 2_560 if args.quick else 51_200
    rows = []
    plain = plain_adam(train, args.device, plain_samples)
    rows.append({"run": "plain adam", "samples_per_s": plain, "ratio": 1.0})
    configs = [(f"sim agn w={w}", sg.AGN(window=w), rounds * WORKERS * w * BATCH) for w in WINDOWS]
    configs.append(("sim asgd", sg.ASGD(), rounds * 8 * WORKERS * BATCH))
    if args.quick:
        configs = [(n, a, min(s, WORKERS * BATCH)) for n, a, s in configs]
    for name, algorithm, samples in configs:
        for vectorised in (False, True):
            label = name + (" vectorised" if vectorised else "")
            r = sim_row(train, test, args.device, algorithm, vectorised, samples)
            r.update(run=label, ratio=r["samples_per_s"] / plain)
            rows.append(r)
            print(f"{label}: {r['samples_per_s']:.0f} samples/s, {r['ratio']:.2f} x plain, {r['seconds']:.2f} s"
                  + (" (fell back to one by one)" if r["fell_back"] else ""), flush=True)
    table = common.page_table(
        f"{MODEL}, M = {WORKERS}, batch {BATCH} on {extra.get('gpu', args.device)}",
        ["run", "samples/s", "x plain", "seconds", "peak MB", "note"],
        [[r["run"], f"{r['samples_per_s']:,.0f}", f"{r['ratio']:.2f}", f"{r['seconds']:.2f}" if "seconds" in r else "-",
          f"{r['peak_mem_mb']:.0f}" if r.get("peak_mem_mb") else "-", "fell back" if r.get("fell_back") else ""]
         for r in rows])
    out = args.out or (str(common.RESULTS) if args.device.startswith("cuda") else None)
    bench.finish([table], {"device": args.device, "data": source, "model": MODEL, "workers": WORKERS,
                           "batch": BATCH, "rows": rows}, machine_extra=extra, out_dir=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tuning aid (not part of run_all): push time per rule against server.CHUNK.

    .venv/bin/python benchmarks/archive/chunk_sweep.py [--threads N]

For 1M and 10M float32 parameters, times ParameterServer.push for asgd and
dcasgd-a with chunks of 2^14 .. 2^20 elements and without chunking, rounds
interleaved with a memory copy; prints ms and the ratio to the copy.
"""
from __future__ import annotations

import argparse
import sys

import common
import torch

import stalegrad.core.server as server_mod
from stalegrad.algorithms import make_algorithm

CHUNKS = [1 << k for k in (14, 15, 16, 17, 18, 19, 20)] + [None]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rules", default="asgd,dcasgd-c,dcasgd-a")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(common.machine())
    saved = server_mod.CHUNK, server_mod.CHUNK_ABOVE
    try:
        for n in (1_000_000, 10_000_000):
            gen = torch.Generator().manual_seed(0)
            src, dst = torch.randn(n, generator=gen), torch.empty(n)
            items = {"copy": lambda: dst.copy_(src)}
            for name in args.rules.split(","):
                server = server_mod.ParameterServer(make_algorithm(name), torch.randn(n, generator=gen), 2)
                server.pull(0), server.pull(1)
                g = torch.randn(n, generator=gen) * 1e-3
                for c in CHUNKS:
                    def push(server=server, g=g, c=c):
                        server_mod.CHUNK = c or n
                        server_mod.CHUNK_ABOVE = 1 if c else n + 1
                        server.push(1, g, 0.1)
                    push()
                    items[f"{name} chunk={c or 'none'}"] = push
            times = common.interleaved(items, 5, 5 if n < 5e6 else 2)
            tc = common.median(times["copy"])
            print(f"\n{n:,} parameters: copy {tc * 1e3:.3f} ms, load {common.load()}")
            for k, v in times.items():
                print(f"  {k:26s} {common.median(v) * 1e3:8.3f} ms  {common.median_ratio(v, times['copy']):6.2f} x copy")
    finally:
        server_mod.CHUNK, server_mod.CHUNK_ABOVE = saved


if __name__ == "__main__":
    sys.exit(main())

"""The hole in the messages when a worker's node dies, on a two-node Ray cluster on this machine.

    .venv/bin/python benchmarks/archive/ray_node_loss.py            # ~1-2 min on the 2-core machine

A ``ray.cluster_utils.Cluster``: a head (2 CPUs, the server shard and worker 0) and node b (1 CPU,
worker 1). asgd with 2 workers, logreg on three Gaussian blobs, batch 8; at epoch 1 node b is removed
and the run goes on with the survivor. The hole is the longest time between two consecutive pushes
in the whole run (from ``--record-trace``'s wall seconds; without a fault it is an evaluation's): the time the surviving worker's messages
wait. Two settings:

- ``wait 30 s`` (the former behaviour): a replacement actor is always waited for, up to
  ``restart_timeout`` = 30 s, though the cluster has no room for it;
- ``default``: the driver sees that no node has room (``connect.room_for``) and gives the lost
  worker's samples to the survivor at once.

Prints one line per setting and writes benchmarks/archive/results/ray_node_loss.json.
"""
from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import common  # stalegrad, then torch
import ray
import torch
from ray.cluster_utils import Cluster

import stalegrad as sg
from stalegrad.runtimes import RayRuntime
from stalegrad.runtimes.ray import recovery as ray_driver


def blobs(n: int = 256, d: int = 8, classes: int = 3, seed: int = 0):
    """Gaussian blobs around class means fixed once for all calls (those of tests/helpers.py, which a
    benchmark does not import); ``seed`` draws the samples."""
    means = torch.randn(classes, d, generator=torch.Generator().manual_seed(1234)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return SimpleNamespace(x=means[y] + torch.randn(n, d, generator=g), y=y, num_classes=classes)


def one(cluster, restart_timeout: float, always_wait: bool) -> dict:
    node_b = cluster.add_node(num_cpus=1, resources={"wk": 1})
    killed = []

    def kill(record):
        if record["epoch"] >= 1 and not killed:
            killed.append(record["samples"])
            cluster.remove_node(node_b)

    trace = Path(tempfile.mkdtemp()) / "trace.csv"
    room = ray_driver.room_for
    if always_wait:
        ray_driver.room_for = lambda ray, request: True
    try:
        res = sg.train("logreg", blobs(n=512, seed=0), blobs(n=128, seed=1), "asgd", 2,
                       RayRuntime(restart_timeout=restart_timeout, worker_resources={"wk": 1},
                                  shard_resources={"ps": 0.01}, record_trace=trace),
                       epochs=4, batch_size=8, eval_every=0.25, on_eval=kill)
    finally:
        ray_driver.room_for = room
    with open(trace) as f:
        times = [float(r["wall_s"]) for r in csv.DictReader(f)]
    gaps = [b - a for a, b in zip(times, times[1:])]   # the longest is the hole (the kill), or an evaluation
    return {"restart_timeout": restart_timeout, "always_wait": always_wait, "hole_s": round(max(gaps), 3),
            "median_gap_s": round(sorted(gaps)[len(gaps) // 2], 4), "wall_s": round(res.summary["wall_s"], 1),
            "workers_lost": res.summary["workers_lost"], "notes": res.summary["notes"]}


def main() -> None:
    load = os.getloadavg()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"ps": 1, "wk": 1},
                                                      "include_dashboard": False})
    rows = []
    try:
        ray.init(address=c.address, log_to_driver=False)
        for restart_timeout, always_wait, label in ((30.0, True, "wait 30 s (before)"),
                                                    (sg.runtimes.ray.RESTART_TIMEOUT, False, "default (after)")):
            row = one(c, restart_timeout, always_wait)
            rows.append(row)
            print(f"{label}: hole {row['hole_s']:.2f} s after the node was removed (median gap "
                  f"{1000 * row['median_gap_s']:.1f} ms), run {row['wall_s']} s, workers lost "
                  f"{row['workers_lost']}", flush=True)
    finally:
        ray.shutdown()
        c.shutdown()
    out = {"load_before": load, "load_after": os.getloadavg(), "ray": ray.__version__, "rows": rows,
           "when": time.strftime("%Y-%m-%d %H:%M")}
    print(f"load average before {load[0]:.2f}, after {out['load_after'][0]:.2f}")
    common.write_json("ray_node_loss", out, indent=1)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()   # --help; no options
    main()

"""Checkpoints: the complete state of a run, written atomically.

A checkpoint holds the server (weights, version, per-worker snapshots and
MeanSquare, momentum, staleness log), every worker (local optimizer state,
elastic weights, mini-batch stream position and RNG), the run's progress and
metrics so far, the model's buffers, the global torch RNG, and the runtime's
own state (the simulator's event queue and delay RNG). Resuming a simulated
run from it gives the same final weights as never stopping.

It is written to a temporary file in the same directory, flushed, and then
renamed over the previous one, so a crash mid-write never leaves a broken
checkpoint. It is loaded with ``torch.load(weights_only=True)``: only tensors
and plain Python values, never arbitrary pickled objects.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .results import atomic_open
from .server import to_device

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1


class CheckpointError(ValueError):
    """A missing, corrupt or mismatched checkpoint (one-line message)."""


def fingerprint(run) -> dict:
    """What must match between a checkpoint and the run that resumes it."""
    return {
        "algorithm": run.algorithm.to_dict(),
        "workers": run.num_workers,
        "parameters": int(run.server.w.numel()),
        "model": type(run.model.module).__name__,
        "train_samples": run.num_samples,
        "batch_size": run.batch_size,
        "partition": run.partition,
        "seed": run.seed,
        "runtime": run.config.get("runtime", {}).get("name"),
    }


def capture(run, runtime_state: dict) -> dict:
    return {
        "format": FORMAT,
        "fingerprint": fingerprint(run),
        "server": run.server.state_dict(),
        "workers": [{"state": w.state, "pool": w.stream.pool, "stream": w.stream.state_dict(),
                     "last_loss": w.last_loss} for w in run.workers],
        "run": run.progress_state(),
        "buffers": dict(run.model.module.named_buffers()),
        "torch_rng": torch.get_rng_state(),
        "runtime": runtime_state,
    }


def save(path: str | os.PathLike, state: dict) -> None:
    with atomic_open(path) as f:
        torch.save(state, f)


def load(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint there; runs write one with --checkpoint-every N")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, foreign pickle, wrong file type
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: corrupt or not a stalegrad checkpoint ({reason})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or "fingerprint" not in state:
        raise CheckpointError(f"{path}: not a stalegrad checkpoint (format {FORMAT})")
    return state


def check_matches(path, state: dict, run) -> None:
    saved, now = state["fingerprint"], fingerprint(run)
    for key in now:
        if saved.get(key) != now[key]:
            raise CheckpointError(f"{path}: made with {key} {_short(saved.get(key))}, but this run has "
                                  f"{_short(now[key])}; resume with the checkpoint's own configuration")


def restore(run, state: dict) -> dict:
    """Load ``state`` into ``run``; returns the runtime's part."""
    device = run.server.w.device
    run.server.load_state_dict(state["server"])
    for worker, ws in zip(run.workers, state["workers"]):
        worker.state = to_device(ws["state"], device)
        worker.stream.pool = ws["pool"]
        worker.stream.load_state_dict(ws["stream"])
        worker.last_loss = float(ws["last_loss"])
    run.load_progress_state(state["run"])
    buffers = dict(run.model.module.named_buffers())
    for name, value in state["buffers"].items():
        buffers[name].copy_(value)
    torch.set_rng_state(state["torch_rng"])
    return to_device(state["runtime"], device)


def _short(value) -> str:
    if isinstance(value, dict) and "name" in value:
        return f"{value['name']} {({k: v for k, v in value.items() if k != 'name'})}"
    return repr(value)

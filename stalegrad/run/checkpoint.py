"""Checkpoints: the file format of a run's complete state, written atomically.

What goes in comes from each part's own ``state_dict()``: the training run's
(the server's weights, version, per-worker snapshots and MeanSquare, momentum
and staleness log; the progress and metrics so far; the model's buffers; the
torch RNG) and the runtime's (its workers' ``Worker.state_dict()``: local
optimizer state, elastic weights, mini-batch stream and RNG; the simulator's
event queue and delay RNG). This module adds only the format number, the
fingerprint that a resuming run must match, and the atomic write;
``checkpoint_schema.damage`` checks every part against the run that resumes it.
Resuming a simulated run from it gives the same final weights as never stopping.
The final checkpoint of a run is written after its final evaluation, so that
an extension (a resume with more epochs) keeps that evaluation.

It is written to a temporary file in the same directory, flushed, and then
renamed over the previous one, so a crash mid-write never leaves a broken
checkpoint. It is loaded with ``torch.load(weights_only=True)``: only tensors
and plain Python values, never arbitrary pickled objects.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from .checkpoint_schema import damage, first_line
from ..core.options import canonical_partition
from ..errors import ConfigError, RunError, UsageError
from .results import atomic_torch_save, write_failure

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 2


class CheckpointError(UsageError):
    """A missing, corrupt or mismatched checkpoint (one-line message)."""


# What the fingerprint holds since 0.5; a checkpoint made before is compared on the rest.
_ADDED_KEYS = ("schedule", "on_nonfinite", "delay", "step_time", "init")


def fingerprint(run) -> dict:
    """What must match between a checkpoint and the run that resumes it: everything that decides what
    it computes (an edited config.json may not mix two runs while naming one)."""
    config, runtime = run.config, run.resolved.get("runtime", {})
    return {
        "algorithm": config.algorithm.to_dict(),
        "workers": config.workers,
        "parameters": int(run.server.w.numel()),
        "model": type(run.model.module).__name__,
        "train_samples": run.num_samples,
        "batch_size": config.batch_size,
        "partition": config.partition,
        "seed": config.seed,
        "runtime": runtime.get("name"),
        "schedule": {"lr": config.lr, "lr_milestones": list(config.lr_milestones), "lr_gamma": config.lr_gamma},
        "on_nonfinite": config.on_nonfinite,
        "init": config.init,   # (the weights it began from: config.json may not name another)
        # the simulator's clock: its delay model and step time decide the order of the pushes
        **({"delay": runtime.get("delay"), "step_time": runtime.get("step_time")} if "delay" in runtime else {}),
        # only with a validation split, so that checkpoints made before val_split still resume
        **({"val_samples": run.resolved["val_samples"]} if run.resolved.get("val_samples") else {}),
    }


def capture(run, runtime_state: dict) -> dict:
    return {"format": FORMAT, "fingerprint": fingerprint(run), "run": run.state_dict(), "runtime": runtime_state}


def save(path: str | os.PathLike, state: dict) -> None:
    """Replace the checkpoint at ``path``; a failed write (a full disk) leaves the previous one whole."""
    try:
        atomic_torch_save(path, state)
    except OSError as e:
        raise RunError(write_failure(path, e, Path(path).parent)) from None


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
    missing = _missing(state, {"fingerprint": {}, "runtime": {"workers": []},
                               "run": {"server": {"w": None, "version": None, "pulled_version": None, "state": {},
                                                  "live": None, "round": {}, "staleness": {}, "nonfinite_skipped": None},
                                       "progress": {"samples": None, "virtual_s": None, "metrics": None,
                                                    "notes": None, "next_eval": None, "loss_sum": None,
                                                    "loss_count": None, "wall_s": None, "next_checkpoint": None},
                                       "buffers": {}, "torch_rng": None}})
    if missing:
        raise CheckpointError(f"{path}: damaged checkpoint (no {missing}); resume from an intact one, or start afresh")
    return state


def _missing(state, shape: dict, prefix: str = "") -> str | None:
    """The first key of ``shape`` (nested dicts) that ``state`` lacks, or holds with the wrong type."""
    for key, inner in shape.items():
        where = f"{prefix}{key}"
        if not isinstance(state, dict) or key not in state:
            return repr(where)
        if isinstance(inner, dict) and inner:
            found = _missing(state[key], inner, where + ".")
            if found:
                return found
        elif isinstance(inner, (dict, list)) and not isinstance(state[key], type(inner)):
            return f"{where!r} of the right type"
    return None


def check_matches(path, state: dict, run) -> None:
    """Refuse (``CheckpointError``) a checkpoint of another configuration, or one whose contents do
    not fit ``run`` (``damage``): resuming it would fail part-way, after the run directory changed."""
    saved, now = dict(state["fingerprint"]), fingerprint(run)
    if isinstance(saved.get("algorithm"), dict):
        saved["algorithm"] = _with_defaults(saved["algorithm"])
    with contextlib.suppress(ConfigError):   # replicate:011, as a run recorded it before it was read as replicate:11
        saved["partition"] = canonical_partition(saved.get("partition"))
    for key in now:
        if key in _ADDED_KEYS and key not in saved:
            continue
        if saved.get(key) != now[key]:
            raise CheckpointError(f"{path}: made with {key} {_short(saved.get(key))}, but this run has "
                                  f"{_short(now[key])}; resume with the checkpoint's own configuration")
    problem = damage(state, run)
    if problem:
        raise CheckpointError(f"{path}: damaged checkpoint ({problem}); resume from an intact one, or start afresh")


def check_budget(state: dict, run) -> None:
    """Refuse (``ConfigError`` naming ``epochs``) a resume with fewer epochs than the checkpoint's run had."""
    from .progress import count
    # A real runtime may end a few messages past its budget: what counts is the budget it had.
    progress = state["run"]["progress"]
    budget = progress.get("sample_budget")   # (absent from older checkpoints: the samples trained)
    done = int(progress["samples"] if budget is None else budget)
    if done > run.sample_budget:
        epochs = done / run.num_samples
        had = (f"is configured for {count(epochs, 'epoch', '.4g')}, and a resumed run may only be extended"
               if budget is not None else f"has already trained {count(epochs, 'epoch', '.4g')}")
        raise ConfigError("epochs", f"is {run.config.epochs:g}, but the run to resume {had}; give "
                                    f"{epochs:.4g} or more")


def restore(run, state: dict, path=None) -> dict:
    """Load ``state`` into ``run``; returns the runtime's part (its workers' states included), on the
    CPU as saved: each part moves what it needs (random-generator states must stay on the CPU).
    Only memory changes, so a failure here (``CheckpointError``) leaves the run directory as it was."""
    try:
        run.load_state_dict(state["run"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint ({type(e).__name__}: {first_line(e)}); resume from "
                              "an intact one, or start afresh") from None
    return state["runtime"]


def _with_defaults(algorithm: dict) -> dict:
    """A saved algorithm's parameters, with those added since it was saved: the value its rule had
    (``algorithms.ADDED``: sasgd's staleness offset, gap-aware's reading), else today's default (the outer
    optimizer of agn, downpour and dynsgd): a checkpoint made before them resumes as it ran."""
    from ..algorithms import ALGORITHMS, as_saved
    cls = ALGORITHMS.get(algorithm.get("name"))
    return algorithm if cls is None else {**cls().to_dict(), **as_saved(algorithm["name"], algorithm)}


def _short(value) -> str:
    if isinstance(value, dict) and "name" in value:
        return f"{value['name']} {({k: v for k, v in value.items() if k != 'name'})}"
    return repr(value)

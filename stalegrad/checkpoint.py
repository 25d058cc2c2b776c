"""Checkpoints: the file format of a run's complete state, written atomically.

What goes in comes from each part's own ``state_dict()``: the training run's
(the server's weights, version, per-worker snapshots and MeanSquare, momentum
and staleness log; the progress and metrics so far; the model's buffers; the
torch RNG) and the runtime's (its workers' ``Worker.state_dict()``: local
optimizer state, elastic weights, mini-batch stream and RNG; the simulator's
event queue and delay RNG). This module adds only the format number, the
fingerprint that a resuming run must match, and the atomic write. Resuming a
simulated run from it gives the same final weights as never stopping.

It is written to a temporary file in the same directory, flushed, and then
renamed over the previous one, so a crash mid-write never leaves a broken
checkpoint. It is loaded with ``torch.load(weights_only=True)``: only tensors
and plain Python values, never arbitrary pickled objects.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import RunError, UsageError
from .results import atomic_torch_save, write_failure

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 2


class CheckpointError(UsageError):
    """A missing, corrupt or mismatched checkpoint (one-line message)."""


def fingerprint(run) -> dict:
    """What must match between a checkpoint and the run that resumes it."""
    config = run.config
    return {
        "algorithm": config.algorithm.to_dict(),
        "workers": config.workers,
        "parameters": int(run.server.w.numel()),
        "model": type(run.model.module).__name__,
        "train_samples": run.num_samples,
        "batch_size": config.batch_size,
        "partition": config.partition,
        "seed": config.seed,
        "runtime": run.resolved.get("runtime", {}).get("name"),
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
    for key in now:
        if saved.get(key) != now[key]:
            raise CheckpointError(f"{path}: made with {key} {_short(saved.get(key))}, but this run has "
                                  f"{_short(now[key])}; resume with the checkpoint's own configuration")
    problem = damage(state, run)
    if problem:
        raise CheckpointError(f"{path}: damaged checkpoint ({problem}); resume from an intact one, or start afresh")


def restore(run, state: dict, path=None) -> dict:
    """Load ``state`` into ``run``; returns the runtime's part (its workers' states included), on the
    CPU as saved: each part moves what it needs (random-generator states must stay on the CPU).
    Only memory changes, so a failure here (``CheckpointError``) leaves the run directory as it was."""
    try:
        run.load_state_dict(state["run"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint ({type(e).__name__}: {_first_line(e)}); resume from "
                              "an intact one, or start afresh") from None
    return state["runtime"]


# ---- what a checkpoint must hold for this run ------------------------------------------------
# Each check returns None, or the first problem as words: "'run.server.w' holds 10 numbers, not 11".
_RUNTIME_KINDS = {"sim": ("events", "replay"), "local": ("local",), "ray": ("ray",)}
_METRIC_KEYS = ("epoch", "samples", "virtual_s", "wall_s", "test_acc", "test_loss")


def damage(state: dict, run) -> str | None:
    """What is wrong with ``state`` for ``run``, or None: every part is compared with the run's own
    (a fresh state of the same model, algorithm and workers), so that loading it cannot fail."""
    M, template = run.server.num_workers, run.state_dict()
    saved = state["run"]
    server, ref = saved["server"], template["server"]
    return (_like("run.server.w", server["w"], ref["w"])
            or _count("run.server.version", server["version"])
            or _ints("run.server.pulled_version", server["pulled_version"], M, upto=_int(server["version"]))
            or _ints("run.server.live", server["live"], None, upto=M - 1)
            or _staleness(server["staleness"], M)
            or _count("run.server.nonfinite_skipped", server["nonfinite_skipped"])
            or _like("run.server.state", server["state"], ref["state"])
            or _round(server["round"], ref["w"], M)
            or _progress(saved["progress"])
            or _buffers(saved["buffers"], template["buffers"])
            or _generator("run.torch_rng", saved["torch_rng"])
            or _runtime(state["runtime"], run, M))


def _progress(p: dict) -> str | None:
    where = "run.progress."
    for key in ("samples", "next_eval", "next_checkpoint", "loss_count"):
        if (problem := _count(where + key, p[key])):
            return problem
    for key in ("virtual_s", "loss_sum", "wall_s"):
        if not _is_number(p[key]):
            return f"{where + key!r} is {_show(p[key])}, not a number"
    for key in ("sample_budget", "acc_samples"):
        if key in p and (problem := _count(where + key, p[key])):
            return problem
    if "acc_sum" in p and not _is_number(p["acc_sum"]):
        return f"{where}acc_sum' is {_show(p['acc_sum'])}, not a number"
    if not isinstance(p["notes"], list) or not all(isinstance(n, str) for n in p["notes"]):
        return f"{where + 'notes'!r} is not a list of strings"
    metrics = p["metrics"]
    if not isinstance(metrics, list):
        return f"{where + 'metrics'!r} is {_show(metrics)}, not a list of evaluations"
    for i, m in enumerate(metrics):
        if not isinstance(m, dict) or any(k not in m for k in _METRIC_KEYS):
            return f"{where}metrics[{i}]' is not an evaluation (with {', '.join(_METRIC_KEYS)})"
        if not isinstance(m["samples"], int) or not all(_is_number(m[k]) or m[k] is None for k in _METRIC_KEYS):
            return f"{where}metrics[{i}]' holds a value that is not a number"
    if "messages" in p:
        msgs = p["messages"]
        if not isinstance(msgs, torch.Tensor) or msgs.dim() != 2 or msgs.dtype != torch.float64 \
                or msgs.shape[1] != 5:
            return f"{where + 'messages'!r} is {_show(msgs)}, not a table of 5 float64 columns"
    return None


def _staleness(st, M: int) -> str | None:
    where = "run.server.staleness"
    if not isinstance(st, dict) or not all(isinstance(st.get(k), torch.Tensor) and st[k].dim() == 1
                                           for k in ("workers", "taus")):
        return f"{where!r} is not two vectors (workers, taus)"
    workers, taus = st["workers"], st["taus"]
    if workers.is_floating_point() or taus.is_floating_point() or len(workers) != len(taus):
        return f"{where!r} holds {len(workers)} workers and {len(taus)} taus, or not as integers"
    if len(workers) and (int(workers.min()) < 0 or int(workers.max()) >= M or int(taus.min()) < 0):
        return f"{where!r} names a worker outside 0..{M - 1}, or a negative tau"
    return None


def _round(rnd, w, M: int) -> str | None:
    if not isinstance(rnd, dict):
        return f"'run.server.round' is {_show(rnd)}, not a dict"
    for m, g in rnd.items():
        if not isinstance(m, int) or not 0 <= m < M:
            return f"'run.server.round' names worker {m!r}, outside 0..{M - 1}"
        if g is not None and (problem := _like(f"run.server.round[{m}]", g, w)):
            return problem
    return None


def _buffers(saved, ref: dict) -> str | None:
    if not isinstance(saved, dict) or set(saved) != set(ref):
        names = sorted(saved) if isinstance(saved, dict) else saved
        return f"'run.buffers' holds {_show(names)}, the model has {sorted(ref)}"
    return next((p for name in ref if (p := _like(f"run.buffers.{name}", saved[name], ref[name]))), None)


def _runtime(rt, run, M: int) -> str | None:
    kind = rt.get("kind")
    kinds = _RUNTIME_KINDS.get(run.resolved.get("runtime", {}).get("name"))
    if kinds is not None and kind not in kinds:
        return f"'runtime.kind' is {_show(kind)}, not {' or '.join(map(repr, kinds))}"
    workers = rt["workers"]
    if len(workers) != M:
        return f"'runtime.workers' holds {len(workers)} workers' states, the run has {M} workers"
    lost_allowed = kind in ("local", "ray")     # a worker lost before the checkpoint stays lost
    ref = run.worker_factory.build(0).state_dict()
    for m, st in enumerate(workers):
        where = f"runtime.workers[{m}]"
        if st is None and lost_allowed:
            continue
        if not isinstance(st, dict) or "algorithm" not in st or "stream" not in st:
            return f"{where!r} is {_show(st)}, not a worker's state"
        problem = _like(where + ".algorithm", st["algorithm"], ref["algorithm"]) \
            or _stream(where + ".stream", st["stream"], run.num_samples)
        if problem:
            return problem
    if all(st is None for st in workers) and M:
        return "'runtime.workers' holds no live worker"
    for key in ("now", "samples"):
        if key in rt and not _is_number(rt[key]):
            return f"'runtime.{key}' is {_show(rt[key])}, not a number"
    if "pulled" in rt:
        pulled = rt["pulled"]
        if not isinstance(pulled, (list, tuple)) or len(pulled) != M:
            return f"'runtime.pulled' is not one entry per worker ({M})"
        for m, w in enumerate(pulled):
            if w is not None and (problem := _like(f"runtime.pulled[{m}]", w, run.server.w)):
                return problem
    if kind == "events":
        heap = rt.get("heap")
        if not isinstance(heap, (list, tuple)) or not all(
                isinstance(e, (list, tuple)) and len(e) == 3 and _is_number(e[0]) and isinstance(e[1], int)
                and isinstance(e[2], int) and 0 <= e[2] < M for e in heap):
            return f"'runtime.heap' is not a queue of (time, sequence, worker in 0..{M - 1})"
        if _count("runtime.seq", rt.get("seq")) or _ints("runtime.parked", rt.get("parked"), None, upto=M - 1):
            return _count("runtime.seq", rt.get("seq")) or _ints("runtime.parked", rt.get("parked"), None, upto=M - 1)
        try:
            import random
            random.Random().setstate(_as_tuple(rt.get("rng")))
        except (TypeError, ValueError) as e:
            return f"'runtime.rng' is not a random generator's state ({_first_line(e)})"
    if kind == "replay":
        for key in ("pending", "has_pulled"):
            if not isinstance(rt.get(key), (list, tuple)) or len(rt[key]) != M:
                return f"'runtime.{key}' is not one entry per worker ({M})"
        if not isinstance(rt.get("i"), int):
            return f"'runtime.i' is {_show(rt.get('i'))}, not an integer"
    return None


def _stream(where: str, st, num_samples: int) -> str | None:
    if not isinstance(st, dict) or any(k not in st for k in ("pool", "order", "pos", "rng")):
        return f"{where!r} is not a mini-batch stream (pool, order, pos, rng)"
    for key in ("pool", "order"):
        v = st[key]
        if not isinstance(v, torch.Tensor) or v.dim() != 1 or v.dtype != torch.int64 or (
                len(v) and (int(v.min()) < 0 or int(v.max()) >= num_samples)):
            return f"'{where}.{key}' is not a vector of sample indices in 0..{num_samples - 1}"
    if not isinstance(st["pos"], int) or not 0 <= st["pos"] <= len(st["order"]):
        return f"'{where}.pos' is {_show(st['pos'])}, not a position in its order"
    return _generator(where + ".rng", st["rng"])


def _like(where: str, saved, ref) -> str | None:
    """``saved`` has the structure of ``ref``: the same keys, lengths, tensor shapes and dtypes."""
    if isinstance(ref, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return f"{where!r} is {_show(saved)}, not a tensor"
        if saved.shape != ref.shape or saved.dtype != ref.dtype:
            return (f"{where!r} holds {saved.numel()} {saved.dtype} numbers {tuple(saved.shape)}, "
                    f"this run needs {ref.numel()} {ref.dtype} {tuple(ref.shape)}")
        return None
    if isinstance(ref, dict):
        if not isinstance(saved, dict):
            return f"{where!r} is {_show(saved)}, not a dict"
        missing = [k for k in ref if k not in saved]
        if missing:
            return f"no {where}.{missing[0]}"
        return next((p for k in ref if (p := _like(f"{where}.{k}", saved[k], ref[k]))), None)
    if isinstance(ref, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(ref):
            return f"{where!r} is {_show(saved)}, not {len(ref)} entries"
        return next((p for i, (s, r) in enumerate(zip(saved, ref)) if (p := _like(f"{where}[{i}]", s, r))), None)
    if isinstance(ref, bool):
        return None if isinstance(saved, bool) else f"{where!r} is {_show(saved)}, not true or false"
    if isinstance(ref, int):
        return None if isinstance(saved, int) and not isinstance(saved, bool) else \
            f"{where!r} is {_show(saved)}, not an integer"
    if isinstance(ref, float):
        return None if _is_number(saved) else f"{where!r} is {_show(saved)}, not a number"
    return None


def _generator(where: str, value) -> str | None:
    """A torch random generator's state (what ``set_rng_state`` accepts)."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
        return f"{where!r} is {_show(value)}, not a random generator's state"
    try:
        torch.Generator().set_state(value)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"{where!r} is not a random generator's state ({_first_line(e)})"
    return None


def _count(where: str, value) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else f"{where!r} is {_show(value)}, not a count"


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(where: str, values, length: int | None, upto: int | None) -> str | None:
    """A list of integers in 0..upto (of ``length`` entries, when given)."""
    if not isinstance(values, (list, tuple)) or (length is not None and len(values) != length):
        return f"{where!r} is {_show(values)}, not {length if length is not None else 'a list of'} integers"
    if not all(_int(v) is not None and 0 <= v and (upto is None or v <= upto) for v in values):
        return f"{where!r} holds a value outside 0..{upto}"
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:120]


def _with_defaults(algorithm: dict) -> dict:
    """A saved algorithm's parameters, with the defaults of those added since it was saved (the outer
    optimizer of agn, downpour and dynsgd): a checkpoint made before them resumes as it ran."""
    from .algorithms import ALGORITHMS
    cls = ALGORITHMS.get(algorithm.get("name"))
    return algorithm if cls is None else {**cls().to_dict(), **algorithm}


def _short(value) -> str:
    if isinstance(value, dict) and "name" in value:
        return f"{value['name']} {({k: v for k, v in value.items() if k != 'name'})}"
    return repr(value)

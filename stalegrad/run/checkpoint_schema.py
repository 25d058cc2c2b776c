"""What a checkpoint must hold for the run that resumes it: every part that a resume reads, checked
against the run's own (``damage``) before anything is written.

Each check returns None, or the first problem as words: "'run.server.w' holds 10 numbers, not 11". The
metrics are checked key by key against what an evaluation records (``METRIC_FIELDS``), and the progress
against the run's budget: a checkpoint that passes cannot fail part-way through a resume (after the run
directory changed), nor claim more training than its run had.
"""
from __future__ import annotations

import torch

from ..core.state_checks import as_int as _int, count as _count, first_line, ints as _ints, is_number as _is_number, \
    like as _like, server_damage, show as _show

_RUNTIME_KINDS = {"sim": ("events", "replay"), "local": ("local",), "ray": ("ray",)}
# Every key of an evaluation (TrainingRun.evaluate) and what it holds: "count" (an integer >= 0), "number",
# "number?" (or None: no message before it); val_loss and val_acc exactly when the run holds a validation split.
METRIC_FIELDS = {"epoch": "number", "updates": "count", "samples": "count", "wall_s": "number", "virtual_s": "number",
                 "lr": "number", "train_loss": "number?", "train_acc": "fraction?", "test_loss": "number",
                 "test_acc": "fraction", "tau_mean": "number", "nonfinite_skipped": "count"}
VAL_FIELDS = {"val_loss": "number", "val_acc": "fraction"}


def damage(state: dict, run) -> str | None:
    """What is wrong with ``state`` for ``run``, or None: every part is compared with the run's own
    (a fresh state of the same model, algorithm and workers), so that loading it cannot fail."""
    M, template = run.server.num_workers, run.state_dict()
    saved = state["run"]
    server, ref = saved["server"], template["server"]
    return (server_damage(server, ref, M, "run.server")
            or _progress(saved["progress"], run, _int(server["version"]))
            or _buffers(saved["buffers"], template["buffers"])
            or _generator("run.torch_rng", saved["torch_rng"])
            or _runtime(state["runtime"], run, M))


def _progress(p: dict, run, version: int) -> str | None:
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
    samples, per_message = p["samples"], run.config.batch_size * run.algorithm.steps_per_message
    if "sample_budget" in p:   # a real runtime ends at most one message a worker past its budget
        most = p["sample_budget"] + run.server.num_workers * per_message
        if samples > most:
            return (f"{where}samples' is {samples}, more than its budget of {p['sample_budget']} samples "
                    f"and the {run.server.num_workers} messages in flight past it allow ({most})")
    if "messages" in p:
        msgs = p["messages"]
        if not isinstance(msgs, torch.Tensor) or msgs.dim() != 2 or msgs.dtype != torch.float64 \
                or msgs.shape[1] != 5:
            return f"{where + 'messages'!r} is {_show(msgs)}, not a table of 5 float64 columns"
        counted = int(msgs[-1, 0]) if len(msgs) else 0   # each message's row: the samples counted after it
        if counted != samples or samples > len(msgs) * per_message:
            return (f"{where}samples' is {samples}, but its {len(msgs)} messages of at most {per_message} samples "
                    f"counted {counted}")
    return _metrics(p["metrics"], samples, version, run.val_data is not None, "acc_sum" in p)


def _metrics(metrics, samples: int, version: int | None, val: bool, with_train_acc: bool) -> str | None:
    """Every evaluation holds exactly the keys an evaluation of this run records, each of its kind, in
    the order of training, none past the progress."""
    where = "run.progress.metrics"
    if not isinstance(metrics, list):
        return f"{where!r} is {_show(metrics)}, not a list of evaluations"
    fields = {**METRIC_FIELDS, **(VAL_FIELDS if val else {})}
    optional = set() if with_train_acc else {"train_acc"}   # (checkpoints before 0.3 have none)
    before = 0
    for i, m in enumerate(metrics):
        if not isinstance(m, dict):
            return f"'{where}[{i}]' is {_show(m)}, not an evaluation"
        missing = [k for k in fields if k not in m and k not in optional]
        unknown = [k for k in m if k not in fields]
        if missing or unknown:
            what = f"no {missing[0]!r}" if missing else f"an unknown key {unknown[0]!r}"
            return f"'{where}[{i}]' has {what}; an evaluation of this run holds {', '.join(fields)}"
        for key, value in m.items():
            if not _of_kind(value, fields[key]):
                return f"'{where}[{i}].{key}' is {_show(value)}, not {_KIND_TEXT[fields[key]]}"
        if not before <= m["samples"] <= samples or (version is not None and m["updates"] > version):
            return (f"'{where}[{i}]' is at {m['samples']} samples and {m['updates']} updates: out of order, or past "
                    f"the {samples} samples and {version} updates trained")
        before = m["samples"]
    return None


def _of_kind(value, kind: str) -> bool:
    if value is None:
        return kind.endswith("?")
    kind = kind.rstrip("?")
    if kind == "count":
        return _count("", value) is None
    return _is_number(value) and (kind == "number" or 0 <= value <= 1)


_KIND_TEXT = {"count": "a count", "number": "a number", "number?": "a number or null",
              "fraction": "a fraction in [0, 1]", "fraction?": "a fraction in [0, 1] or null"}


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
            return f"'runtime.rng' is not a random generator's state ({first_line(e)})"
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


def _generator(where: str, value) -> str | None:
    """A torch random generator's state (what ``set_rng_state`` accepts)."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
        return f"{where!r} is {_show(value)}, not a random generator's state"
    try:
        torch.Generator().set_state(value)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"{where!r} is not a random generator's state ({first_line(e)})"
    return None


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x

"""Whether a parameter server's ``state_dict`` fits a server (``server_damage``): the weights, the version and
every worker's pulled version, the live workers, the staleness log, the algorithm state and the open round, each
compared with the server's own. ``ParameterServer.load_state_dict`` checks it before anything changes, and a
checkpoint's server part is checked with it (``run/checkpoint_schema.py``, whose helpers these are too).

Each check returns None, or the first problem as words: "'run.server.w' holds 10 numbers, not 11".
"""
from __future__ import annotations

import torch


def server_damage(sd: dict, ref: dict, M: int, where: str, strict: bool = True) -> str | None:
    """What keeps ``sd`` from loading into the server whose ``state_dict()`` is ``ref`` (``M`` workers), or None;
    without ``strict``, the algorithm state and the round are checked only when ``sd`` holds them."""
    if not isinstance(sd, dict):
        return f"{where!r} is {show(sd)}, not a server's state_dict()"
    needed = ("w", "version", "pulled_version", "live", "staleness", "nonfinite_skipped")
    if missing := next((k for k in needed + (("state", "round") if strict else ()) if k not in sd), None):
        return f"{where!r} has no {missing!r}"
    return (like(f"{where}.w", sd["w"], ref["w"])
            or count(f"{where}.version", sd["version"])
            or ints(f"{where}.pulled_version", sd["pulled_version"], M, upto=as_int(sd["version"]))
            or ints(f"{where}.live", sd["live"], None, upto=M - 1)
            or _staleness(sd["staleness"], M, f"{where}.staleness")
            or count(f"{where}.nonfinite_skipped", sd["nonfinite_skipped"])
            or ("state" in sd and (_undeclared(sd["state"], ref["state"], f"{where}.state")
                                   or like(f"{where}.state", sd["state"], ref["state"])))
            or ("round" in sd and _round(sd["round"], ref["w"], M, f"{where}.round"))
            or _held(sd.get("held"), M, f"{where}.held")) or None


def _staleness(st, M: int, where: str) -> str | None:
    if not isinstance(st, dict) or not all(isinstance(st.get(k), torch.Tensor) and st[k].dim() == 1
                                           for k in ("workers", "taus")):
        return f"{where!r} is not two vectors (workers, taus)"
    workers, taus = st["workers"], st["taus"]
    if workers.is_floating_point() or taus.is_floating_point() or len(workers) != len(taus):
        return f"{where!r} holds {len(workers)} workers and {len(taus)} taus, or not as integers"
    if len(workers) and (int(workers.min()) < 0 or int(workers.max()) >= M or int(taus.min()) < 0):
        return f"{where!r} names a worker outside 0..{M - 1}, or a negative tau"
    dropped = st.get("dropped")   # (each worker's dropped messages; an older checkpoint has none)
    if dropped is not None and not (isinstance(dropped, torch.Tensor) and dropped.dim() == 1 and len(dropped) == M
                                    and not dropped.is_floating_point() and (not M or int(dropped.min()) >= 0)):
        return f"'{where}.dropped' is not {M} counts, one per worker"
    return None


def _undeclared(state, ref: dict, where: str) -> str | None:
    """A part of ``state`` that the rule's state (``ref``: its ``to_dict()``) does not hold: a misspelt or foreign
    key, which the rule would never read."""
    if isinstance(state, dict) and (key := next((k for k in state if k not in ref), None)) is not None:
        return f"{where!r} holds {key!r}, which this rule's state does not (its parts: {', '.join(ref) or 'none'})"
    return None


def _held(held, M: int, where: str) -> str | None:
    """The (worker, tau) of the messages a rule holds for its next step (Rennala SGD), if saved."""
    if held is None:
        return None
    if not isinstance(held, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, int) and v >= 0 for v in r)
            and r[0] < M for r in held):
        return f"{where!r} is {show(held)}, not (worker, tau) pairs of workers 0..{M - 1}"
    return None


def _round(rnd, w, M: int, where: str) -> str | None:
    if not isinstance(rnd, dict):
        return f"{where!r} is {show(rnd)}, not a dict"
    for m, g in rnd.items():
        if not isinstance(m, int) or not 0 <= m < M:
            return f"{where!r} names worker {m!r}, outside 0..{M - 1}"
        if g is not None and (problem := like(f"{where}[{m}]", g, w)):
            return problem
    return None


def like(where: str, saved, ref) -> str | None:
    """``saved`` has the structure of ``ref``: the same keys, lengths, tensor shapes and dtypes."""
    if isinstance(ref, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return f"{where!r} is {show(saved)}, not a tensor"
        if saved.shape != ref.shape or saved.dtype != ref.dtype:
            return (f"{where!r} holds {saved.numel()} {saved.dtype} numbers {tuple(saved.shape)}, "
                    f"this run needs {ref.numel()} {ref.dtype} {tuple(ref.shape)}")
        return None
    if isinstance(ref, dict):
        if not isinstance(saved, dict):
            return f"{where!r} is {show(saved)}, not a dict"
        missing = [k for k in ref if k not in saved]
        if missing:
            return f"no {where}.{missing[0]}"
        return next((p for k in ref if (p := like(f"{where}.{k}", saved[k], ref[k]))), None)
    if isinstance(ref, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(ref):
            return f"{where!r} is {show(saved)}, not {len(ref)} entries"
        return next((p for i, (s, r) in enumerate(zip(saved, ref)) if (p := like(f"{where}[{i}]", s, r))), None)
    if isinstance(ref, bool):
        return None if isinstance(saved, bool) else f"{where!r} is {show(saved)}, not true or false"
    if isinstance(ref, int):
        return None if isinstance(saved, int) and not isinstance(saved, bool) else \
            f"{where!r} is {show(saved)}, not an integer"
    if isinstance(ref, float):
        return None if is_number(saved) else f"{where!r} is {show(saved)}, not a number"
    return None


def count(where: str, value) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else f"{where!r} is {show(value)}, not a count"


def as_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ints(where: str, values, length: int | None, upto: int | None) -> str | None:
    """A list of integers in 0..upto (of ``length`` entries, when given)."""
    if not isinstance(values, (list, tuple)) or (length is not None and len(values) != length):
        return f"{where!r} is {show(values)}, not {length if length is not None else 'a list of'} integers"
    if not all(as_int(v) is not None and 0 <= v and (upto is None or v <= upto) for v in values):
        return f"{where!r} holds a value outside 0..{upto}"
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def show(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:120]

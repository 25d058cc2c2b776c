"""The report's modelled cluster time (``stalegrad report --time-model FILE``).

Hermans et al.'s temporal efficiency integrates the *workers' training accuracy* over the *cluster's
wall time*. The simulator's virtual time gives every algorithm the same speed; its wall time is one
process playing every worker. This module puts each simulated message on a modelled cluster time axis
instead, from a measured cost per algorithm (``benchmarks/throughput.py`` writes the file).

**The file** (JSON)::

    {"format": "stalegrad-time-model/1",
     "provenance": {"command": "...", "machine": "...", "date": "...", ...},
     "algorithms": {
        "agn":    {"step_s": 0.0021, "commit_s": 0.0011},
        "aeasgd": [{"window": 10, "step_s": 0.0022, "commit_s": 0.0015},
                   {"step_s": 0.0022, "commit_s": 0.0014}]}}

``step_s``: seconds of one worker's local step (a mini-batch's forward, backward and local optimizer
step: the compute); ``commit_s``: seconds a worker spends per commit outside its local steps (pull,
push, the server's handling, the algorithm's own per-commit work: the communication). An algorithm
maps to one entry or to a list of them; an entry may name a ``window`` and/or a ``workers`` count, and a
run takes the matching entry that names the most of them (an entry naming neither matches every run).

**The formula.** In the simulator worker m's j-th message takes ``step_time * W * f_mj`` virtual seconds
(``W`` local steps, ``steps_per_message``: the window of a commit rule, 1 for a gradient rule; ``f_mj``
the delay model's factor, mean 1 for round-robin, gamma and exponential), and it starts its next
message at once: so its k-th message is pushed at virtual time ``V = step_time * W * sum_{j<=k} f_mj``;
the simulator has no communication. On the modelled cluster the same message costs
``step_s * W * f_mj + commit_s`` seconds, so the worker's k-th push is at

    T = (step_s / step_time) * V + commit_s * k.

messages.jsonl does not say which worker sent a message, so ``k`` is replaced by its expectation given
``V``, ``V / (step_time * W)`` (exact under round-robin, where every ``f`` is 1; under gamma or
exponential delays it errs by the random walk of the factors, O(sqrt(k)) commits of ``commit_s``):

    T = V * (step_s * W + commit_s) / (step_time * W) = V * t(W) / (step_time * W),

with ``t(W) = step_s * W + commit_s`` the measured seconds per commit. Each run's virtual axis is thus
stretched by its algorithm's own seconds per virtual second; the order of the messages, hence the
simulated staleness, is unchanged. Not modelled: a server that saturates at large M (the costs are
measured at the benchmark's M), network bandwidth beyond the machine's shared memory, and the delay
models whose factors do not average 1 (heterogeneous, straggler: their communication term assumes a
speed-1 worker; the report notes such runs).

**The curve.** The workers' mini-batch training accuracy (``train_acc`` of each message, weighted by
its samples) averaged over windows of modelled time. For a pair (run a against run b of the same seed)
the horizon is ``H = min(T_end_a, T_end_b)``, the shorter run's modelled end, and both runs are cut into
the same ``N`` windows of width ``H / N``, ``N = min(WINDOWS, messages of the sparser run before H //
MESSAGES_PER_WINDOW)`` (at least 2); one point per non-empty window, at its middle; messages after ``H``
are left out (the last one, at ``H`` itself, joins the last window). E is then
``metrics.temporal_efficiency`` of the two curves.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import UsageError
from ..run.metrics import temporal_efficiency

FORMAT = "stalegrad-time-model/1"
WINDOWS = 20               # windows of modelled time over the shorter run of a pair, at most
MESSAGES_PER_WINDOW = 4    # ... and at least this many messages of the sparser run per window on average
MEAN_ONE_DELAYS = ("round-robin", "uniform", "gamma", "exponential", "trace")
MATCH_KEYS = ("window", "workers")


class TimeModelError(UsageError):
    """A missing or malformed time-model file (one line, exit 2)."""


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_entry(path, algo: str, e) -> dict:
    where = f"--time-model {path}: algorithms.{algo}"
    if not isinstance(e, dict):
        raise TimeModelError(f"{where}: an entry must be an object {{\"step_s\": ..., \"commit_s\": ...}}, got {e!r}")
    for k in ("step_s", "commit_s"):
        if k not in e:
            raise TimeModelError(f"{where}: no {k!r} (seconds per local step, seconds per commit)")
        if not _num(e[k]) or e[k] < 0:
            raise TimeModelError(f"{where}: {k} must be a finite number of seconds >= 0, got {e[k]!r}")
    if e["step_s"] == 0 and e["commit_s"] == 0:
        raise TimeModelError(f"{where}: step_s and commit_s are both 0; a commit must take some time")
    for k in MATCH_KEYS:
        if k in e and (not isinstance(e[k], int) or isinstance(e[k], bool) or e[k] < 1):
            raise TimeModelError(f"{where}: {k} must be a positive integer, got {e[k]!r}")
    return e


def load_time_model(path) -> dict:
    """The checked time model in ``path``; ``TimeModelError`` (one line) if it is missing or malformed."""
    from ..run.files import JSON_LIMIT, UnreadableFile, loads_json, read_text
    try:
        text = read_text(path, JSON_LIMIT)
    except FileNotFoundError:
        raise TimeModelError(f"--time-model {path}: no such file; write one with benchmarks/throughput.py") from None
    except UnreadableFile as e:
        raise TimeModelError(f"--time-model {path}: {e.reason}") from None
    try:
        model = loads_json(text)
    except json.JSONDecodeError as e:
        raise TimeModelError(f"--time-model {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(model, dict) or model.get("format") != FORMAT:
        raise TimeModelError(f"--time-model {path}: not a time model (its \"format\" must be {FORMAT!r})")
    algos = model.get("algorithms")
    if not isinstance(algos, dict) or not algos:
        raise TimeModelError(f"--time-model {path}: \"algorithms\" must map each algorithm to its costs, "
                             "e.g. {\"agn\": {\"step_s\": 0.002, \"commit_s\": 0.001}}")
    for algo, entries in algos.items():
        entries = entries if isinstance(entries, list) else [entries]
        if not entries:
            raise TimeModelError(f"--time-model {path}: algorithms.{algo} is an empty list")
        algos[algo] = [_check_entry(path, algo, e) for e in entries]
    model["path"] = str(path)
    return model


def steps_per_message(run: dict) -> int:
    """W: the local steps in one message of the run (the window of a commit rule, else 1)."""
    w = run["config"].get("algorithm", {}).get("window", 1)
    return w if isinstance(w, int) and not isinstance(w, bool) and w >= 1 else 1


def cost_for(model: dict, run: dict) -> dict:
    """The entry of ``model`` for the run's algorithm, window and worker count (``TimeModelError`` when none)."""
    algo, W, M = run["algo"], steps_per_message(run), run["config"].get("workers")
    entries = model["algorithms"].get(algo)
    if entries is None:
        raise TimeModelError(f"--time-model {model['path']}: no cost for algorithm {algo!r} (run {run['dir']}); "
                             f"the file has {', '.join(model['algorithms'])}")
    have = {"window": W, "workers": M}
    fits = [e for e in entries if all(e[k] == have[k] for k in MATCH_KEYS if k in e)]
    if not fits:
        raise TimeModelError(f"--time-model {model['path']}: no entry of {algo!r} fits window {W}, workers {M} "
                             f"(run {run['dir']}); add one without \"window\"/\"workers\" to cover every run")
    return max(fits, key=lambda e: sum(k in e for k in MATCH_KEYS))


def seconds_per_virtual_second(model: dict, run: dict) -> float:
    """The run's stretch: t(W) / (step_time * W), t(W) = step_s * W + commit_s (module docstring)."""
    rt = run["config"].get("runtime") or {}
    if rt.get("name", "sim") != "sim":
        raise TimeModelError(f"--time-model models simulated runs (virtual time); {run['dir']} ran on runtime "
                             f"{rt.get('name')!r}, whose times are already measured: use --variant workers")
    step_time = rt.get("step_time", 1.0)
    W = steps_per_message(run)
    e = cost_for(model, run)
    return (e["step_s"] * W + e["commit_s"]) / (step_time * W)


def approximate_delay(run: dict) -> bool:
    """Whether the run's delay model's factors do not average 1 (the commit term is then approximate)."""
    delay = str((run["config"].get("runtime") or {}).get("delay") or "")
    return delay.partition(":")[0] not in MEAN_ONE_DELAYS


def modelled_messages(run: dict, scale: float) -> list[tuple[float, float, float]]:
    """(modelled time T = scale * virtual_s, samples of the message, train_acc) of each message with a
    finite training accuracy and virtual time."""
    out, prev = [], 0
    for m in run["messages"]:
        samples = m.get("samples") or 0
        weight, prev = samples - prev, samples
        if _num(m.get("train_acc")) and _num(m.get("virtual_s")) and weight > 0:
            out.append((scale * m["virtual_s"], float(weight), float(m["train_acc"])))
    return out


def binned(points, width: float, windows: int):
    """The weighted mean accuracy in each of ``windows`` windows of ``width`` from 0 (points after the
    last window's end are left out; one at its end joins it); one point per non-empty window, at its middle."""
    sums = [[0.0, 0.0] for _ in range(windows)]
    end = width * windows
    for t, w, acc in points:
        if t > end * (1 + 1e-12):
            continue
        k = min(int(t // width), windows - 1)
        sums[k][0] += w * acc
        sums[k][1] += w
    xs = [(k + 0.5) * width for k in range(windows) if sums[k][1] > 0]
    return xs, [s[0] / s[1] for s in sums if s[1] > 0]


def window_count(a, b, horizon: float) -> int:
    sparse = min(sum(1 for p in a if p[0] <= horizon), sum(1 for p in b if p[0] <= horizon))
    return max(2, min(WINDOWS, sparse // MESSAGES_PER_WINDOW))


def modelled_te(run_a: dict, run_b: dict, scale_a: float, scale_b: float, windows: int | None = None) -> float:
    """E(run a, run b) of the workers' training accuracy over modelled time (module docstring); ``windows``:
    the number of windows over the shorter run (default ``window_count``). NaN when a run has no point."""
    a, b = modelled_messages(run_a, scale_a), modelled_messages(run_b, scale_b)
    if not a or not b:
        return math.nan
    horizon = min(max(p[0] for p in a), max(p[0] for p in b))
    if not horizon > 0:
        return math.nan
    n = windows or window_count(a, b, horizon)
    ca, cb = binned(a, horizon / n, n), binned(b, horizon / n, n)
    if len(ca[0]) < 2 or len(cb[0]) < 2:
        return math.nan
    return temporal_efficiency(ca, cb)


def describe(model: dict) -> dict:
    """What the report says about the model: the file, its provenance, each algorithm's costs."""
    return {"file": model["path"], "provenance": model.get("provenance"),
            "algorithms": {a: [{k: e[k] for k in ("window", "workers", "step_s", "commit_s") if k in e}
                               for e in es] for a, es in model["algorithms"].items()}}


def summarise(groups: list[dict], model: dict) -> dict:
    """The time model as the report states it: the file, its provenance and costs, and per group the
    entry used, the seconds per commit t(W) and the stretch t(W) / (step_time x W)."""
    approximate = []
    for g in groups:
        r = g["runs"][0]
        e, W = cost_for(model, r), steps_per_message(r)
        g["modelled"] = {"window": W, "step_s": e["step_s"], "commit_s": e["commit_s"],
                         "seconds_per_commit": e["step_s"] * W + e["commit_s"], "seconds_per_virtual_s": r["time_scale"]}
        if approximate_delay(r):
            approximate.append(g["label"])
    return {**describe(model), "approximate": approximate,
            "formula": "T = V x t(W) / (step_time x W), t(W) = step_s x W + commit_s (stalegrad/study/report_time.py)"}


def grid_time_model(grid_path, report: dict) -> None:
    """A grid's ``[report] time_model``, if any: the file's path (relative to the grid file's folder), read
    and checked when the grid is parsed (``UsageError`` naming the grid file); ``report`` then takes the
    resolved path and the workers-modelled variant."""
    if "time_model" not in report:
        return
    value = report["time_model"]
    if not isinstance(value, str) or not value:
        raise UsageError(f"{grid_path}: [report] time_model must be a file's path (a string), not {value!r}")
    path = Path(grid_path).parent / value
    try:
        load_time_model(path)
    except UsageError as e:
        raise UsageError(f"{grid_path}: [report] {e}") from None
    report["time_model"], report["variant"] = str(path), "workers-modelled"

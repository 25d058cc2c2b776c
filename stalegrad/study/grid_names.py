"""The names of a grid's cells and the TOML of their values (``stalegrad/study/grid.py``).

Names: the algorithm and a part for every axis that applies to the cell, joined by ``-``, e.g.
``asgd-M8-lr0.1-gamma2-s0``; a name longer than 150 characters is cut, with a hash that keeps it unique.
"""
from __future__ import annotations

import contextlib
import math
import re

from ..core.options import canonical_partition
from ..errors import ConfigError
from ..run.options import ALGO_FLAGS

PREFIX = {"workers": "M", "window": "W", "lr": "lr", "seed": "s", "algo": "", "delay": ""}


def canonical(option: str, value):
    """An option's value as a run records it (``replicate:011`` is ``replicate:11``): one layout, one cell name."""
    if option == "partition":
        with contextlib.suppress(ConfigError):   # (a wrong one: the cell's own check says so)
            return canonical_partition(value)
    return value


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return '"' + "".join(c if c not in '"\\' and 0x20 <= ord(c) != 0x7F else
                             {'"': '\\"', "\\": "\\\\"}.get(c, f"\\u{ord(c):04x}") for c in v) + '"'
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def name_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v).removesuffix(".0")
    if isinstance(v, list):
        return "x".join(name_value(x) for x in v)
    text = re.sub(r":(?=\d)", "", str(v))
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def _part_order(key: str) -> tuple:
    rank = {"algo": 0, "workers": 1, "window": 2, "lr": 3, "delay": 6, "seed": 7}
    return (rank.get(key, 4 if key in ALGO_FLAGS else 5), key)


def cell_name(algo: str, axes: dict) -> str:
    parts = [PREFIX.get(k, f"{k}_") + name_value(axes[k]) for k in sorted(axes, key=_part_order) if k != "algo"]
    name = "-".join([name_value(algo), *parts])
    if len(name) > 150:      # keep it a valid file name; the hash keeps it unique
        import hashlib
        name = f"{name[:130]}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name

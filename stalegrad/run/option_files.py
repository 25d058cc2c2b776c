"""Option values that come from files: a ``--config`` TOML file (and so a grid's cells), and a resumed run's
config.json. Each value must have the type its option takes (``value_problem``: no "0.1" for a number, no 5 for
a list of sizes) and passes the checks its flag's value passes on the command line (``file_value``: a choice, a
list of sizes, a path); a mistake is one ``UsageError`` naming the file and the key as written there.
"""
from __future__ import annotations

import os
import stat
import tomllib

from ..errors import UsageError
from .files import CONFIG_LIMIT, UnreadableFile, loads_toml, read_text
from .options import NOT_IN_CONFIG, Option


def parse_numbers(value) -> tuple[float, ...] | None:
    """``80,120`` (or a list) as numbers; ValueError saying what was expected."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        return tuple(float(v) for v in items if not isinstance(v, str) or v.strip())
    except (TypeError, ValueError):
        raise ValueError(f"expected comma-separated numbers like 80,120, got {value!r}") from None


def parse_sizes(value) -> tuple[int, ...] | None:
    """``256,128`` (or a list) as positive integers; ValueError saying what was expected."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        sizes = tuple(int(v) for v in items if not isinstance(v, str) or v.strip())
    except (TypeError, ValueError):
        raise ValueError(f"expected comma-separated sizes like 256,128, got {value!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"hidden sizes must be positive integers, got {value!r}")
    return sizes


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_OK = {"flag": lambda v: isinstance(v, bool),
       "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
       "number": _is_number,
       "ints": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
       "numbers": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
       "string": lambda v: isinstance(v, str)}
_KIND_TEXT = {"flag": "true or false", "int": "an integer", "number": "a number",
              "ints": "a list of integers, e.g. [256, 128]", "numbers": "a list of numbers, e.g. [80, 120]",
              "string": "a string (in quotes)"}


def value_problem(option: Option, value) -> str | None:
    """Why ``value`` (as tomllib reads it) cannot be the value of ``option``, or None: types are strict
    (no "0.1" for a number, no 5 for a path, no date, a list only where the option takes one)."""
    kind = "string" if option.kind in ("dir", "file") else option.kind
    if _OK[kind](value):
        return None
    shown = value.isoformat() if hasattr(value, "isoformat") else repr(value)
    hint = f" (one of {', '.join(map(str, option.choices))})" if option.choices else ""
    return f"must be {_KIND_TEXT[kind]}{hint}, not {shown}"


def _converted(option: Option, value):
    """``value`` (of the right type) as the option's flag would parse it; ValueError with the flag's message."""
    if option.kind == "ints":
        return parse_sizes(value)
    if option.kind == "numbers":
        return parse_numbers(value)
    if option.kind in ("flag", "int", "number"):
        return {"flag": bool, "int": int, "number": float}[option.kind](value)
    if option.choices is not None and value not in option.choices:
        shown = ", ".join(map(repr, option.choices))
        raise ValueError(f"{value!r} is not {shown}." if len(option.choices) == 1 else
                         f"{value!r} is not one of {shown}.")
    if option.kind in ("dir", "file"):
        what = "directory" if option.kind == "dir" else "file"
        if value == "":   # (the current directory, or some library's default: never meant)
            raise ValueError(f"is empty; give a {what} name" + (" (. for the current directory)" if what == "directory"
                                                                  else ""))
        try:
            mode = os.stat(value).st_mode
        except OSError:
            return value   # (it need not exist)
        if option.kind == "dir" and stat.S_ISREG(mode):
            raise ValueError(f"Directory {value!r} is a file.")
        if option.kind == "file" and stat.S_ISDIR(mode):
            raise ValueError(f"File {value!r} is a directory.")
        if not os.access(value, os.R_OK):
            raise ValueError(f"{what.title()} {value!r} is not readable.")
    return value


def file_value(option: Option, value, where: str, hint: str = ""):
    """``value`` of ``option`` as a file gave it, typed (``value_problem``) and converted as its flag's value is
    (sizes, a choice, a path); else ``UsageError``: ``where`` (the file and the key), the problem, ``hint``."""
    problem = value_problem(option, value)
    if problem is not None:
        raise UsageError(f"{where} {problem}{hint}")
    try:
        return _converted(option, value)
    except OverflowError:   # an integer of thousands of digits given to a float option
        raise UsageError(f"{where} is {len(str(value)):,} digits long, too large for a number{hint}") from None
    except ValueError as e:
        raise UsageError(f"{where}: {str(e).rstrip('.') if hint else e}{hint}") from None


CONFIG_TABLE = "train"   # a config file holds its keys at the top level or in one [train] table


def read_config_table(path: str, is_option=lambda key: False) -> dict:
    """The options of a --config file, keys as written; UsageError naming the file for a file that cannot
    be read, is not TOML, or holds a table other than [train] or keys both in and outside it."""
    try:   # (regular, bounded: not /dev/zero, a FIFO or a file of gigabytes)
        table = loads_toml(read_text(path, CONFIG_LIMIT))
    except (FileNotFoundError, UnreadableFile) as e:
        raise UsageError(f"{path}: {getattr(e, 'reason', 'does not exist')}; give a TOML file of options") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    tables = [k for k, v in table.items() if isinstance(v, dict) and not is_option(k)]   # (an option's
    # inline table is a value of the wrong type: config_values says so)
    for key in tables:
        if key != CONFIG_TABLE:
            raise UsageError(f"{path}: unknown table [{key}]; a config file holds options at the top level "
                             f"or in one [{CONFIG_TABLE}] table")
    if CONFIG_TABLE in table and not isinstance(table[CONFIG_TABLE], dict):
        raise UsageError(f"{path}: unknown key {CONFIG_TABLE!r}; [{CONFIG_TABLE}] is a table of options, "
                         "not a value")
    if tables:
        outside = [k for k in table if k != CONFIG_TABLE]
        if outside:
            raise UsageError(f"{path}: {outside[0]} is outside the [{CONFIG_TABLE}] table, which holds the "
                             f"options; put every option in [{CONFIG_TABLE}] or write none of them in a table")
        table = table[CONFIG_TABLE]
        nested = [k for k, v in table.items() if isinstance(v, dict) and not is_option(k)]
        if nested:
            raise UsageError(f"{path}: unknown table [{CONFIG_TABLE}.{nested[0]}]; [{CONFIG_TABLE}] holds "
                             "options only")
    return table


def config_values(path: str, command: str, options, given=lambda name: False, origins: dict | None = None) -> dict:
    """The values a --config file gives the options of ``stalegrad COMMAND`` (``options``), by option name, but
    for those ``given(name)`` says the command line gave (flags win); ``origins`` (when given) gets
    ``{option: (file, key as written)}`` for each value returned. A key written twice (``batch-size`` and
    ``batch_size``), unknown, or of the wrong type is one ``UsageError`` naming the file."""
    by_name = {o.name: o for o in options}
    flag_names = {f.lstrip("-"): o.name for o in options for f in o.flags}

    def option(key: str) -> str:
        return flag_names.get(key.replace("_", "-"), key.replace("-", "_"))
    table = read_config_table(path, lambda key: key != CONFIG_TABLE and option(key) in by_name)
    known = sorted(n.replace("_", "-") for n in by_name if n not in NOT_IN_CONFIG)
    spelled: dict[str, str] = {}   # option -> its key as the file wrote it
    values = {}
    for key, value in table.items():
        name = option(key)
        if name not in by_name or name in NOT_IN_CONFIG:
            raise UsageError(f"{path}: unknown key {key!r}; keys are the flag names of "
                             f"'stalegrad {command}': {', '.join(known)}")
        if name in spelled:   # batch-size and batch_size (or M and workers): never the last one silently
            raise UsageError(f"{path}: {spelled[name]!r} and {key!r} are one option "
                             f"({by_name[name].flag}); give it once")
        spelled[name] = key
        problem = value_problem(by_name[name], value)
        if problem is not None:
            raise UsageError(f"{path}: {key} {problem}")
        if given(name):
            continue
        values[name] = file_value(by_name[name], value, f"{path}: {key}")
        if origins is not None:
            origins[name] = (path, key)
    return values


def option_defaults(options) -> dict:
    """Every option's value when neither the command line nor a file gives it."""
    return {o.name: o.parsed_default for o in options}

"""Option values that come from files: a ``--config`` TOML file (and so a grid's cells), and a resumed run's
config.json. Each value must have the type its flag takes (``toml_value_problem``: no "0.1" for a number, no 5
for a list of sizes) and passes the flag's own conversion and checks (``file_value``: a choice, a list of
sizes); a mistake is one ``UsageError`` naming the file and the key as written there.
"""
from __future__ import annotations

import tomllib

import click

from ..errors import UsageError
from ..run.files import CONFIG_LIMIT, UnreadableFile, loads_toml, read_text


def csv_floats(ctx, param, value):
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        return tuple(float(v) for v in items if not isinstance(v, str) or v.strip())
    except (TypeError, ValueError):
        raise click.BadParameter(f"expected comma-separated numbers like 80,120, got {value!r}") from None


def csv_ints(ctx, param, value):
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        sizes = tuple(int(v) for v in items if not isinstance(v, str) or v.strip())
    except (TypeError, ValueError):
        raise click.BadParameter(f"expected comma-separated sizes like 256,128, got {value!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter(f"hidden sizes must be positive integers, got {value!r}")
    return sizes


def _expected_kind(param: click.Parameter) -> str:
    """What a TOML value of ``param`` must be: 'flag', 'int', 'number', 'ints', 'numbers' or 'string'."""
    if param.callback is csv_ints:
        return "ints"
    if param.callback is csv_floats:
        return "numbers"
    if getattr(param, "is_flag", False):
        return "flag"
    if isinstance(param.type, click.types.IntParamType):
        return "int"
    if isinstance(param.type, click.types.FloatParamType):
        return "number"
    return "string"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KIND_TEXT = {"flag": "true or false", "int": "an integer", "number": "a number",
              "ints": "a list of integers, e.g. [256, 128]", "numbers": "a list of numbers, e.g. [80, 120]",
              "string": "a string (in quotes)"}


def toml_value_problem(param: click.Parameter, value) -> str | None:
    """Why ``value`` (as tomllib reads it) cannot be the value of ``param``, or None: types are strict
    (no "0.1" for a number, no 5 for a path, no date, a list only where the option takes one)."""
    kind = _expected_kind(param)
    ok = {"flag": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": _is_number,
          "ints": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
          "numbers": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
          "string": lambda v: isinstance(v, str)}[kind](value)
    if ok:
        return None
    shown = value.isoformat() if hasattr(value, "isoformat") else repr(value)
    choices = getattr(param.type, "choices", None)
    hint = f" (one of {', '.join(map(str, choices))})" if choices else ""
    return f"must be {_KIND_TEXT[kind]}{hint}, not {shown}"


def file_value(ctx: click.Context, param: click.Parameter, value, where: str, hint: str = ""):
    """``value`` of ``param`` as a file gave it, typed (``toml_value_problem``) and converted as its flag's value
    is (``csv_ints``, a choice); else ``UsageError``: ``where`` (the file and the key), the problem, ``hint``."""
    problem = toml_value_problem(param, value)
    if problem is not None:
        raise UsageError(f"{where} {problem}{hint}")
    try:
        return param.callback(ctx, param, value) if param.callback else param.type_cast_value(ctx, value)
    except click.BadParameter as e:
        raise UsageError(f"{where}: {e.message.rstrip('.') if hint else e.message}{hint}") from None


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
    # inline table is a value of the wrong type: apply_config_file says so)
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

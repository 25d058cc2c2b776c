"""The options of ``train`` and ``compare`` as click's flags, and a ``--config`` file's values of them.

The options themselves, with their types, defaults, bounds and help, are ``stalegrad/run/options.py``'s; here
each becomes a flag. Options come from three places, in rising priority: defaults, ``--config FILE.toml``,
flags. The flags only parse; every check lives in ``RunConfig``, the algorithms and the runtimes
(``run.options.check_options``), whose ``ConfigError`` names the parameter in Python terms. ``flag_of`` gives
the flag of a parameter, so that the CLI prints the library's message with the flag in it.
"""
from __future__ import annotations

import contextlib

import click
from click.core import ParameterSource

from ..errors import ConfigError, UsageError
from ..run.option_files import config_values, parse_numbers, parse_sizes
from ..run.options import ALGO_FLAGS, COMPARE_OPTIONS, TRAIN_OPTIONS, Option

COMMANDS = {"train": TRAIN_OPTIONS, "compare": COMPARE_OPTIONS}   # the options of each command, in --help's order


def csv_floats(ctx, param, value):
    try:
        return parse_numbers(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def csv_ints(ctx, param, value):
    try:
        return parse_sizes(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


_TYPES = {"int": int, "number": float, "dir": click.Path(file_okay=False), "file": click.Path(dir_okay=False)}


def click_option(o: Option):
    """The click option of ``o``: its flags, type (or the callback that parses a list), default and help."""
    decls = [f"{o.flags[0]}/{o.off}"] if o.off else list(o.flags)
    kw: dict = {"help": o.help}
    if o.default is not None or not (o.required or o.kind == "flag"):   # (None: click's missing value)
        kw["default"] = o.default
    if o.kind == "flag" and not o.off:
        kw["is_flag"] = True
    elif o.kind in _TYPES:
        kw["type"] = _TYPES[o.kind]
    elif o.choices is not None:
        kw["type"] = click.Choice(o.choices)
    if o.kind in ("ints", "numbers"):
        kw["callback"] = csv_ints if o.kind == "ints" else csv_floats
    for key in ("show_default", "metavar", "required"):
        if getattr(o, key):
            kw[key] = getattr(o, key)
    return click.option(*decls, o.name, **kw)


def click_options(options):
    """A decorator giving a command the flags of ``options``, in their order."""
    def decorate(f):
        for o in reversed(options):
            f = click_option(o)(f)
        return f
    return decorate


def flag_of(command: click.Command, param: str) -> str | None:
    """The flag of ``command`` for a parameter name (``lr`` -> ``--lr``, ``algorithm`` -> ``--algo``);
    None for a parameter that is no flag (a Python-only argument)."""
    if param in ALGO_FLAGS:
        return ALGO_FLAGS[param]
    if param == "algorithm":
        return "--algo"
    for p in command.params:
        if p.name == param and p.opts:
            return max(p.opts, key=len)
    return None


def apply_config_file(ctx: click.Context, params: dict, origins: dict | None = None) -> dict:
    """Fill every option not given on the command line from --config; ``origins`` (when given) gets
    ``{option: (file, key as written)}`` for each option the file gave (``named_in_file``)."""
    path = params.pop("config_file", None)
    if not path:
        return params
    params.update(config_values(path, ctx.command.name, COMMANDS[ctx.command.name],
                                lambda name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE, origins))
    return params


@contextlib.contextmanager
def named_in_file(command: click.Command, origins: dict):
    """A ``ConfigError`` about an option that a --config file gave names the file and its key as written
    there (``FILE: val_split must be ...``), not the flag that was never typed."""
    try:
        yield
    except ConfigError as e:
        if e.param not in origins:
            raise
        path, key = origins[e.param]
        text = e.for_cli(lambda p: key if p == e.param else flag_of(command, p))
        raise UsageError(f"{path}: {text}") from None

"""The ``stalegrad`` command line: train, compare, grid, report, plot, algorithms, data fetch.

Every user mistake ends in one line on stderr, ``stalegrad: error: ...``, and
exit code 2, before anything is written; a run that fails ends the same way
with exit code 1. The library raises ``StalegradError`` (with its exit code);
``main`` catches it once, and spells a ``ConfigError``'s parameter as its flag.

An interrupt (Ctrl-C) ends a command with one line and exit code 130, except
once ``train`` has begun writing summary.json: the run is then finished, the
interrupt is ignored and the command exits 0. Neither does an interrupt during
the process's exit, after ``main`` has returned, add a traceback to it.

The top layer: it may import ``study``, ``run``, ``runtimes``, ``core``, ``algorithms``, ``models`` and
``data``, and no module of theirs imports it (``tests/test_architecture.py``).
"""
from __future__ import annotations

import signal
import sys
import threading
import warnings

import click

from ..errors import ConfigError, NumericsWarning, StalegradError
from ..run.options import WARNED
from .options import flag_of
from .grid import grid
from .report import report
from .run import compare, train
from .tools import algorithms, data, plot


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="stalegrad")
def cli():
    """Asynchronous data-parallel training with staleness-aware optimizers (DC-ASGD, AGN, and baselines)."""


class NonEmptyPath(click.Path):
    """A ``click.Path`` that refuses the empty string, which would otherwise mean the current directory
    (``--out ""``) or a default of some library (``--tensorboard ""``: torch's ``./runs/...``)."""

    @classmethod
    def like(cls, path_type: click.Path) -> "NonEmptyPath":
        new = cls.__new__(cls)
        new.__dict__.update(vars(path_type))   # the same checks (file_okay, dir_okay, ...) as declared
        return new

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value == "":
            what = "directory" if not self.file_okay else "file" if not self.dir_okay else "path"
            here = " (. for the current directory)" if what == "directory" else ""
            self.fail(f"is empty; give a {what} name{here}", param, ctx)
        return super().convert(value, param, ctx)


def refuse_empty_paths(command: click.Command) -> None:
    """Every path option and argument of ``command`` and its subcommands refuses "" (on the command
    line and in a --config file alike: both convert through the option's type)."""
    for param in command.params:
        if isinstance(param.type, click.Path) and not isinstance(param.type, NonEmptyPath):
            param.type = NonEmptyPath.like(param.type)
    for sub in getattr(command, "commands", {}).values():
        refuse_empty_paths(sub)


_format_warning = warnings.formatwarning


def _one_line(message, category, filename, lineno, line=None):
    """The library's own warnings as one line on the terminal; any other as Python shows it."""
    if issubclass(category, NumericsWarning):
        return f"stalegrad: warning: {message}\n"
    return _format_warning(message, category, filename, lineno, line)


warnings.formatwarning = _one_line

for command in (train, compare, grid, report, plot, algorithms, data):
    cli.add_command(command)
refuse_empty_paths(cli)


def _one_line(text: str) -> str:
    return " ".join(text.split()) if text else ""


def main(argv=None) -> int:
    """Entry point: one-line errors, exit 2 for usage errors, 1 for a failed run, 130 when interrupted.
    ``argv`` None: this process's own command line (the ``stalegrad`` script, ``python -m stalegrad``)."""
    if threading.current_thread() is not threading.main_thread():   # (no signal handlers there)
        return _main(argv)
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        return _main(argv)
    finally:
        if argv is None:   # the exit code is decided and said: the interpreter's exit (torch's finalisers
            signal.signal(signal.SIGINT, signal.SIG_IGN)   # run for a while) is not to be interrupted
        elif interrupt is not None:   # a caller in this process gets its handler back (train's finishing()
            signal.signal(signal.SIGINT, interrupt)   # took it)


def _main(argv) -> int:
    WARNED.clear()   # each command prints its deprecation lines once
    try:
        code = cli.main(args=argv, prog_name="stalegrad", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("stalegrad: interrupted", err=True)
        return 130
    except click.ClickException as e:
        hint = ""
        if isinstance(e, click.UsageError) and e.ctx is not None:
            hint = f" (see '{e.ctx.command_path} --help')"
        click.echo(f"stalegrad: error: {_one_line(e.format_message())}{hint}", err=True)
        return e.exit_code
    except ConfigError as e:   # the library's message, with the parameter spelled as its flag
        click.echo(f"stalegrad: error: {_one_line(e.for_cli(lambda p: flag_of(train, p)))}", err=True)
        return e.exit_code
    except StalegradError as e:
        click.echo(f"stalegrad: error: {_one_line(str(e)) or type(e).__name__}", err=True)
        return e.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())

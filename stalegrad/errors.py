"""One family of exceptions, each with the exit code the command line uses.

Every error the library raises on purpose is a ``StalegradError``; the CLI
catches that one class and prints its message as one line. Two kinds:

- ``UsageError`` (exit code 2): the user's input is wrong (an option, a file,
  a data set, a run directory). Nothing has been written or changed.
- ``RunError`` (exit code 1): the input was fine, but the run failed
  (a NaN/Inf update under ``on_nonfinite='stop'``, a worker process raised).

``ConfigError`` names the parameter in Python terms (``lr must be > 0``); the
CLI prints the same message with the flag instead (``--lr must be > 0``), so
that ``stalegrad.train(lr=-1)`` and ``stalegrad train --lr -1`` say the same.
Other parameters the message names are spelled the same way: every
snake_case word of the problem that is a parameter (``checkpoint_every`` ->
``--checkpoint-every``), and the single words listed in ``mentions``.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Callable

_SNAKE = re.compile(r"(?<![\w./-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/-])")


class StalegradError(Exception):
    """Base class of every error stalegrad raises on purpose."""
    exit_code = 1


class UsageError(StalegradError, ValueError):
    """A mistake in the user's input, found before anything was written."""
    exit_code = 2


class ConfigError(UsageError):
    """A bad value of one named parameter.

    ``ConfigError("lr", "must be > 0 and finite, got -1.0")`` reads
    ``lr must be > 0 and finite, got -1.0``; ``context`` (an algorithm's or a
    runtime's name) is put in front: ``dcasgd-a: lam0 must be >= 0``.
    """

    def __init__(self, param: str, problem: str, context: str | None = None, mentions: tuple[str, ...] = ()):
        self.param, self.problem, self.context = param, problem, context
        self.mentions = tuple(mentions)   # single-word parameters the problem names (snake_case ones are found)
        super().__init__(self.render(param))

    def render(self, name: str, problem: str | None = None) -> str:
        text = f"{name} {self.problem if problem is None else problem}"
        return f"{self.context}: {text}" if self.context else text

    def for_cli(self, flag_of: Callable[[str], str | None]) -> str:
        """The message with the parameter, and every other parameter it names, spelled as its
        command-line flag where it has one."""
        def spell(match: re.Match) -> str:
            return flag_of(match.group(0)) or match.group(0)
        problem = _SNAKE.sub(spell, self.problem)
        for other in self.mentions:
            flag = flag_of(other)
            if flag:
                problem = re.sub(rf"(?<![\w-]){re.escape(other)}(?![\w-])", flag, problem)
        return self.render(flag_of(self.param) or self.param, problem)


class RunError(StalegradError, RuntimeError):
    """A run that started correctly failed."""
    exit_code = 1


def check_finite_positive(name: str, value, context: str | None = None, *, strict: bool = True) -> float:
    """``value`` as a float, or ConfigError: it must be a finite number > 0 (``strict``) or >= 0."""
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        v = float(value) if ok else None
    except OverflowError:
        v = None
    bound = "> 0" if strict else ">= 0"
    if v is None or v != v or v in (float("inf"), float("-inf")) or (v <= 0 if strict else v < 0):
        raise ConfigError(name, f"must be a finite number {bound}, got {value!r}", context)
    return v


class NumericsWarning(UserWarning):
    """The simulator runs at fewer threads than asked or available, to keep a seed's bits (``numerics``);
    the CLI prints it as one line."""


def check_writable(param: str, path: str | os.PathLike) -> None:
    """Refuse an output file that could not be written at the end of a run: try to write it now.

    Such files (a trace) are written through a temporary file in the same directory; both are
    created here and removed again (the file only if it did not exist before), so that a missing or
    read-only directory, /proc, a read-only mount or missing permissions are found before training.
    ``ConfigError`` names ``param``.
    """
    shown = repr(str(path))
    target = Path(path)            # as written: a symbolic link is replaced, not followed
    parent = target.parent
    created = False
    try:
        if not parent.is_dir():
            why = "does not exist" if not parent.exists() else "is not a directory"
            raise ConfigError(param, f"is {shown}, but the directory {os.path.abspath(parent)} {why}")
        if target.is_dir():
            raise ConfigError(param, f"is {shown}, but that is a directory; give a file name")
        existed = target.exists()
        if existed and not target.is_file():
            raise ConfigError(param, f"is {shown}, but that is not a regular file (the run replaces it)")
        with open(target, "a"):   # an existing file is not changed: this appends nothing
            created = not existed
        if created:
            target.unlink()
            created = False
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".check", dir=parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        if created:   # created, then something else failed
            target.unlink(missing_ok=True)
        raise ConfigError(param, f"is {shown}, but the file cannot be written there "
                                 f"({e.strerror or e})") from None

"""Whether the worker processes can start from the script that started the run.

'forkserver' and 'spawn' start each child from a clean interpreter that imports the main script again
(as ``__mp_main__``) before it runs anything, so that the child has the script's functions. Two scripts
break this, and multiprocessing says so only with a traceback per worker (30 to 300 lines) followed
by "all workers died":

- a script read from standard input (``python - <<EOF``): the child looks for a file named
  ``<stdin>`` and dies;
- a script that starts the run at its top level, outside ``if __name__ == "__main__":``: the child
  runs the script again, starts the run again, and multiprocessing refuses to start processes
  during a child's start.

``check_main_script`` finds both before any process is started and raises one ``UsageError`` that
says what to do. ``python -c`` and the interactive interpreter have no script to import: a child
imports nothing of theirs, and they work as they are.
"""
from __future__ import annotations

import ast
import inspect
import os
import sys
from multiprocessing import process

from ...errors import UsageError

GUARD = '`if __name__ == "__main__":`'
CLI = "or use the command line (stalegrad train --runtime local ...)"


class MainScriptError(UsageError):
    """The script that started a local run cannot be imported by its worker processes (one line)."""


def check_main_script() -> None:
    """Refuse, before any process starts, a main script that the workers could not import, or that would
    start the run again when they import it. The same cases as multiprocessing's own preparation of a
    child (``multiprocessing.spawn.get_preparation_data``)."""
    main = sys.modules.get("__main__")
    if main is None:
        return
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if name is not None:   # python -m NAME: a child imports NAME, except a package's __main__
        if name == "__main__" or name.endswith(".__main__") or path is None:
            return
    elif path is None:     # python -c, the interactive interpreter: nothing for a child to import
        return
    elif os.path.splitext(os.path.basename(path))[0] == "ipython":   # skipped by multiprocessing too
        return
    elif not os.path.isfile(os.path.join(process.ORIGINAL_DIR or "", path)):
        raise_brief(MainScriptError(
            f"the local runtime's workers import the script that started the run, and there is no file {path} "
            f"to import (a script read from standard input has none): put the code in a file, with the run "
            f"under {GUARD}, {CLI}"))
    line = unguarded_call(main, path)
    if line is not None:
        raise_brief(MainScriptError(
            f"the local runtime's workers import the script that started the run, {os.path.basename(path)}, "
            f"and would start the run again at its line {line}: put that line under {GUARD}, {CLI}"))


def unguarded_call(main, path: str) -> int | None:
    """The line of the main script's top-level code that led to this call, if it is not under an
    ``if`` that tests ``__name__``: the line a child would run again. None if it is guarded, or the
    script cannot be read or parsed (then nothing is refused)."""
    frame, line = inspect.currentframe(), None
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        with open(os.path.join(process.ORIGINAL_DIR or "", path), "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for body in guarded(node):
                if body and body[0].lineno <= line <= body[-1].end_lineno:
                    return None
    return line


def guarded(node: ast.If) -> list[list[ast.stmt]]:
    """The branches of ``node`` that a child importing the script as ``__mp_main__`` does not run: the body
    of ``if __name__ == "__main__"``, the else of ``!=``; both branches of any other test of ``__name__``
    (unsure: nothing is refused)."""
    test = node.test
    if not any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(test)):
        return []
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
        sides = (test.left, test.comparators[0])
        if (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
                and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)):
            return [node.body] if isinstance(test.ops[0], ast.Eq) else [node.orelse]
    return [node.body, node.orelse]


_BRIEF: list[BaseException] = []


def raise_brief(error: UsageError):
    """Raise ``error``; left uncaught, it prints as one line, as the command line prints it, instead of a
    traceback that only shows where the check ran. Any other exception prints as before."""
    if not _BRIEF:
        previous = sys.excepthook

        def brief(kind, value, tb):
            if value in _BRIEF:
                print(f"stalegrad: error: {value}", file=sys.stderr)
            else:
                previous(kind, value, tb)
        sys.excepthook = brief
    _BRIEF[:] = [error]
    raise error

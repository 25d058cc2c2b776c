"""``torch`` imported on first use.

Importing torch takes one to three seconds. The modules that the command line
needs before it can print ``--help``, list the algorithms or refuse a bad flag
(the algorithms' hyper-parameters, the option names) use ``torch`` only inside
their functions, so they refer to it through this stand-in, which imports it
the first time an attribute is asked for. Everything else imports torch as usual.
"""
from __future__ import annotations

import importlib


class LazyModule:
    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


torch = LazyModule("torch")

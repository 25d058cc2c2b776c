"""Griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): each update rule's entry in the API reference,
written from the rule itself.

mkdocstrings reads the source, which shows it neither the docstring a rule class gets from its summary and
update rule (``Algorithm.__init_subclass__``) nor its hyper-parameters' help (``param``'s metadata). This
extension imports the rules and writes each one's entry: what it is and where it comes from, its update, how
to ask for it, and a table of its hyper-parameters (TOML key, CLI flag, default, meaning, choices), the same
metadata that the command line's flags and ``stalegrad algorithms`` read. Nothing is written by hand, so a new
rule or a new parameter cannot be left out (tests/test_public_api.py checks the built page).
"""
from __future__ import annotations

import inspect
import re

import griffe

from stalegrad.algorithms import ALGORITHMS
from stalegrad.algorithms.base import rule_docstring

# Characters that Markdown would read as markup in a table cell of plain text (a ``*`` pair in a help text
# would turn italic, a ``|`` would end the cell); ``<`` has no backslash escape, only its entity.
_MARKUP = re.compile(r"([\\`*_|\[\]])")


def plain(text: str) -> str:
    """``text`` as literal Markdown."""
    return _MARKUP.sub(r"\\\1", text.replace("&", "&amp;").replace("<", "&lt;"))


def kind(cls) -> str:
    return "synchronous" if cls.synchronous else ("sequential" if cls.sequential else "asynchronous")


def rule_reference(cls) -> str:
    """The reference entry of rule class ``cls``, in Markdown: its summary (what it is, its source), its own
    docstring if it has one, its update rule, its name on the command line and its hyper-parameters."""
    lines = [plain(cls.summary) + ".", ""]
    if cls.__doc__ != rule_docstring(cls):
        lines += [inspect.cleandoc(cls.__doc__), ""]
    lines += [f"Update rule: `{cls.rule}`", "",
              f"`stalegrad train --algo {cls.name}`, `make_algorithm(\"{cls.name}\", ...)`; {kind(cls)}.", ""]
    params = cls.hyperparameters()
    if not params:
        return "\n".join(lines + ["No hyper-parameters."])
    lines += ["| parameter | flag | default | meaning |", "|---|---|---|---|"]
    for f in params:
        meaning = plain(f.metadata["help"])
        if f.metadata.get("choices"):
            meaning += "; one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"])
        lines.append(f"| `{f.name}` | `{f.metadata['flag']}` | `{f.default!r}` | {meaning} |")
    return "\n".join(lines)


class RuleReference(griffe.Extension):
    """Replaces the docstring griffe read for each class of ``ALGORITHMS`` by its ``rule_reference``."""

    def __init__(self) -> None:
        super().__init__()
        self.rules = {f"{c.__module__}.{c.__qualname__}": c for c in ALGORITHMS.values()}

    def on_class(self, *, cls: griffe.Class, **kwargs) -> None:
        rule = self.rules.get(cls.path)
        if rule is not None:
            cls.docstring = griffe.Docstring(rule_reference(rule), parent=cls)

"""`import stalegrad as sg` reaches every rule and every name the API reference's tables promise, each has a
docstring, and the built reference documents each one. The lists come from the registry (``ALGORITHMS``), the
docs' tables and ``:::`` blocks and the modules themselves, not from ``sg.__all__``, so a rule, a name or a
parameter that one of them forgets fails here."""
from __future__ import annotations

import dataclasses
import html
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import stalegrad as sg
from stalegrad.algorithms import ALGORITHMS
from stalegrad.algorithms.base import GradientAlgorithm

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
RULES = sorted(ALGORITHMS.values(), key=lambda c: c.name)


def api_tables() -> dict[str, set[str]]:
    """docs/api/index.md's table of pages: page file -> the backquoted identifiers of its row."""
    rows = re.findall(r"^\| \[[^\]]+\]\(([\w.]+)\) \| (.*) \|$", (API / "index.md").read_text(), flags=re.M)
    assert len(rows) >= 5, "the API index lost its table of pages"
    return {page: set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", names)) for page, names in rows}


def documented_names() -> set[str]:
    return set().union(*api_tables().values())


def blocks(page: str) -> list[str]:
    """The identifiers of a reference page's ``:::`` blocks."""
    return re.findall(r"^::: ([\w.]+)$", (API / page).read_text(), flags=re.M)


def text(fragment: str) -> str:
    """An HTML fragment's text: tags dropped, entities read, white space as single spaces."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def dataclass_signature(cls) -> str:
    """The docstring @dataclass writes into a class that has none."""
    return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")


@pytest.mark.parametrize("cls", RULES, ids=lambda c: c.name)
def test_every_rule_class_is_a_name_of_sg(cls):
    assert cls.__name__ in sg.__all__
    assert getattr(sg, cls.__name__) is cls


def test_every_name_of_the_api_tables_is_a_name_of_sg():
    names = documented_names()
    assert {"load_model", "ShardedServer", "Worker", "WorkerFactory", "fetch", "build_model"} <= names
    assert not names - set(sg.__all__), f"docs/api/index.md promises names sg lacks: {sorted(names - set(sg.__all__))}"


def test_every_name_of_sg_is_in_the_api_tables():
    # the rules are one entry of the table ("every rule"): test_every_rule_is_in_the_reference checks each
    rules = {cls.__name__ for cls in RULES}
    missing = set(sg.__all__) - rules - documented_names()
    assert not missing, f"sg has names docs/api/index.md does not list: {sorted(missing)}"


def test_every_name_of_sg_imports_in_a_fresh_interpreter():
    # a fresh process: this one may have imported the modules already, hiding a name that resolves nowhere
    code = "import stalegrad as sg; missing = [n for n in sg.__all__ if getattr(sg, n, None) is None]; print(missing)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_class_and_function_of_sg_has_a_docstring_of_its_own():
    undocumented = []
    for name in sg.__all__:
        obj = getattr(sg, name)
        if inspect.isclass(obj):
            doc = obj.__dict__.get("__doc__")   # not inherited: a class without one shows None, or @dataclass's
            if not doc or not doc.strip() or dataclasses.is_dataclass(obj) and doc == dataclass_signature(obj):
                undocumented.append(name)
        elif inspect.isfunction(obj) and not (obj.__doc__ or "").strip():
            undocumented.append(name)
    assert len(sg.__all__) > 40 and not undocumented, f"no docstring of their own: {undocumented}"


def test_a_rule_without_a_docstring_gets_one_from_its_summary_and_update_rule():
    @dataclass(frozen=True)
    class Made(GradientAlgorithm):
        name = "made-here"
        summary = "a rule of this test (Author et al. 2099)"
        rule = "w <- w - lr*g"

    @dataclass(frozen=True)
    class Written(Made):
        """Its own words."""
        name = "written-here"

    @dataclass(frozen=True)
    class Unnamed(GradientAlgorithm):   # shares code, names no rule: @dataclass's signature, as before
        pass

    assert Made.__doc__ == "a rule of this test (Author et al. 2099).\n\nUpdate rule: ``w <- w - lr*g``"
    assert Written.__doc__ == "Its own words."
    assert Unnamed.__doc__ == dataclass_signature(Unnamed)
    assert sg.DCASGDConstant.__doc__ == ("DC-ASGD with constant lambda (Zheng et al. 2017).\n\n"
                                         "Update rule: ``w <- w - lr*(g + lam*g*g*(w - w_bak[m]))``")


# ---- the built reference ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' (make install does)")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return out / "api"


TABLE_ROW = re.compile(r"<tr>\s*" + r"<td>(.*?)</td>\s*" * 4 + r"</tr>", re.S)


def entry(page_html: str, identifier: str, following: list[str]) -> str:
    """The HTML of ``identifier``'s entry: from its heading to the next of ``following``'s headings."""
    start = page_html.index(f'id="{identifier}"')
    ends = [i for other in following if (i := page_html.find(f'id="{other}"', start + 1)) > start]
    return page_html[start:min(ends, default=len(page_html))]


def test_every_rule_is_in_the_reference_with_its_summary_rule_and_every_parameter(site):
    page = (site / "algorithms.html").read_text()
    paths = [f"{cls.__module__}.{cls.__qualname__}" for cls in RULES]
    assert not set(paths) - set(blocks("algorithms.md")), "docs/api/algorithms.md lacks a ::: block of a rule"
    for cls, path in zip(RULES, paths):
        own = entry(page, path, paths)
        words = text(own)
        assert " ".join(cls.summary.split()) in words, cls.name       # what it is, and its source
        assert " ".join(cls.rule.split()) in words, cls.name
        assert f"--algo {cls.name}" in words, cls.name
        rows = [[text(cell) for cell in row] for row in TABLE_ROW.findall(own)]
        params = cls.hyperparameters()
        assert params and [row[:3] for row in rows] == [[f.name, f.metadata["flag"], repr(f.default)] for f in params]
        for (*_, meaning), f in zip(rows, params):
            choices = f.metadata.get("choices")
            written = " ".join(f.metadata["help"].split()) + (f"; one of {', '.join(choices)}" if choices else "")
            assert meaning == written, (cls.name, f.name)


def test_every_name_of_the_api_tables_is_rendered_on_its_page(site):
    for page, names in api_tables().items():
        html_ = (site / page.replace(".md", ".html")).read_text()
        ids = {identifier.rsplit(".", 1)[-1] for identifier in re.findall(r'id="(stalegrad\.[\w.]+)"', html_)}
        missing = {n for n in names if n in sg.__all__} - ids
        assert not missing, f"{page} does not render {sorted(missing)}"


def test_every_public_function_and_class_of_the_study_modules_is_on_the_study_page(site):
    page = (site / "study.html").read_text()
    modules = [m for m in blocks("study.md") if m != "stalegrad.study"]
    assert {"stalegrad.study.grid", "stalegrad.study.selection", "stalegrad.study.stats",
            "stalegrad.study.intervals", "stalegrad.study.report"} <= set(modules)
    for module in map(importlib.import_module, modules):
        public = [name for name, obj in vars(module).items() if not name.startswith("_")
                  and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__]
        assert public, module.__name__
        # mkdocstrings leaves out what has no docstring: a missing one shows here as a missing entry
        missing = [name for name in public if f'id="{module.__name__}.{name}"' not in page]
        assert not missing, f"{module.__name__}: {missing} not on docs/api/study.md (a docstring missing?)"

"""Damaged inputs of the readers of many runs: ``stalegrad report`` leaves a damaged run out with one line naming it
and the problem and reports the rest; experiments/findings.py and experiments/speed.py explain a damaged input in
one line, exit 2, no traceback, nothing written. Every file goes through run/files.py's bounded reader, whose parsers
turn an integer of more digits than Python converts into a parse error like any other."""
import json
import os
import shutil
import tomllib

import pytest
from click.testing import CliRunner

from helpers import experiment
from test_findings import CLAIM, CLAIMS_HEAD
from stalegrad.cli import main
from stalegrad.cli.report import report
from stalegrad.run.files import UnreadableFile, loads_json, loads_toml, read_parsed

LONG = "1" + "0" * 4999   # 5,000 digits: past Python's 4,300-digit limit on int(str)
SAID = f"a number of 5,000 digits, more than the {4300:,} an integer may have"


# ---- the parsers --------------------------------------------------------------------------------------------
def test_an_integer_too_long_to_convert_is_a_parse_error_at_its_line():
    with pytest.raises(json.JSONDecodeError) as e:
        loads_json('[1,\n2,\n' + LONG + ']')
    assert e.value.msg == SAID and e.value.lineno == 3
    with pytest.raises(tomllib.TOMLDecodeError, match=SAID.replace(",", ",") + r" \(at line 2\)"):
        loads_toml(f"a = 1\nb = {LONG}\n")
    assert loads_json("[" + "9" * 4300 + "]") == [int("9" * 4300)]   # at the limit: read


def test_read_parsed_says_why_in_a_phrase_after_the_name(tmp_path):
    cases = {"missing.json": (None, "json", "does not exist"),
             "cut.json": ('{"a": [1, 2', "json", "is not valid JSON ("),
             "bad.toml": ("a = [", "toml", "is not valid TOML ("),
             "lines.jsonl": ('{"a": 1}\n\n{"a": \n', "jsonl", "line 3 is not valid JSON ("),
             "dir.json": ("", "json", "is a directory, not a file")}
    for name, (text, kind, said) in cases.items():
        if name == "dir.json":
            (tmp_path / name).mkdir()
        elif text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(UnreadableFile) as e:
            read_parsed(tmp_path / name, 2**20, kind)
        assert e.value.reason.startswith(said), (name, e.value.reason)
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n\n[2]\n')
    assert read_parsed(tmp_path / "ok.jsonl", 100, "jsonl") == [{"a": 1}, [2]]


def test_a_float_option_given_thousands_of_digits_in_a_config_file_is_one_line(capsys, tmp_path):
    (tmp_path / "c.toml").write_text("epochs = 1" + "0" * 4000 + "\n")   # 4,001 digits: parsed, but no float holds it
    assert main(["train", "--config", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"stalegrad: error: {tmp_path / 'c.toml'}: epochs is 4,001 digits long, too large for a number"
    assert not (tmp_path / "out").exists()


# ---- stalegrad report ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        assert main(["train", "--dataset", "synthetic", "--model", "logreg", "--epochs", "0.25", "--eval-every",
                     "0.125", "--quiet", "--seed", str(seed), "--out", str(root / f"s{seed}")]) == 0
    return root


def _metrics_line(d, text):
    lines = (d / "metrics.jsonl").read_text().splitlines()
    lines[1] = text
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


REPORT_DAMAGE = {   # how the copy is damaged, what the one line says
    "long number": (lambda d: _metrics_line(d, '{"epoch": 0.125, "test_acc": ' + LONG + '}'),
                    f"metrics.jsonl is corrupt ({SAID} at line 2)"),
    "truncated": (lambda d: _metrics_line(d, '{"epoch": 0.125, "test_a'),
                  "metrics.jsonl is corrupt (Unterminated string starting at at line 2)"),
    "missing": (lambda d: (d / "metrics.jsonl").unlink(), "not a finished stalegrad run (missing metrics.jsonl)"),
    "long probe": (lambda d: (d / "probes.jsonl").write_text('{"tau": ' + LONG + '}\n'),
                   f"probes.jsonl is corrupt (line 1 is not JSON: {SAID})"),
    "long config": (lambda d: (d / "config.json").write_text('{"seed": ' + LONG + '}'),
                    f"config.json is corrupt ({SAID} at line 1)"),
}


def test_report_skips_each_damaged_run_with_one_line_and_reports_the_rest(runs, tmp_path):
    given = tmp_path / "in"
    shutil.copytree(runs / "s0", given / "good0")
    shutil.copytree(runs / "s1", given / "good1")
    for name, (damage, _) in REPORT_DAMAGE.items():
        shutil.copytree(runs / "s0", given / name.replace(" ", "-"))
        damage(given / name.replace(" ", "-"))
    res = CliRunner().invoke(report, [str(given), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    warnings = res.stderr.strip().splitlines()
    assert len(warnings) == len(REPORT_DAMAGE), res.stderr
    for name, (_, said) in REPORT_DAMAGE.items():
        assert f"stalegrad: warning: skipped {given / name.replace(' ', '-')}: {said}" in res.stderr, name
    assert "Traceback" not in res.output
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["compared"]["runs"] == 2 and rep["groups"][0]["seeds"] == [0, 1]


def test_report_on_damaged_runs_alone_is_one_line_exit_2_and_writes_nothing(runs, tmp_path):
    for name, (damage, _) in REPORT_DAMAGE.items():
        shutil.copytree(runs / "s0", tmp_path / "in" / name.replace(" ", "-"))
        damage(tmp_path / "in" / name.replace(" ", "-"))
    res = CliRunner().invoke(report, [str(tmp_path / "in"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "no usable run to report on" in res.output and "and 4 more damaged runs" in res.output
    assert not (tmp_path / "out").exists()


# ---- experiments/findings.py --------------------------------------------------------------------------------
findings = experiment("findings")
speed = experiment("speed")

# one claim, as tests/test_findings.py writes its plans
CLAIMS = CLAIMS_HEAD.lstrip().replace("{claims}", CLAIM.format(id="X1", a="x"))


@pytest.fixture
def root(tmp_path):
    (tmp_path / "experiments/confirm").mkdir(parents=True)
    (tmp_path / "docs/results/confirm").mkdir(parents=True)
    (tmp_path / "experiments/confirm/claims.toml").write_text(CLAIMS)
    (tmp_path / "experiments/confirm/descriptive.toml").write_text("")
    (tmp_path / "docs/results/confirm/registration.toml").write_text('commit = "abc1234"\ndate = "D"\n')
    for seed in (1, 2, 3):
        for algo, acc in (("x", 0.91 + seed / 100), ("y", 0.90)):
            d = tmp_path / f"docs/results/confirm/runs/g/{algo}-s{seed}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo}, "workers": 4, "seed": seed}))
            (d / "summary.json").write_text(json.dumps({"final_test_acc": acc, "final_test_loss": 0.3,
                                                        "diverged": False, "wall_s": 10.0}))
    return tmp_path


def _edit(path, old, new):
    path.write_text(path.read_text().replace(old, new, 1))


CLAIMS_FILE, REGISTRATION = "experiments/confirm/claims.toml", "docs/results/confirm/registration.toml"
RUN = "docs/results/confirm/runs/g/x-s2"
FINDINGS_DAMAGE = {   # how the root is damaged, what the line says after "findings.py: <root>/"
    "registration missing": (lambda r: (r / REGISTRATION).unlink(), f"{REGISTRATION} does not exist"),
    "claims not TOML": (lambda r: _edit(r / CLAIMS_FILE, "alpha = 0.05", "alpha = "),
                        f"{CLAIMS_FILE} is not valid TOML (Invalid value (at line 2, column 9))"),
    "alpha a string": (lambda r: _edit(r / CLAIMS_FILE, "alpha = 0.05", 'alpha = "0.05"'),
                       f"{CLAIMS_FILE}: [rules]: alpha must be a finite number, not '0.05'"),
    "seeds of names": (lambda r: _edit(r / CLAIMS_FILE, "three = [1, 2, 3]", 'three = ["a"]'),
                       f"{CLAIMS_FILE}: [seeds]: three must be a list of integer seeds, not ['a']"),
    "claim without direction": (lambda r: _edit(r / CLAIMS_FILE, "direction = 1\n", ""),
                                f"{CLAIMS_FILE}: claim 1 (X1): direction is missing; it must be -1, 0 or 1"),
    "claim of unknown seeds": (lambda r: _edit(r / CLAIMS_FILE, 'seeds = "three"', 'seeds = "four"'),
                               f"{CLAIMS_FILE}: claim 1 (X1): seeds must be the name of a seed list in [seeds] "
                               "(three), not 'four'"),
    "descriptive a directory": (lambda r: ((r / "experiments/confirm/descriptive.toml").unlink(),
                                           (r / "experiments/confirm/descriptive.toml").mkdir()),
                                "experiments/confirm/descriptive.toml is a directory, not a file"),
    "config truncated": (lambda r: (r / RUN / "config.json").write_text('{"algorithm": {"name": "x"'),
                         f"{RUN}/config.json is not valid JSON (Expecting ',' delimiter: line 1 column 27 (char 26))"),
    "summary long number": (lambda r: (r / RUN / "summary.json").write_text('{"final_test_acc": ' + LONG + "}"),
                            f"{RUN}/summary.json is not valid JSON ({SAID}: line 1 column 20 (char 19))"),
    "summary accuracy a string": (lambda r: _edit(r / RUN / "summary.json", "0.93", '"high"'),
                                  f"{RUN}/summary.json: final_test_acc is 'high', not a number"),
    "probes bad line": (lambda r: (r / RUN / "probes.jsonl").write_text('{"tau": 1}\n{"tau": \n'),
                        f"{RUN}/probes.jsonl line 2 is not valid JSON (Expecting value)"),
    "two runs of one seed": (lambda r: shutil.copytree(r / RUN, r / f"{RUN}-again"),
                             "2 runs in docs/results/confirm/runs/g match"),
}


def test_the_undamaged_root_renders(root, tmp_path):
    assert findings.main(["--root", str(root), "--out", str(tmp_path / "F.md")]) == 0
    assert "| X1 |" in (tmp_path / "F.md").read_text()


@pytest.mark.parametrize("kind", FINDINGS_DAMAGE)
def test_findings_explains_a_damaged_input_in_one_line_and_exits_2(root, tmp_path, capsys, kind):
    damage, said = FINDINGS_DAMAGE[kind]
    damage(root)
    out = tmp_path / "F.md"
    assert findings.main(["--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("findings.py: ") and said in err, err
    assert not out.exists()


# ---- experiments/speed.py -----------------------------------------------------------------------------------
def test_speed_explains_a_damaged_collected_file_or_plan_in_one_line_and_exits_2(tmp_path, capsys, monkeypatch):
    good = {"name": "r", "options": {}, "curve": [[0, 0, 0.0, 0.0, 0.1, 0.1]], "summary": {}}
    (tmp_path / "select.jsonl").write_text(json.dumps(good) + "\n" + '{"name": "s", "curve": [[1, 2]]}\n')
    with pytest.raises(speed.Damaged, match=r"select.jsonl: record 2 is not a collected run"):
        speed.read_runs("select", tmp_path)
    (tmp_path / "select.jsonl").write_text(json.dumps(good) + "\n" + "{\n")
    with pytest.raises(speed.Damaged, match=r"select.jsonl line 2 is not valid JSON"):
        speed.read_runs("select", tmp_path)
    monkeypatch.setattr(speed, "PLAN", tmp_path / "plan.toml")
    monkeypatch.setattr(speed.load_plan, "__defaults__", (tmp_path / "plan.toml",))
    os.mkfifo(tmp_path / "plan.toml")   # a FIFO: refused, never waited on
    assert speed.main(["selection"]) == 2
    err = capsys.readouterr().err
    assert err == f"speed.py: {tmp_path / 'plan.toml'} is a FIFO (named pipe), not a regular file\n"


def test_speed_collect_refuses_a_run_whose_metrics_are_damaged(tmp_path, monkeypatch, capsys):
    run = {"name": "r1", "options": {}}
    monkeypatch.setattr(speed, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(speed, "COLLECTED", tmp_path / "collected")
    monkeypatch.setattr(speed, "load_plan", lambda: {})
    monkeypatch.setattr(speed, "prepare", lambda plan: plan)
    monkeypatch.setattr(speed, "runs_of", lambda stage, plan, selected: [run])
    d = tmp_path / "runs" / "select" / "r1"
    d.mkdir(parents=True)
    (d / "summary.json").write_text('{"final_test_acc": 0.5}')
    (d / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": ' + LONG + "}\n")
    assert speed.main(["collect", "select"]) == 2
    assert capsys.readouterr().err == f"speed.py: {d / 'metrics.jsonl'} line 2 is not valid JSON ({SAID})\n"
    assert not (tmp_path / "collected").exists()

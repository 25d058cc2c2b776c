"""Issue 44 item 2 (its first part): the files a run reads are regular and bounded. ``--config`` and
``config.json`` on ``--resume`` go through ``run.files.read_text``: /dev/zero, a FIFO and a file past the limit
are refused at once, with one line, exit 2, and nothing written (before: /dev/zero read without bound)."""
import json
import os
import subprocess
import sys
import time

import pytest

from stalegrad.cli import main
from stalegrad.run.files import CONFIG_LIMIT


def run_cli(args, timeout=20):
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "stalegrad", *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "big", "missing"])
def test_a_config_that_is_no_bounded_regular_file_is_one_line_at_once(tmp_path, kind):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "f"), "big": str(tmp_path / "big.toml"),
            "missing": str(tmp_path / "none.toml")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "big":
        with open(path, "w") as f:
            f.write("# " + "x" * CONFIG_LIMIT + "\n")
    p, seconds = run_cli(["train", "--config", path, "--out", str(tmp_path / "run"), "-q"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and seconds < 15
    assert {"/dev/zero": "is a character device", "fifo": "is a FIFO", "big": "more than the 1 MiB",
            "missing": "does not exist"}[kind] in p.stderr
    assert "give a TOML file of options" in p.stderr
    assert not (tmp_path / "run").exists()


def test_a_resumed_config_json_past_the_limit_or_a_fifo_is_refused_and_nothing_changes(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "synthetic", "--model", "logreg", "--epochs", "0.2", "--checkpoint-every",
                 "2", "--out", str(out), "-q"]) == 0
    before = {f: (out / f).read_bytes() for f in ("summary.json", "metrics.jsonl")}
    config = out / "config.json"
    text = config.read_text()
    config.write_text(text[:-2] + " " * CONFIG_LIMIT + text[-2:])   # still valid JSON, past the limit
    p, _ = run_cli(["train", "--resume", str(out), "--epochs", "0.4", "-q"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "config.json is" in p.stderr
    assert "more than the 1 MiB" in p.stderr and "restore the file the run wrote" in p.stderr
    config.unlink()
    os.mkfifo(config)
    p, seconds = run_cli(["train", "--resume", str(out), "--epochs", "0.4", "-q"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and seconds < 15   # (the run directory's own check)
    assert "config.json is not a regular file" in p.stderr
    assert {f: (out / f).read_bytes() for f in before} == before
    json.loads(before["summary.json"])

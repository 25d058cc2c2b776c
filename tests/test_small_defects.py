"""Small promises kept: the local runtime refuses a script its workers cannot import in one line, the
simulator's default thread count is all the cores, no private name crosses a module, no docstring tells
history, Ray is reached through its public API where it has one."""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stalegrad"
# Not what stalegrad sets at import: each child starts as a user's shell would
ENV = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_CBWR", "ATEN_CPU_CAPABILITY")}


# ---- the local runtime and the script that started it ----------------------------------------------------
LOCAL_RUN = """\
import stalegrad as sg
train, test = sg.load_pair("digits")
result = sg.train("logreg", train, test, "asgd", workers=2, epochs=0.05, runtime=sg.LocalRuntime())
print("trained", result.summary["weights_sha256"][:12])
"""


def refused_in_one_line(p: subprocess.CompletedProcess, *words: str) -> None:
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith("stalegrad: error: the local runtime's workers import the script")
    assert "Traceback" not in p.stderr and "trained" not in p.stdout
    assert all(w in lines[0] for w in words), lines[0]


def test_a_script_read_from_standard_input_is_refused_in_one_line(tmp_path):
    script = f"{sys.executable} - <<'EOF'\n{LOCAL_RUN}EOF\n"
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    refused_in_one_line(p, "no file <stdin>", 'if __name__ == "__main__":', "stalegrad train --runtime local")


def test_a_script_without_a_main_guard_is_refused_in_one_line(tmp_path):
    (tmp_path / "unguarded.py").write_text(LOCAL_RUN)
    p = subprocess.run([sys.executable, "unguarded.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=300)
    refused_in_one_line(p, "unguarded.py", "at its line 3", 'if __name__ == "__main__":')


def test_python_c_has_no_script_to_import_and_runs(tmp_path):
    p = subprocess.run([sys.executable, "-c", LOCAL_RUN], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.fullmatch(r"trained [0-9a-f]{12}\n", p.stdout), p.stdout


@pytest.mark.parametrize("source, guarded", [
    ('if __name__ == "__main__":\n    run()\n', True),
    ("if '__main__' == __name__:\n    run()\n", True),
    ('if __name__ != "__main__":\n    pass\nelse:\n    run()\n', True),
    ('if __name__ == "__main__":\n    pass\nelse:\n    run()\n', False),   # the else runs in every worker
    ('if __name__ == "__main__":\n    def f():\n        pass\nrun()\n', False),
    ("run()\n", False),
])
def test_which_lines_a_worker_runs_again(source, guarded, monkeypatch):
    from stalegrad.runtimes.local import main_module
    tree = ast.parse(source)
    line = next(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call))
    safe = [body for node in ast.walk(tree) if isinstance(node, ast.If) for body in main_module.guarded(node)]
    assert any(b and b[0].lineno <= line <= b[-1].end_lineno for b in safe) is guarded


# ---- the simulator's threads without OMP_NUM_THREADS ---------------------------------------------------------
SIM_RUN = """\
import json
import stalegrad as sg
import torch
threads = torch.get_num_threads()
train, test = sg.load_pair("digits")
r = sg.train("mlp", train, test, "asgd", workers=4, epochs=0.3, batch_size=32, seed=3)
print(json.dumps([threads, r.summary["weights_sha256"], r.summary["threads_used"]]))
"""


def sim_run(**env) -> list:
    p = subprocess.run([sys.executable, "-c", SIM_RUN], env={**ENV, **env}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_without_omp_num_threads_every_message_runs_at_all_the_cores():
    """A run shorter than the governor's first window (a second): with the variable unset it runs every
    message at the count torch starts with, as the variable set to that count does, with the same bits."""
    cores, sha, used = sim_run()
    assert used == {str(cores): sum(used.values())}
    assert sim_run(OMP_NUM_THREADS=str(cores)) == [cores, sha, used]


def governor(monkeypatch, stall, seconds_per_message):
    import torch

    from stalegrad import numerics
    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(numerics.time, "perf_counter", lambda: clock.t)
    threads = {"n": 4}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.update(n=n))
    gov = numerics.ThreadGovernor(None, trial_s=1.0, hold_s=10.0, stall=lambda: stall(clock.t))
    for _ in range(3000):
        clock.t += seconds_per_message[gov.current]
        gov.tick()
    return gov


def test_the_governor_keeps_all_the_cores_while_no_other_process_wants_them(monkeypatch):
    # one thread would be faster, but nothing waits for a core: it is never tried
    gov = governor(monkeypatch, lambda t: 0.1 * t, {1: 0.01, 2: 0.02, 4: 0.05})
    assert gov.messages == {4: 3000}


@pytest.mark.parametrize("stall", [lambda t: 0.5 * t, lambda t: None], ids=["contended", "unknown"])
def test_the_governor_measures_where_a_core_is_wanted_or_it_cannot_tell(monkeypatch, stall):
    gov = governor(monkeypatch, stall, {1: 0.01, 2: 0.02, 4: 0.05})
    assert set(gov.messages) == {1, 2, 4} and gov.messages[1] > 0.8 * 3000


# ---- the package's own text and names --------------------------------------------------------------------------
def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_another_modules_private_name():
    crossing = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("stalegrad")):
                crossing += [f"{path.relative_to(PACKAGE)}:{node.lineno} {a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")
                             and a.name != "_numba_kernels"]   # a private module, imported by its package
    assert not crossing, crossing


def test_no_docstring_or_comment_tells_the_projects_history():
    told = [f"{path.relative_to(PACKAGE)}:{i}" for path in modules()
            for i, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bissues? \d", line)]
    assert not told, told


def test_the_session_logs_come_from_rays_public_runtime_context(tmp_path):
    from stalegrad.runtimes.ray.connect import session_logs
    (tmp_path / "session_7" / "logs").mkdir(parents=True)
    context = SimpleNamespace(get_temp_dir=lambda: str(tmp_path), get_session_name=lambda: "session_7")
    assert session_logs(SimpleNamespace(get_runtime_context=lambda: context)) == str(tmp_path / "session_7" / "logs")
    assert session_logs(SimpleNamespace()) is None   # a Ray without that API: no logs directory, no error


def test_rays_error_printer_is_replaced_and_put_back():
    pytest.importorskip("ray")
    from ray._private import worker

    from stalegrad.runtimes.ray.connect import divert_ray_errors
    original = worker.print_to_stdstream
    restore = divert_ray_errors(None)
    try:
        assert worker.print_to_stdstream is not original
        worker.print_to_stdstream({"lines": ["(raylet) A worker died"], "pid": "raylet"}, ignore_prefix=False)
    finally:
        restore()
    assert worker.print_to_stdstream is original


def test_rays_error_printer_that_moved_is_left_alone(monkeypatch):
    pytest.importorskip("ray")
    from ray._private import worker

    from stalegrad.runtimes.ray import connect
    monkeypatch.delattr(worker, "print_to_stdstream")
    restore = connect.replace_ray_error_printer(lambda data, ignore_prefix=False: None)
    assert not hasattr(worker, "print_to_stdstream")
    restore()


def test_a_run_whose_budget_ends_before_its_first_update_says_so(tmp_path):
    """easgd's round needs every worker's 10 local steps: 4 workers on 2 epochs of digits' 12 batches never
    complete one, and the weights stay the initial ones. Such a run exits 0 (its files are right) with one
    warning line; a run that updated gets none."""
    from click.testing import CliRunner
    from stalegrad.cli import cli as main
    common = ["--workers", "4", "--dataset", "digits", "--model", "logreg", "--quiet", "--overwrite"]
    idle = CliRunner().invoke(main, ["train", "--algo", "easgd", "--epochs", "2", "--out", str(tmp_path / "a"), *common])
    assert idle.exit_code == 0, idle.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["updates"] == 0 and summary["samples"] > 0
    warnings = [line for line in idle.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "before the first update" in warnings[0] and "--epochs" in warnings[0]
    busy = CliRunner().invoke(main, ["train", "--algo", "asgd", "--epochs", "0.2", "--out", str(tmp_path / "b"), *common])
    assert busy.exit_code == 0 and "warning" not in busy.stderr

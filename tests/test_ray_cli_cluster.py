"""A real cluster started with the ``ray`` command line, as docs/cluster.md tells a user to: token
authentication, a head that runs the driver and the server shard (``--num-cpus 0``) and a node that
joins it with the CPUs of the workers; then ``stalegrad train --address`` as a subprocess.

The joining node cannot read the data set (a ``sitecustomize`` on its PYTHONPATH refuses to open
scikit-learn's digits file), so the run shows that the driver sends the data through Ray's object
store and a worker node needs none on disk. The cluster is stopped in the fixture, always.

Marked ``cluster`` (1 to 3 minutes on the 2-core machine): ``pytest -m "not cluster"`` leaves it out.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'ray>=2.9'); "
                                        "the Ray runtime's tests need it")

from stalegrad.runtimes.ray.connect import probe  # noqa: E402
from helpers import ray_head_ip, ray_started  # noqa: E402

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ray start on Linux")]
RAY = str(Path(sys.executable).with_name("ray"))
ROOT = Path(__file__).resolve().parents[1]
GUARD = textwrap.dedent("""
    # On this node no process may read the data set; the marker says which processes ran guarded.
    import builtins, io, os, sys
    _open = builtins.open
    def _guarded(file, *args, **kw):
        if "digits.csv" in str(file):
            raise PermissionError(f"no data set on this node: {file}")
        return _open(file, *args, **kw)
    builtins.open = io.open = _guarded
    try:
        with _open(os.path.join(os.environ["GUARD_MARKS"], str(os.getpid())), "w") as f:
            f.write(" ".join(sys.argv))
    except (KeyError, OSError):
        pass
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """`ray start --block` stops its Ray processes on SIGTERM; the session's group is killed after."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # whatever of the session is left
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def cluster():
    base = Path(tempfile.mkdtemp(prefix="sgray"))   # short: Ray's socket paths live under --temp-dir
    home, marks, guard = base / "home", base / "marks", base / "guard"
    for d in (home, marks, guard):
        d.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_AUTH_MODE="token")
    # the guide's faster node-death detection, set where the head starts (a check a second, dead after 3)
    head_env = dict(env, RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3")
    # the guide's steps: a token (mode 600), the head, a node that joins with the workers' CPUs
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    token = home / ".ray" / "auth_token"
    token.chmod(0o600)
    port, procs = free_port(), []
    try:
        head_log = open(base / "head.log", "w")
        procs.append(subprocess.Popen(
            [RAY, "start", "--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard=false",
             "--disable-usage-stats", "--temp-dir", str(base / "t"), "--block"],
            env=head_env, stdout=head_log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 90
        ip = ray_head_ip(base / "head.log", procs[0], deadline)
        address = f"{ip}:{port}"
        node_env = dict(env, PYTHONPATH=str(guard), GUARD_MARKS=str(marks))
        procs.append(subprocess.Popen(
            [RAY, "start", "--address", address, "--num-cpus", "2", "--disable-usage-stats", "--block"],
            env=node_env, stdout=open(base / "node.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
        ray_started(base / "node.log", procs[1], deadline)   # the node has joined (a file read, not a probe a second)
        old = os.environ.get("RAY_AUTH_MODE"), os.environ.get("HOME")
        os.environ.update(RAY_AUTH_MODE="token", HOME=str(home))   # for probe() in this process
        try:
            assert len(probe(address, timeout=30)["nodes"]) == 2, (base / "node.log").read_text()[-2000:]
        finally:
            for k, v in zip(("RAY_AUTH_MODE", "HOME"), old):
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        yield {"address": address, "env": env, "marks": marks, "guard": guard, "base": base}
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(base, ignore_errors=True)


def stalegrad(cluster, tmp_path, *args, env=None):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "stalegrad", "train", "--runtime", "ray", "--address",
                           cluster["address"], "--dataset", "digits", "--model", "logreg", "--batch-size", "32",
                           "--out", str(out), "-q", *args], env=env or cluster["env"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return proc, out


def test_the_guides_cluster_trains_and_its_worker_node_needs_no_data_set(cluster, tmp_path):
    # the guard itself: on the node's PYTHONPATH, digits cannot be read
    check = subprocess.run([sys.executable, "-c", "from sklearn.datasets import load_digits; load_digits()"],
                           env=dict(cluster["env"], PYTHONPATH=str(cluster["guard"])), capture_output=True, text=True)
    assert check.returncode != 0 and "no data set on this node" in check.stderr
    proc, out = stalegrad(cluster, tmp_path, "--workers", "2", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] > 0 and summary["workers_lost"] == 0 and summary["samples"] >= 1437
    assert summary["final_test_acc"] > 0.3
    # both workers ran on the guarded node (the head offers no CPU), in guarded processes
    ran = [p.read_text() for p in cluster["marks"].iterdir()]
    assert any("default_worker" in r for r in ran), ran
    assert not [ln for ln in proc.stderr.splitlines() if ln.strip()], proc.stderr   # -q: nothing else to say


def test_a_cluster_too_small_and_a_missing_auth_mode_are_one_line_and_write_nothing(cluster, tmp_path):
    proc, out = stalegrad(cluster, tmp_path, "--workers", "3", "--epochs", "0.1")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--workers is 3, but the Ray cluster at" in proc.stderr and "can place 2 at a time" in proc.stderr
    assert ("CPU 0 + 2" in proc.stderr or "CPU 2 + 0" in proc.stderr) and not out.exists()   # (nodes in any order)
    t0 = time.monotonic()
    env = {k: v for k, v in cluster["env"].items() if k != "RAY_AUTH_MODE"}
    proc, out = stalegrad(cluster, tmp_path, "--workers", "2", "--epochs", "0.1", env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "refused this machine's token (RAY_AUTH_MODE is not set here)" in proc.stderr
    assert "set RAY_AUTH_MODE=token" in proc.stderr and "~/.ray/auth_token" in proc.stderr
    assert time.monotonic() - t0 < 60 and not out.exists()


EPOCHS = 200   # ~0.1 s each through the shard's socket (0.3 s as Ray calls with one node gone, when it was 60)


def test_a_node_killed_mid_run_costs_one_line_of_ours_and_none_of_rays(cluster, tmp_path):
    # a third node with one worker; the node dies (kill -9 of its raylet and every process of its session,
    # as when its machine fails) once the run has evaluated twice
    log = open(cluster["base"] / "node_c.log", "w")
    node_c = subprocess.Popen([RAY, "start", "--address", cluster["address"], "--num-cpus", "1",
                               "--disable-usage-stats", "--block"], env=cluster["env"], stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    out = tmp_path / "run"
    try:
        deadline = time.monotonic() + 120
        ray_started(cluster["base"] / "node_c.log", node_c, deadline)   # node c has joined
        raylet = subprocess.run(["pgrep", "-P", str(node_c.pid), "-f", "raylet"], capture_output=True,
                                text=True).stdout.split()
        assert raylet, (cluster["base"] / "node_c.log").read_text()
        env = dict(cluster["env"])
        while time.monotonic() < deadline:   # until the cluster counts node c's CPU (at once, as a rule)
            check = subprocess.run([RAY, "status", "--address", cluster["address"]], env=env, capture_output=True,
                                   text=True, timeout=60)
            if "/3.0 CPU" in check.stdout:
                break
            time.sleep(1)
        # the run must outlast Ray's notice of the dead node (~3 s) by a wide margin: at 12 epochs it ended
        # ~3 s after the kill, and a run whose budget is spent first drops the dead worker's call unseen
        run = subprocess.Popen([sys.executable, "-m", "stalegrad", "train", "--runtime", "ray", "--address",
                                cluster["address"], "--dataset", "digits", "--model", "logreg", "--workers", "3",
                                "--batch-size", "16", "--epochs", str(EPOCHS), "--eval-every", "0.5", "--out", str(out)],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            metrics = out / "metrics.jsonl"
            while time.monotonic() < deadline + 120 and run.poll() is None and (
                    not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
                time.sleep(0.2)
            assert run.poll() is None, run.communicate()
            os.killpg(node_c.pid, signal.SIGKILL)
            stdout, stderr = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    finally:
        stop(node_c)
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers_lost"] == 1 and summary["samples"] >= EPOCHS * 1437
    wall = [json.loads(ln)["wall_s"] for ln in (out / "messages.jsonl").read_text().splitlines()]
    hole = max(b - a for a, b in zip(wall, wall[1:]))
    assert hole < 12, f"the lost node stalled the run {hole:.1f} s (Ray's health check at 1 s x 3 should see it)"
    ours = [ln for ln in stderr.splitlines() if ln.startswith("stalegrad: worker")]
    assert len(ours) == 1 and "not replaced (no room in the cluster)" in ours[0], stderr
    rays = [ln for ln in (stdout + stderr).splitlines()
            if "(raylet)" in ln or "Raylet is terminated" in ln or "Last 20 lines" in ln or "A worker died" in ln]
    assert rays == [], stdout + stderr

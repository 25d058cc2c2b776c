"""``stalegrad grid FILE --address``: a grid's cells as Ray tasks on a real cluster started with the
``ray`` command line, as docs/cluster.md ("Grids on a cluster") tells a user to: token authentication,
a head with ``--num-cpus 0`` and a node B with 2 CPUs; in one test a node C joins and is killed.

The grid is small (digits, logreg, a fifth of an epoch) with a [protocol] table, so the cluster runs
both stages; every run must end with the bits of the same grid run here without --address.
A cell's child on a node is found by its session: `ray start --block` starts the node's processes
in the session of its own pid (Ray's workers each get a process group of their own, not a session).

Marked ``cluster`` (minutes: on the 2-core machine loaded by other work, a niced head took over 6 minutes
to start): ``pytest -m "not cluster"`` leaves it out.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'ray>=2.9')")

from stalegrad.study.grid_ray import capacity, install, version_problem  # noqa: E402

from stalegrad.runtimes.ray.connect import probe  # noqa: E402
from helpers import descendants, ray_head_ip, ray_started  # noqa: E402
from test_ray_cli_cluster import RAY, ROOT, free_port, stop  # noqa: E402

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ray start on Linux")]
FIXED = ('[fixed]\ndataset = "digits"\nmodel = "logreg"\nepochs = 0.2\nbatch_size = 32\nval_split = 200\n'
         '[axes]\nalgos = ["asgd"]\nworkers = [2]\nlr = [0.05, 0.1]\n')
# stage 1: lr x seeds 0, 1 (4 cells); stage 2: seed 2 of the selected lr only (1 of 2 cells)
PROTOCOL = FIXED + 'seeds = [0, 1, 2]\n[protocol]\nselect_seeds = [0, 1]\nreport_seeds = [2]\n'
PLAIN = FIXED + 'seeds = [0, 1]\n'       # the 4 cells of stage 1, every one run
RAY_LINES = re.compile(r"\(raylet\)|Raylet is terminated|Last 20 lines|A worker died|core_worker|WARNING|INFO")


@pytest.fixture(scope="module")
def cluster():
    """The guide's steps (as tests/test_ray_cli_cluster.py takes them): a token, a head with no CPU for
    cells and Ray's faster node-death check, node B with 2 CPUs; stopped always."""
    base = Path(tempfile.mkdtemp(prefix="sggrid"))   # short: Ray's socket paths live under --temp-dir
    (base / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # (RAY_raylet_start_wait_time_s: a niced head on the loaded 2-core machine failed Ray's 60 s wait for its raylet)
    env.update(HOME=str(base / "home"), RAY_AUTH_MODE="token", RAY_raylet_start_wait_time_s="600")
    head_env = dict(env, RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3")
    port, procs = free_port(), []
    try:
        # (on the loaded machine the command was seen to hang at exit after writing the token: wait for the file)
        token, gen = base / "home" / ".ray" / "auth_token", subprocess.Popen(
            [RAY, "get-auth-token", "--generate"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while gen.poll() is None and not token.is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        if gen.poll() is None:
            gen.kill()
        gen.wait()
        token.chmod(0o600)
        procs.append(subprocess.Popen(
            [RAY, "start", "--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard=false",
             "--disable-usage-stats", "--temp-dir", str(base / "t"), "--block"],
            env=head_env, stdout=open(base / "head.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 400   # (minutes under the load of other work, niced)
        ip = ray_head_ip(base / "head.log", procs[0], deadline)
        address = f"{ip}:{port}"
        procs.append(subprocess.Popen(
            [RAY, "start", "--address", address, "--num-cpus", "2", "--disable-usage-stats", "--block"],
            env=env, stdout=open(base / "node.log", "w"), stderr=subprocess.STDOUT, start_new_session=True))
        ray_started(base / "node.log", procs[1], deadline)   # node B has joined (a file read, not a probe a second)
        old = os.environ.get("RAY_AUTH_MODE"), os.environ.get("HOME")
        os.environ.update(RAY_AUTH_MODE="token", HOME=str(base / "home"))   # for probe() in this process
        try:
            assert len(probe(address, timeout=30)["nodes"]) == 2, (base / "node.log").read_text()[-2000:]
        finally:
            for k, v in zip(("RAY_AUTH_MODE", "HOME"), old):
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        yield {"address": address, "env": env, "base": base, "node_b": procs[1]}
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(base, ignore_errors=True)


def grid(*args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "stalegrad", "grid", *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def records(out: Path) -> dict:
    return {r["name"]: r for r in json.loads((out / "grid.json").read_text())["cells"]}


def hashes(out: Path) -> dict:
    return {d.name: json.loads((d / "summary.json").read_text())["weights_sha256"]
            for d in (out / "runs").iterdir() if (d / "summary.json").is_file()}


def cell_children(node: int) -> list[str]:
    """The command lines of the cells' `stalegrad train` children that descend from ``node``, the pid of
    a node's `ray start --block` (its raylet's parent; Ray's workers need not stay in its session)."""
    below = set(descendants(node))
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    return [a for pid, _, a in (ln.strip().partition(" ") for ln in ps)
            if int(pid) in below and "stalegrad-cell-" in a and "train" in a]


def session_of(proc: subprocess.Popen) -> int:
    return proc.pid   # the node's `ray start --block`: its raylet, and the raylet's workers, descend from it


@pytest.fixture(scope="module")
def local(tmp_path_factory, cluster):
    """The same grid file run here without --address (nothing of Ray is used), by this process: its
    cells run in subprocesses as the cluster's do, but the grid itself needs no interpreter of its own."""
    from stalegrad.cli import main
    base = tmp_path_factory.mktemp("local")
    (base / "g.toml").write_text(PROTOCOL)
    code = main(["grid", str(base / "g.toml"), "--out", str(base / "out"), "--jobs", "2", "--no-report"])
    assert code == 0, [(p.name, p.read_text()[-500:]) for p in (base / "out" / "logs").glob("*.log")]
    return {"out": base / "out", "hashes": hashes(base / "out"), "records": records(base / "out")}


def test_a_grid_on_the_cluster_stops_on_ctrl_c_resumes_and_equals_the_local_grid(cluster, local, tmp_path):
    (tmp_path / "g.toml").write_text(PROTOCOL)
    out, env = tmp_path / "out", cluster["env"]
    cmd = [sys.executable, "-m", "stalegrad", "grid", str(tmp_path / "g.toml"), "--out", str(out), "--address",
           cluster["address"], "--connect-timeout", "120", "--no-report"]
    # 1. Ctrl-C once a cell runs on node B: exit 130, the cells interrupted, no run left on the node
    run = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    session, deadline = session_of(cluster["node_b"]), time.monotonic() + 400
    seen = set()
    while not cell_children(session) and run.poll() is None and time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,pgid=,args="], capture_output=True, text=True).stdout
        seen |= {ln[:200] for ln in ps.splitlines() if "stalegrad-cell" in ln or "ray::" in ln}
        time.sleep(0.2)
    assert run.poll() is None and cell_children(session), (session, sorted(seen), run.communicate())
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    assert "grid: interrupted:" in err and "on the Ray cluster at " + cluster["address"] in err
    status = [r["status"] for r in records(out).values()]
    assert "interrupted" in status and "done" not in status, status
    deadline = time.monotonic() + 20     # each task's run got SIGINT from its task (or its orphan watch)
    while cell_children(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cell_children(session) == []
    # 2. the same command finishes both stages, with the bits of the local grid
    proc = grid(*cmd[4:], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "stage 2 of 2 (the reporting seeds of the 1 selected settings)" in proc.stderr
    assert {n: r["status"] for n, r in records(out).items()} == {n: r["status"] for n, r in local["records"].items()}
    assert sorted(r["status"] for r in records(out).values()) == ["done"] * 5 + ["not selected"]
    assert hashes(out) == local["hashes"] and len(hashes(out)) == 5
    assert all((out / "logs" / f"{n}.log").is_file() for n in hashes(out))
    assert json.loads((out / "grid.json").read_text())["cpus_per_cell"] == 1
    assert not [ln for ln in proc.stderr.splitlines() if not ln.startswith("grid: ") or RAY_LINES.search(ln)], \
        proc.stderr     # progress lines only: nothing of Ray's
    assert "grid: 6 cells: 5 run, 0 skipped (already done), 1 not selected (stage 2), none failed" in proc.stdout
    # 3. a rerun skips every cell and writes the report
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    proc = grid(*cmd[4:-1], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "0 run, 5 skipped" in proc.stdout and (out / "report" / "report.md").is_file()
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == mtimes


def test_a_node_killed_mid_grid_costs_no_cell(cluster, local, tmp_path):
    env = cluster["env"]
    log = open(cluster["base"] / "node_c_grid.log", "w")
    node_c = subprocess.Popen([RAY, "start", "--address", cluster["address"], "--num-cpus", "2",
                               "--disable-usage-stats", "--block"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    out, killed = tmp_path / "out", []
    (tmp_path / "g.toml").write_text(PLAIN)
    try:
        deadline = time.monotonic() + 300
        ray_started(cluster["base"] / "node_c_grid.log", node_c, deadline)   # node C has joined
        while time.monotonic() < deadline:   # until the cluster counts node C's CPUs (at once, as a rule)
            status = subprocess.run([RAY, "status", "--address", cluster["address"]], env=env, capture_output=True,
                                    text=True, timeout=60).stdout
            if "/4.0 CPU" in status:
                break
            time.sleep(1)
        else:
            pytest.fail((cluster["base"] / "node_c_grid.log").read_text()[-2000:])
        # 4 cells on 4 CPUs at once: 2 on node B, 2 on node C, which dies once one of them runs
        run = subprocess.Popen([sys.executable, "-m", "stalegrad", "grid", str(tmp_path / "g.toml"), "--out",
                                str(out), "--address", cluster["address"], "--connect-timeout", "120", "--no-report"],
                               env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while not (killed := cell_children(session_of(node_c))) and run.poll() is None and \
                    time.monotonic() < deadline + 400:
                time.sleep(0.2)
            assert killed and run.poll() is None, run.communicate()
            os.killpg(node_c.pid, signal.SIGKILL)    # its raylet and agents; its workers and runs must follow
            stdout, stderr = run.communicate(timeout=400)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert cell_children(session_of(node_c)) == []      # no run of the dead node computes on, unseen
    finally:
        stop(node_c)
    assert run.returncode == 0, stderr
    assert "4 cells at once" in stderr
    assert {r["status"] for r in records(out).values()} == {"done"}
    lost = {re.search(r"stalegrad-cell-(.+?-s\d)-", a).group(1) for a in killed}
    assert lost and lost <= set(records(out))
    assert hashes(out) == {n: h for n, h in local["hashes"].items() if n in records(out)}   # lost ones too
    assert not [ln for ln in (stdout + stderr).splitlines() if RAY_LINES.search(ln)], stdout + stderr
    assert "grid: 4 cells: 4 run, 0 skipped (already done), none failed" in stdout


def test_a_bad_address_a_cluster_too_small_and_no_data_on_the_nodes(cluster, tmp_path):
    (tmp_path / "g.toml").write_text(PLAIN)
    out, env = tmp_path / "out", cluster["env"]
    # the same line as `stalegrad train --runtime ray --address`, and nothing written
    proc = grid(tmp_path / "g.toml", "--out", out, "--address", "127.0.0.1:1", env=env)
    train = subprocess.run([sys.executable, "-m", "stalegrad", "train", "--runtime", "ray", "--address", "127.0.0.1:1",
                            "--dataset", "digits", "--out", str(tmp_path / "t")], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert proc.returncode == train.returncode == 2 and proc.stderr == train.stderr, (proc.stderr, train.stderr)
    assert proc.stderr.count("\n") == 1 and "connection refused" in proc.stderr and not out.exists()
    proc = grid(tmp_path / "g.toml", "--out", out, "--address", cluster["address"], "--cpus-per-cell", "3",
                "--connect-timeout", "120", env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--cpus-per-cell is 3, but no node of the Ray cluster at" in proc.stderr
    assert ("CPU 0 + 2" in proc.stderr or "CPU 2 + 0" in proc.stderr) and "--cpus-per-cell 2 or less" in proc.stderr
    assert not out.exists()
    # a data set that is not on the node: the cell fails with the train command's own line, the grid goes on
    (tmp_path / "m.toml").write_text('[fixed]\ndataset = "mnist"\nmodel = "logreg"\ndata_dir = "/nonexistent-sg"\n'
                                     '[axes]\nalgos = ["asgd"]\nseeds = [0]\n')
    proc = grid(tmp_path / "m.toml", "--out", out, "--address", cluster["address"], "--connect-timeout", "120",
                env=env)
    assert proc.returncode == 0, proc.stderr
    rec = records(out)["asgd-s0"]
    assert rec["status"] == "failed" and rec["exit_code"] == 2
    assert rec["reason"].startswith("stalegrad: error: mnist: no data found in /nonexistent-sg")
    assert "grid: note: mnist is not on this machine" in proc.stderr and "1 failed" in proc.stdout


# ---- without a cluster ------------------------------------------------------------------------------
def test_capacity_versions_and_install(tmp_path):
    nodes = [{"resources": {"CPU": 0.0}}, {"resources": {"CPU": 5.0}}, {"resources": {"CPU": 2.0}}]
    assert capacity(nodes, 1) == 7 and capacity(nodes, 2) == 3 and capacity(nodes, 6) == 0
    ours = __import__("stalegrad").__version__
    assert version_problem("h:1", [{"stalegrad": ours, "ip": "a"}]) is None
    line = version_problem("h:1", [{"stalegrad": ours, "ip": "a"}, {"stalegrad": "0.1.0", "ip": "b"}])
    assert line.startswith("--address h:1: node b runs stalegrad 0.1.0, this machine " + ours)
    # a cell's tar replaces its unfinished run directory in one rename, and its log
    import io
    import tarfile
    src = tmp_path / "src"
    (src / "run").mkdir(parents=True)
    (src / "run" / "summary.json").write_text("{}")
    (src / "cell.log").write_text("log\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src / "cell.log", arcname="cell.log")
        tar.add(src / "run", arcname="run")
    out = tmp_path / "out"
    for sub in ("runs/c/old", "logs"):
        (out / sub).mkdir(parents=True)
    install(out, "c", buf.getvalue())
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["c"]      # no staging left
    assert [p.name for p in (out / "runs" / "c").iterdir()] == ["summary.json"]
    assert (out / "logs" / "c.log").read_text() == "log\n"


def test_cluster_options_without_a_cluster_are_one_line(tmp_path):
    (tmp_path / "g.toml").write_text(PLAIN)
    for args, words in ((["--cpus-per-cell", "2"], "--cpus-per-cell needs --address (a grid on a Ray cluster)"),
                        (["--address", "ray://h:1"], "Ray Client addresses (ray://) are not supported"),
                        (["--address", "h:1", "--tensorboard", str(tmp_path / "tb")], "--tensorboard is not available")):
        proc = grid(tmp_path / "g.toml", "--out", tmp_path / "out", *args, env=dict(os.environ))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
        assert not (tmp_path / "out").exists()

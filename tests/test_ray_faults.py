"""Faults under the Ray runtime: Ctrl-C on the driver, a worker's node lost, a server shard killed.

Ctrl-C runs a driver in a subprocess with a Ray of its own. The other two run on a
``ray.cluster_utils.Cluster`` (several Ray nodes on this machine), started once for the module
after any other Ray session of this process is shut down.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'ray>=2.9'); "
                                        "the Ray runtime's tests need it")
from ray.cluster_utils import Cluster  # noqa: E402

import stalegrad as sg  # noqa: E402
from stalegrad.runtimes import RayRuntime  # noqa: E402

from helpers import alive, blobs, descendants  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process checks read /proc")

TRAIN, TEST = blobs(n=512, seed=0), blobs(n=128, seed=1)
RAY_PROCESSES = "raylet|gcs_server|ray::"


def pgrep(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()} - {os.getpid()}


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def left(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


# ---- Ctrl-C ------------------------------------------------------------------------------------
DRIVER = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, "tests")
    if sys.argv[1] == "SIG_DFL":   # as an embedding host may leave it: Ctrl-C would kill the driver at once
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    import stalegrad as sg
    from helpers import blobs

    def started(record):
        if record["epoch"] > 0:
            print("training", flush=True)
    try:
        sg.train("mlp", blobs(seed=0), blobs(n=128, seed=1), "asgd", 2, sg.RayRuntime(), epochs=100000,
                 batch_size=8, eval_every=0.5, on_eval=started)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
""")


@pytest.mark.parametrize("handler", ["python", "SIG_DFL"])
def test_ctrl_c_on_the_driver_leaves_no_process_and_no_shared_memory(handler):
    ray_before, shm_before = pgrep(RAY_PROCESSES), set(os.listdir("/dev/shm"))
    # RAY_AUTH_MODE unset, as a user's is: Ray then turns tokens on itself and logs a notice (issue 33)
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}, "RAY_ADDRESS": ""}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, handler], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1], env=env)
    try:
        assert proc.stdout.readline().strip() == "training", proc.stderr.read()   # a run under way
        kids = descendants(proc.pid)   # gcs_server, raylet and, below it, the actors' workers
        assert pgrep(RAY_PROCESSES) - ray_before and set(kids) & pgrep(RAY_PROCESSES)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and took < 30, err
    # ours only: Ray's token-authentication notice at start-up goes to the session's logs
    assert [line for line in err.splitlines() if line.strip()] == ["interrupted"], err
    assert left(kids, timeout=10) == []
    # Ray processes that started meanwhile and were orphaned (a Ray of another test, running now,
    # has a live parent: not ours)
    new = pgrep(RAY_PROCESSES) - ray_before
    assert left([p for p in new if p in kids or parent(p) in (0, 1, None)], timeout=10) == []
    ours = {proc.pid, *kids}
    shm = [n for n in set(os.listdir("/dev/shm")) - shm_before
           if "ray" in n or "plasma" in n or any(str(p) in n for p in ours)]
    assert shm == []


# ---- a Ray cluster of several nodes on this machine -----------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    # the head runs the server shards ("ps") and one worker ("wk"); each added node one more worker
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"ps": 1, "wk": 1},
                                                      "include_dashboard": False})
    try:
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


PLACED = dict(worker_resources={"wk": 1}, shard_resources={"ps": 0.01})


def cluster_train(rt, algo="asgd", epochs=4.0, **kw):
    return sg.train("logreg", TRAIN, TEST, algo, 2, rt, epochs=epochs, batch_size=8, eval_every=0.25, **kw)


RAY_FAULT_LINES = ("Raylet is terminated", "(raylet)", "Last 20 lines", "A worker died", "Unhandled error")


@pytest.mark.parametrize("room", [False, True], ids=["lost", "replaced"])
def test_a_worker_node_dies_mid_run_and_the_run_completes(cluster, room, tmp_path, capfd):
    node_b = cluster.add_node(num_cpus=1, resources={"wk": 1})
    killed = []

    def kill_node_b(record):
        if record["epoch"] >= 1 and not killed:
            killed.append(record["samples"])
            cluster.remove_node(node_b)
            if room:   # another node offers a worker's place: the lost worker is replaced there
                cluster.add_node(num_cpus=1, resources={"wk": 1})

    # no room: the lost worker's samples go to the survivor at once, however long restart_timeout is
    rt = RayRuntime(restart_timeout=20.0 if room else 60.0, record_trace=tmp_path / "trace.csv", **PLACED)
    capfd.readouterr()
    try:
        res = cluster_train(rt, on_eval=kill_node_b)
        time.sleep(1.0)   # (Ray's error reports of the dead node arrive a little after the run)
    finally:
        for node in list(cluster.worker_nodes):
            cluster.remove_node(node)
    out, err = capfd.readouterr()
    # one line of ours per fault, none of Ray's (its reports go to the session's logs)
    assert not [line for line in (out + err).splitlines() if any(s in line for s in RAY_FAULT_LINES)], out + err
    assert len([line for line in err.splitlines() if line.startswith("stalegrad: worker")]) == 1, err
    times = [float(row.split(",")[3]) for row in (tmp_path / "trace.csv").read_text().splitlines()[1:]]
    hole = max(b - a for a, b in zip(times, times[1:]))   # the longest wait between two pushes, kill included
    if not room:
        assert hole < 10.0, hole   # it was restart_timeout (30 s by default) before
    s = res.summary
    assert killed and s["samples"] >= 4 * len(TRAIN.y) and torch.isfinite(res.weights).all()
    notes = " ".join(s["notes"])
    per = [w["updates"] for w in res.staleness["per_worker"]]
    if room:
        assert s["workers_lost"] == 0 and "a new one took its place" in notes, notes
        assert all(n > 0 for n in per)
    else:
        assert s["workers_lost"] == 1 and "not replaced (no room in the cluster)" in notes, notes
        lost = int(notes.split("worker ")[1].split()[0])
        assert f"samples now go to workers {1 - lost}" in notes
        assert per[1 - lost] > per[lost]   # the survivor went on alone
    assert s["final_test_acc"] > 0.9


class Exposed(RayRuntime):
    def make_driver(self, training, resume):
        self.driver = super().make_driver(training, resume)
        return self.driver


# one shard: the direct path (the workers call the shard), through its socket or as Ray calls
@pytest.mark.parametrize("shards, socket", [(2, True), (1, True), (1, False)])
def test_a_killed_server_shard_is_restarted_and_restored_from_the_checkpoint(cluster, tmp_path, shards, socket):
    path = tmp_path / "ck.pt"
    rt = Exposed(ps_shards=shards, shard_resources=PLACED["shard_resources"],   # both workers fit on the head
                 same_node_socket=socket)
    seen = {}

    def kill_a_shard(record):
        d = getattr(rt, "driver", None)   # (none yet at the evaluation of epoch 0)
        if seen or d is None or d.snapshot is None or d.sharded.version - int(d.snapshot[0]["version"]) < 3:
            return
        seen["checkpoint"] = int(torch.load(path, weights_only=True)["run"]["server"]["version"])
        seen["kill"] = d.sharded.version
        shard = d.shards[-1]
        pid, _ = ray.get(shard.ping.remote())
        ray.kill(shard, no_restart=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:   # until Ray has restarted it (a new, empty shard)
            try:
                new_pid, loaded = ray.get(shard.ping.remote(), timeout=30)
                if new_pid != pid and not loaded:
                    break
            except ray.exceptions.RayActorError:
                time.sleep(0.1)
        seen["restarted"] = new_pid != pid

    res = cluster_train(rt, epochs=3.0, checkpoint_every=10, checkpoint_path=path, on_eval=kill_a_shard)
    s = res.summary
    assert seen and seen["restarted"] and seen["kill"] > seen["checkpoint"]
    assert seen["checkpoint"] % 10 < 2   # due every 10 updates (and the other worker's message drained)
    if shards > 1:
        assert s["updates_lost"] == seen["kill"] - seen["checkpoint"] > 0
    else:   # the driver went on with the records it had read with that evaluation's (applied before the kill)
        assert s["updates_lost"] >= seen["kill"] - seen["checkpoint"] > 0
        assert s["transport"]["path"] == "direct"
        assert (s["transport"]["socket_calls"] > s["updates"]) == socket   # (the socket of the restarted shard too)
    assert f"went back to the checkpoint at update {seen['checkpoint']}" in " ".join(s["notes"])
    assert s["samples"] >= 3 * len(TRAIN.y) and torch.isfinite(res.weights).all()
    last = torch.load(path, weights_only=True)
    assert last["run"]["server"]["version"] == s["updates"]
    assert s["final_test_acc"] > 0.9


def test_a_shard_that_ray_does_not_restart_in_time_stops_the_run_and_names_the_fix():
    # mocked Ray: the shard never answers again (a real restart took 106 s on a loaded machine)
    from types import SimpleNamespace

    from stalegrad.errors import RunError
    from stalegrad.runtimes.ray.recovery import Recovery

    class Timeout(Exception):
        pass

    def never(refs, timeout):
        raise Timeout
    rec = Recovery()
    rec.snapshot, rec.rt = [{}], SimpleNamespace(restart_timeout=0.1)
    rec.ray = SimpleNamespace(get=never, exceptions=SimpleNamespace(RayActorError=RuntimeError, GetTimeoutError=Timeout))
    rec.shards = [SimpleNamespace(ping=SimpleNamespace(remote=object))]
    with pytest.raises(RunError, match=r"^a parameter-server shard died and was not restarted in 0.1 s; the run "
                                       r"stopped \(on a loaded machine Ray may take minutes: give --restart-timeout "
                                       r"SECONDS, e.g. 120\)$"):
        rec.restore_shards()

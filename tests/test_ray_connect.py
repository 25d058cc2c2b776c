"""Joining a Ray cluster is checked before a run writes anything: the address, the connection within
--connect-timeout, and whether the cluster can place the workers and shards (``runtimes/ray/connect.py``).

The checks against a real cluster started with the ``ray`` command line (token authentication, a
cluster too small) are in ``test_ray_cli_cluster.py``; these need no cluster.
"""
import socket
import threading
import time
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'ray>=2.9'); "
                                        "the Ray runtime's tests need it")

import stalegrad as sg  # noqa: E402
from stalegrad.cli import main  # noqa: E402
from stalegrad.errors import ConfigError  # noqa: E402
from stalegrad.runtimes import RayRuntime  # noqa: E402
from stalegrad.runtimes.ray import connect  # noqa: E402
from stalegrad.runtimes.ray.connect import placement_problem, split_address, wait_started  # noqa: E402

from helpers import TEST, TRAIN  # noqa: E402


@pytest.fixture(autouse=True)
def no_ray_session():
    if ray.is_initialized():   # another module's session: these tests check what a fresh process does
        ray.shutdown()


def node(**resources):
    return {"resources": {k: float(v) for k, v in resources.items()}}


CPU1 = {"CPU": 1.0, "GPU": 0.0}


# ---- placement, from the nodes' totals ---------------------------------------------------------
def test_the_old_guides_cluster_cannot_place_two_workers_and_says_what_is_short():
    # the guide's former set-up: a head with --num-cpus 0 and one node with 1 CPU
    nodes = [node(CPU=0, memory=1e9), node(CPU=1, memory=1e9)]
    p = placement_problem(nodes, 2, 1, CPU1, {})
    assert p == {"what": "workers", "placed": 1, "short": ["CPU"], "asks": "1 CPU", "offer": "CPU 0 + 1"}
    assert placement_problem(nodes, 1, 1, CPU1, {}) is None
    assert placement_problem(nodes + [node(CPU=1)], 2, 4, CPU1, {}) is None   # shards ask for nothing


def test_placement_counts_per_node_fractions_gpus_and_custom_resources():
    # 1.5 CPUs on each of two nodes hold one 1-CPU worker each, not three in all
    assert placement_problem([node(CPU=1.5), node(CPU=1.5)], 3, 1, CPU1, {})["placed"] == 2
    assert placement_problem([node(CPU=1)], 2, 1, {"CPU": 0.5}, {}) is None
    p = placement_problem([node(CPU=8, GPU=1)], 3, 1, {"CPU": 1, "GPU": 0.5}, {})
    assert p["placed"] == 2 and p["short"] == ["GPU"] and p["asks"] == "1 CPU, 0.5 GPU"
    # custom resources: the shards take theirs first, the workers what is left
    nodes = [node(CPU=4, ps=1, wk=1), node(CPU=1, wk=1)]
    assert placement_problem(nodes, 2, 2, {"CPU": 1, "wk": 1}, {"ps": 0.01}) is None
    p = placement_problem(nodes, 2, 2, {"CPU": 1, "wk": 1}, {"ps": 0.6})
    assert p["what"] == "shards" and p["placed"] == 1 and p["short"] == ["ps"]
    p = placement_problem(nodes, 3, 1, {"CPU": 1, "wk": 1}, {})
    assert p["placed"] == 2 and p["short"] == ["wk"] and p["offer"] == "wk 1 + 1"


@pytest.mark.parametrize("bad", ["localhost", "10.0.0.1:", ":6379", "host:port", "host:0", "host:70000", "ray://head:10001"])
def test_an_address_is_auto_or_host_and_port(bad):
    with pytest.raises(ConfigError, match="must be 'auto' or HOST:PORT"):
        RayRuntime(address=bad)
    assert split_address("10.0.0.5:6379") == ("10.0.0.5", 6379) and split_address("auto") is None
    assert split_address("[::1]:6379") == ("::1", 6379)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5"])
def test_the_timeouts_are_positive_numbers(bad):
    for name in ("connect_timeout", "restart_timeout"):
        with pytest.raises(ConfigError, match=name):
            RayRuntime(**{name: bad})


def test_custom_resources_cannot_be_placed_on_the_local_instance():
    with pytest.raises(ConfigError, match="can place none"):
        RayRuntime(worker_resources={"node_b": 1}).check(sg.RunConfig(workers=2))
    assert not ray.is_initialized()


def fake_cluster(monkeypatch, nodes):
    monkeypatch.setattr(RayRuntime, "cluster_nodes", lambda self: (nodes, f"the Ray cluster at {self.address}"))


@pytest.mark.parametrize("cpus,fix", [
    ("1.5", "give a smaller --cpus-per-worker, or add a node"),
    ("1", "give at most 2 with --workers, a smaller --cpus-per-worker, or add a node")])
def test_a_cluster_that_cannot_place_the_workers_names_each_fix_with_its_verb(monkeypatch, tmp_path, capsys,
                                                                             cpus, fix):
    # issue 33: "...; a smaller --cpus-per-worker, or add a node" (no verb) where no worker fit at all
    fake_cluster(monkeypatch, [node(CPU=1), node(CPU=1)])
    code = main(["train", "--runtime", "ray", "--address", "10.0.0.5:6379", "--workers", "3", "--cpus-per-worker",
                 cpus, "--dataset", "digits", "--model", "logreg", "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.endswith(f"; {fix} (`ray start --address 10.0.0.5:6379 --num-cpus N`; a head started with "
                        "--num-cpus 0 runs no worker)\n"), err
    assert not (tmp_path / "run").exists()
    fake_cluster(monkeypatch, [node(CPU=2, GPU=1)])
    with pytest.raises(ConfigError, match=r"; give a smaller cpus_per_worker, a smaller gpus_per_worker \(0.5 puts "
                                          r"two on one GPU\), or add a node \(`ray start --address h:1 --num-cpus N "
                                          r"--num-gpus G`; a head"):
        RayRuntime(address="h:1", cpus_per_worker=1.5, gpus_per_worker=2).check_placement(2)
    fake_cluster(monkeypatch, [node(CPU=2, wk=1)])
    with pytest.raises(ConfigError, match=r"can place 1 at a time: .*; give at most 1 with workers, or add a node "
                                          r"\(`ray start --address h:1 --resources"):
        RayRuntime(address="h:1", worker_resources={"wk": 1}).check_placement(2)


# ---- waiting for the actors to start (Ray mocked, on a fake clock) --------------------------------
class StartingRay:
    """Ray as wait_started sees it, on a clock of its own: ``ray.wait(refs, num_returns, timeout)``
    returns once ``num_returns`` refs have answered or at its timeout, whichever comes first, with the
    refs that answered by then (Ray's semantics); actor ``name`` answers its ping at ``answers[name]``
    seconds; ``free`` resources."""
    exceptions = ray.exceptions

    def __init__(self, answers: dict, free: dict):
        self.answers, self.free, self.now = answers, free, 0.0

    def monotonic(self):   # (stands in for connect.py's time module)
        return self.now

    def actor(self, name):
        return SimpleNamespace(ping=SimpleNamespace(remote=lambda: name))

    def wait(self, refs, num_returns, timeout):
        all_answered = sorted(self.answers[r] for r in refs)[num_returns - 1]
        self.now = min(max(self.now, all_answered), self.now + timeout)
        ready = [r for r in refs if self.answers[r] <= self.now]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        return None

    def available_resources(self):
        return self.free


def started(monkeypatch, answers, free):
    """wait_started on StartingRay: the notices, each with the (fake) time it was said at."""
    fake, said = StartingRay(answers, free), []
    monkeypatch.setattr(connect, "time", fake)
    shards = [fake.actor(n) for n in answers if n.startswith("shard")]
    actors = {int(n[6:]): fake.actor(n) for n in answers if n.startswith("worker")}
    assert wait_started(fake, shards, actors, CPU1, lambda text: said.append((fake.now, text))) == []
    return said


def test_actors_that_start_slowly_are_not_said_to_wait_for_taken_resources(monkeypatch):
    said = started(monkeypatch, {"worker0": 45.0, "worker1": 45.0}, {"CPU": 1.0})
    assert said == [(30.0, "still starting 2 worker and 0 shard actors after 30 s (a loaded machine starts them "
                           "slowly)")]
    # no room left: the run's own starting actors may hold it, or other jobs; Ray does not say which
    said = started(monkeypatch, {"worker0": 45.0, "worker1": 45.0}, {"CPU": 0.0})
    assert said == [(30.0, "still waiting for 2 worker and 0 shard actors after 30 s: they are starting (slowly "
                           "on a loaded machine), or waiting for resources that other jobs hold (see `ray status`)")]


def test_the_notice_comes_on_time_and_names_the_time_waited_when_the_shards_answer_at_once(monkeypatch):
    # issue 33: a second run on a cluster that a first run fills. Its zero-CPU shard answers at once, its
    # workers wait for CPUs: a ray.wait of 30 s returned the shard at 30 s, the notice came after the next
    # wait (at 60 s), and said "after 30 s"
    said = started(monkeypatch, {"shard0": 0.2, "worker0": 75.0, "worker1": 75.0}, {"CPU": 0.0})
    assert [(t, text.split(":")[0]) for t, text in said] == [
        (30.0, "still waiting for 2 worker and 0 shard actors after 30 s"),
        (60.0, "still waiting for 2 worker and 0 shard actors after 60 s")]
    # everything answers before the first notice is due: nothing is said
    assert started(monkeypatch, {"shard0": 0.2, "worker0": 29.0}, {"CPU": 0.0}) == []


# ---- Ray's notices at ray.init --------------------------------------------------------------------
def test_rays_token_notice_at_init_goes_to_the_sessions_logs_not_the_terminal(tmp_path):
    # issue 33: with RAY_AUTH_MODE unset, a local ray.init logs "Token authentication is enabled for this
    # Ray cluster ..." to the stderr handler that Ray puts on its "ray" logger (configure_logging=False or not)
    import logging

    from ray._private.authentication import authentication_token_setup as auth
    calls, seen = [], []
    (tmp_path / "session_1" / "logs").mkdir(parents=True)
    context = SimpleNamespace(get_temp_dir=lambda: str(tmp_path), get_session_name=lambda: "session_1")
    fake = SimpleNamespace(init=lambda **kw: (calls.append(kw), auth._warn_token_auth_enabled()),
                           get_runtime_context=lambda: context)
    beside_rays = logging.Handler()   # where Ray's own handler sits
    beside_rays.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("ray").addHandler(beside_rays)
    try:
        connect.init_quietly(fake, address="local", num_cpus=1)
        assert calls == [{"address": "local", "num_cpus": 1}] and seen == []
        log = (tmp_path / "session_1" / "logs" / "stalegrad-ray-errors.log").read_text()
        assert "(WARNING) Token authentication is enabled for this Ray cluster" in log
        auth._warn_token_auth_enabled()   # afterwards the logger is as it was
        assert len(seen) == 1 and seen[0].startswith("Token authentication is enabled")
    finally:
        logging.getLogger("ray").removeHandler(beside_rays)


# ---- connecting, bounded ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(tmp_path, *args):
    out = tmp_path / "run"
    code = main(["train", "--runtime", "ray", "--workers", "2", "--dataset", "digits", "--model", "logreg",
                 "--epochs", "0.1", "--out", str(out), "-q", *args])
    return code, out


def one_line_error(capsys, code):
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("stalegrad: error: --address is "), err
    return err


def test_a_refused_address_is_one_line_at_once_and_writes_nothing(tmp_path, capsys):
    port = free_port()
    t0 = time.monotonic()
    code, out = cli(tmp_path, "--address", f"127.0.0.1:{port}")
    err = one_line_error(capsys, code)
    assert "connection refused" in err and f"ray start --head --port {port}" in err
    assert time.monotonic() - t0 < 10 and not out.exists()


def test_an_unknown_host_is_one_line(tmp_path, capsys):
    code, out = cli(tmp_path, "--address", "no-such-host.invalid:6379")
    assert "is unknown here" in one_line_error(capsys, code) and not out.exists()


def test_an_address_that_never_answers_as_ray_gives_up_within_the_connect_timeout(tmp_path, capsys):
    # something listens (the TCP connection opens) but never speaks Ray's protocol: Ray's own
    # ray.init would retry for more than ten minutes
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    try:
        t0 = time.monotonic()
        code, out = cli(tmp_path, "--address", f"127.0.0.1:{port}", "--connect-timeout", "3")
        took = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for c in held:
            c.close()
        server.close()
    err = one_line_error(capsys, code)
    assert "could not connect to it within 3 s" in err and "--connect-timeout" in err
    assert f"`ray status --address 127.0.0.1:{port}` on the head" in err
    assert took < 15 and not out.exists()


def test_the_api_refuses_before_on_start(tmp_path):
    started = []
    with pytest.raises(ConfigError, match="connection refused"):
        sg.train("mlp", TRAIN, TEST, "asgd", 2, RayRuntime(address=f"127.0.0.1:{free_port()}"), epochs=0.1,
                 on_start=lambda *a: started.append(a))
    assert started == [] and not ray.is_initialized()


def test_the_timeouts_are_flags_and_toml_keys_of_the_ray_runtime_only(tmp_path, capsys):
    code = main(["train", "--restart-timeout", "5", "--out", str(tmp_path / "a"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "--restart-timeout applies to runtime ray only" in err, err
    toml = tmp_path / "c.toml"
    toml.write_text('runtime = "ray"\nconnect-timeout = 0\n')
    code = main(["train", "--config", str(toml), "--out", str(tmp_path / "b"), "-q"])
    err = capsys.readouterr().err
    # a value the file gave is named as the file's key, not as a flag that was never typed (issue 32)
    assert code == 2 and f"{toml}: connect-timeout must be a finite number > 0" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

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


# ---- waiting for the actors to start (Ray mocked) ------------------------------------------------
class SlowRay:
    """Ray as wait_started sees it: nothing answers for one wait, then everything; ``free`` resources."""
    exceptions = ray.exceptions

    def __init__(self, free):
        self.free, self.waits = free, 0

    def wait(self, refs, num_returns, timeout):
        self.waits += 1
        return (refs, []) if self.waits > 1 else ([], refs)

    def get(self, ref):
        return None

    def available_resources(self):
        return self.free


def test_actors_that_start_slowly_are_not_said_to_wait_for_taken_resources():
    actors = {m: SimpleNamespace(ping=SimpleNamespace(remote=object)) for m in range(2)}
    said = []
    assert wait_started(SlowRay({"CPU": 1.0}), [], actors, CPU1, said.append) == []
    assert said == ["still starting 2 worker and 0 shard actors after 30 s (a loaded machine starts them slowly)"]
    # no room left: the run's own starting actors may hold it, or other jobs; Ray does not say which
    said = []
    assert wait_started(SlowRay({"CPU": 0.0}), [], actors, CPU1, said.append) == []
    assert said == ["still waiting for 2 worker and 0 shard actors after 30 s: they are starting (slowly on a "
                    "loaded machine), or waiting for resources that other jobs hold (see `ray status`)"]


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
    assert code == 2 and "--connect-timeout must be a finite number > 0" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

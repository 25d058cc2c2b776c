"""A rule's server state, declared (algorithms/state.py): what the declaration gives the server (chunks, shards,
checkpoints), the mistakes it refuses where they are written, and the states stalegrad 0.4.0 saved, which still
load and go on to the same bits (tests/fixtures/make_states_0_4.py wrote them with 0.4.0)."""
import copy
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from stalegrad.algorithms import ALGORITHMS, DCASGDAdaptive, GradientAlgorithm, make_algorithm
from stalegrad.algorithms.state import RuleState, Slices, per_element, per_worker, scalar
from stalegrad.core.server import ParameterServer
from stalegrad.errors import UsageError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KERNELS = ["torch", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed (the 'fast' extra)"))]


def fixture_script():
    spec = importlib.util.spec_from_file_location("make_states_0_4", FIXTURES / "make_states_0_4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAVED = torch.load(FIXTURES / "states-0.4.pt", weights_only=True)


@dataclass
class Example(RuleState):
    buf: object = per_element()
    snaps: object = per_worker()
    count: int = scalar(0)
    unused: object = per_element()


def test_chunk_slices_the_per_element_fields_and_keeps_the_scalars():
    state = Example(buf=torch.arange(10.0), snaps=[torch.arange(10.0) * 2, torch.arange(10.0) * 3], count=4)
    chunk = state.chunk(3, 6)
    assert chunk is not state and chunk.count == 4 and chunk.unused is None
    assert chunk.buf.tolist() == [3.0, 4.0, 5.0]
    assert isinstance(chunk.snaps, Slices) and len(chunk.snaps) == 2 and chunk.snaps[1].tolist() == [9.0, 12.0, 15.0]
    chunk.buf.mul_(-1)   # a view: a rule writes the state's own elements
    assert state.buf[2:7].tolist() == [2.0, -3.0, -4.0, -5.0, 6.0]
    assert Example.per_element_fields() == ("buf", "snaps", "unused")


def test_to_dict_leaves_out_what_is_not_kept_and_from_dict_reads_it_back():
    state = Example(buf=torch.ones(2), count=7)
    d = state.to_dict()
    assert list(d) == ["buf", "count"] and d["buf"] is state.buf
    back = Example.from_dict(d)
    assert back.buf is state.buf and back.count == 7 and back.snaps is None


def test_a_field_written_under_a_misspelt_name_is_an_error():
    state = Example()
    with pytest.raises(AttributeError, match="declares no field 'cuont'"):
        state.cuont = 1
    assert Example.per_element_fields() == ("buf", "snaps", "unused")


def test_a_misspelt_name_in_server_writes_fails_where_the_rule_is_written():
    with pytest.raises(TypeError, match="server_writes names 'mean_sqare', which DCASGDAdaptive.State does not"):
        @dataclass(frozen=True)
        class Misspelt(DCASGDAdaptive):
            server_writes = ("momentum_buffer", "mean_sqare")


def test_a_rule_cannot_list_its_per_element_state_by_name():
    with pytest.raises(TypeError, match="sets per_element_state"):
        @dataclass(frozen=True)
        class Listed(GradientAlgorithm):
            per_element_state = ("momentum_buffer", "extra")


def test_a_state_field_without_a_kind_fails_where_the_rule_is_written():
    with pytest.raises(TypeError, match="State.extra is not declared with per_element"):
        @dataclass(frozen=True)
        class Unmarked(GradientAlgorithm):
            @dataclass
            class State(GradientAlgorithm.State):
                extra: object = None


def test_a_new_per_element_field_is_chunked_without_naming_it_anywhere_else(monkeypatch):
    """A rule that declares one more per-element field gets it sliced on chunks: chunked equals whole."""
    import stalegrad.core.server as server_mod
    from stalegrad.algorithms.base import elementwise

    @dataclass(frozen=True)
    class Tracked(GradientAlgorithm):
        name = "tracked"
        server_writes = ("momentum_buffer", "total")

        @dataclass
        class State(GradientAlgorithm.State):
            total: object = per_element()

        def server_init(self, w, num_workers):
            return self.State(total=torch.zeros_like(w))

        @elementwise
        def server_delta(self, state, w, worker, msg, tau, lr, out):
            state.total.add_(msg)   # a chunk not sliced would fail here: shapes of the chunk and the whole
            return state.total, -lr

    results = []
    for chunked in (False, True):
        monkeypatch.setattr(server_mod, "CHUNK", 64 if chunked else 1 << 18)
        monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 1 << 22)
        server = ParameterServer(Tracked(), torch.zeros(1000), 1, kernels="torch")
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            server.pull(0)
            server.push(0, torch.randn(1000, generator=gen), 0.1)
        results.append(server.w.clone())
    assert torch.equal(results[0], results[1]) and bool(results[0].any())


def test_a_state_dict_with_a_part_the_rule_does_not_keep_is_refused_whole():
    server = ParameterServer(make_algorithm("dcasgd-a"), torch.zeros(5), 2)
    sd = server.state_dict()
    bad = {**sd, "state": {**sd["state"], "mean_sqare": sd["state"]["mean_square"]}}
    before = server.state
    with pytest.raises(UsageError, match="'sd.state' holds 'mean_sqare', which this rule's state does not"):
        server.load_state_dict(bad)
    assert server.state is before


@pytest.mark.parametrize("key", sorted(SAVED["servers"]))
@pytest.mark.parametrize("kernels", KERNELS)
def test_a_server_state_saved_by_0_4_loads_and_goes_on_to_the_same_bits(key, kernels):
    script, entry = fixture_script(), SAVED["servers"][key]
    algo = make_algorithm(entry["algorithm"], **entry["params"])
    server = ParameterServer(algo, torch.zeros(script.N), entry["workers"], kernels=kernels)
    server.load_state_dict(copy.deepcopy(entry["state"]))   # (a server adopts the tensors it loads: a copy)
    assert isinstance(server.state, algo.State)
    assert script.digest(server.state_dict()) == script.digest(entry["state"])   # the same keys, the same bits
    script.drive(server, entry["rest"])
    assert server.version > entry["state"]["version"] or algo.name in ("rennala", "m-ssgd")
    assert script.digest(server.state_dict()) == entry["final"][kernels]


def test_a_checkpoint_written_by_0_4_resumes_to_the_uninterrupted_run(tmp_path):
    script = fixture_script()
    path = tmp_path / "checkpoint.pt"
    shutil.copy(FIXTURES / "checkpoint-0.4.pt", path)
    saved = torch.load(path, weights_only=True)
    assert saved["run"]["server"]["version"] == 7 and set(saved["run"]["server"]["state"]) == {"w_bak", "mean_square"}
    resumed = script.train(path, resume=path)
    assert resumed.summary["weights_sha256"] == SAVED["run_sha256"]


def test_every_rule_is_in_the_fixture():
    assert {entry["algorithm"] for entry in SAVED["servers"].values()} == set(ALGORITHMS)

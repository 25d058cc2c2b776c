"""Same seed, same bits at any thread count (stalegrad/numerics.py), and the thread governor."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Trains small runs of several kinds in one process and prints their weights_sha256 and test losses.
# MODE "strict-off" pretends strict mode is on while leaving MKL as it is (the behaviour before
# stalegrad/numerics.py): the hashes must then differ between thread counts, or this test could not fail.
SCRIPT = r"""
import json, os, sys
mode = sys.argv[1]
if mode in ("torch-first", "strict-off", "strict-off-probed"):   # torch starts MKL before stalegrad can
    import torch
    (torch.randn(256, 256) @ torch.randn(256, 256)).sum().item()
if mode == "torch-imported":    # imported, nothing computed: MKL starts later, with stalegrad's pins
    import torch
import stalegrad as sg
import torch
from stalegrad import numerics
from stalegrad.data.dataset import Dataset
if mode.startswith("strict-off"):     # and no fallback to one thread: as before numerics.py
    numerics.make_strict = lambda: True
if mode == "strict-off":              # nor the check of each thread count's bits before the run
    numerics.agreeing_counts = lambda step, counts: sorted(counts)
g = torch.Generator().manual_seed(0)
def data(n, shape):
    x = torch.randn(n, *shape, generator=g)
    w = torch.randn(x[0].numel(), 10, generator=g)
    return Dataset("t", x, (x.flatten(1) @ w).argmax(1), 10)
flat, flat_test = data(2048, (784,)), data(512, (784,))
img, img_test = data(512, (1, 28, 28)), data(256, (1, 28, 28))
runs = {
    "mlp-asgd": ("mlp", flat, flat_test, "asgd", {"lr": 0.3}, {}),
    "mlp-dcasgd-a-vectorised": ("mlp", flat, flat_test, "dcasgd-a", {"lr": 0.3}, {"vectorised": True}),
    "mlp-agn": ("mlp", flat, flat_test, "agn", {"lr": 0.01}, {}),
    "cnn-asgd": ("cnn", img, img_test, "asgd", {"lr": 0.1, "epochs": 0.3}, {}),
}
out = {"threads": torch.get_num_threads()}
for name, (model, tr, te, algo, opts, sim) in runs.items():
    if os.environ.get("ONLY") and name != os.environ["ONLY"]:
        continue
    r = sg.train(model, tr, te, algo, workers=4, runtime=sg.Simulator(**sim), batch_size=128, seed=1,
                 **{"epochs": 1, **opts})
    out[name] = [r.summary["weights_sha256"], [m["test_loss"] for m in r.metrics]]
    out["numerics"] = r.config["numerics"]
print(json.dumps(out))
"""


def run(threads: int, mode: str = "plain", only: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    env.update(OMP_NUM_THREADS=str(threads), ONLY=only)
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def one_thread():
    return run(1)


def test_one_and_two_threads_give_the_same_bits(one_thread):
    two = run(2)
    assert one_thread["threads"] == 1 and two["threads"] == 2
    for name in ("mlp-asgd", "mlp-dcasgd-a-vectorised", "mlp-agn", "cnn-asgd"):
        assert one_thread[name] == two[name], name   # the weights and every evaluation's test loss
    assert two["numerics"]["mkl_cbwr"].endswith("STRICT") and two["numerics"]["mkldnn"] is False
    assert two["numerics"]["threads"] == 2 and two["numerics"]["cpu_capability"]


def test_without_strict_mode_the_thread_count_changes_the_bits(one_thread):
    """The check above can fail: with MKL left as it was, 1 and 2 threads part ways."""
    loose_one, loose_two = run(1, "strict-off", "mlp-asgd"), run(2, "strict-off", "mlp-asgd")
    assert loose_two["numerics"]["mkl_cbwr"] == "BRANCH_OFF"   # MKL's own default
    if loose_one["mlp-asgd"][0] == loose_two["mlp-asgd"][0]:
        # seen on an Intel Xeon (AVX512), whose MKL kept these products whole at 2 threads; the EPYC VMs split them
        pytest.skip(f"MKL's default splits none of this run's products by thread on this CPU "
                    f"({loose_two['numerics'].get('cpu_model')}): nothing for strict mode to fix here")
    assert loose_one["mlp-asgd"][0] != loose_two["mlp-asgd"][0]


def test_the_check_before_the_run_catches_mkl_left_loose(one_thread):
    """The second line of defence: with MKL not strict, the step run at each thread count before the
    first message differs at 2 threads, so the run keeps one thread and the bits of one thread."""
    loose_one, loose_two = run(1, "strict-off-probed", "mlp-asgd"), run(2, "strict-off-probed", "mlp-asgd")
    assert loose_two["numerics"]["mkl_cbwr"] == "BRANCH_OFF"
    assert loose_one["mlp-asgd"][0] == loose_two["mlp-asgd"][0]


def test_torch_started_first_falls_back_to_one_thread_with_the_same_bits(one_thread):
    late, late_one = run(2, "torch-first", "mlp-asgd"), run(1, "torch-first", "mlp-asgd")
    assert late["mlp-asgd"] == late_one["mlp-asgd"]   # the thread count does not enter
    assert late["numerics"]["threads"] == 1 and "one thread" in late["numerics"]["note"]
    if late["numerics"]["cpu_capability"] == "AVX2":
        # torch started before the pin could act, so its kernels are the CPU's own: on an AVX2 CPU those
        # are the pinned ones, and the bits are the pinned run's; an AVX512 CPU gives its own
        assert late["mlp-asgd"] == one_thread["mlp-asgd"]


def test_torch_imported_first_but_not_used_keeps_every_thread_and_the_bits(one_thread):
    """Most scripts import torch before stalegrad: MKL reads its mode at its first product, not at the import,
    so the pins still act, and two threads run with one thread's bits (issue 33)."""
    early = run(2, "torch-imported", "mlp-asgd")
    assert early["numerics"]["threads"] == 2 and early["numerics"]["mkl_cbwr"].endswith("STRICT")
    assert early["mlp-asgd"] == one_thread["mlp-asgd"]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_governor_keeps_the_faster_thread_count(monkeypatch):
    import torch

    from stalegrad import numerics
    clock = FakeClock()
    monkeypatch.setattr(numerics.time, "perf_counter", clock)
    threads = {"n": 4}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.update(n=n))
    seconds_per_message = {1: 0.01, 2: 0.02, 4: 0.05}   # a busy machine: one thread is fastest
    waited = lambda: clock.t   # noqa: E731  (another process waits for a core all the time)
    gov = numerics.ThreadGovernor(None, trial_s=1.0, hold_s=10.0, stall=waited)
    assert gov.candidates == [1, 2, 4] and gov.current == 4
    seen = []
    for _ in range(3000):
        clock.t += seconds_per_message[gov.current]
        gov.tick()
        seen.append(gov.current)
    assert set(seen) == {1, 2, 4}                   # it tried every count, and measures again later
    assert seen.count(1) > 0.8 * len(seen)          # and spent its time at the fastest
    assert sum(gov.messages.values()) == 3000 and gov.current == 1
    seconds_per_message.update({1: 0.05, 4: 0.01})  # the machine went quiet: all cores win next round
    for _ in range(3000):
        clock.t += seconds_per_message[gov.current]
        gov.tick()
    assert gov.current == 4


def test_a_fixed_thread_count_is_kept(monkeypatch):
    import torch

    from stalegrad import numerics
    threads = {"n": 2}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.update(n=n))
    gov = numerics.ThreadGovernor(3)
    for _ in range(100):
        gov.tick()
    assert threads["n"] == 3 and gov.messages == {3: 100}


def test_simulator_threads_are_checked():
    import stalegrad as sg
    for bad in (0, -1, 2.5, True, "2"):
        with pytest.raises(sg.ConfigError, match="threads must be an integer from 1 to 1024"):
            sg.Simulator(threads=bad)


def has_avx2() -> bool:   # independent of stalegrad's own check: the CPU's flags as Python reads them
    try:
        return "avx2" in next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return False


def test_import_pins_portable_numerics_unless_the_user_chose():
    show = "import stalegrad, os; print(os.environ.get('MKL_CBWR'), os.environ.get('ATEN_CPU_CAPABILITY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    run_ = lambda **e: subprocess.run([sys.executable, "-c", show], env={**env, **e}, capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout.strip()
    # AVX2 kernels and MKL's AVX2 branch, strict: the same bits on every x86-64 CPU with AVX2
    assert run_() == ("AVX2,STRICT avx2" if has_avx2() else "AUTO,STRICT None")
    assert run_(MKL_CBWR="AUTO,STRICT") == ("AUTO,STRICT avx2" if has_avx2() else "AUTO,STRICT None")
    assert run_(ATEN_CPU_CAPABILITY="default", MKL_CBWR="AVX512,STRICT") == "AVX512,STRICT default"


def test_config_records_the_pinned_numerics():
    code = ("import stalegrad as sg, json; tr, te = sg.load_pair('digits'); "
            "print(json.dumps(sg.train('logreg', tr, te, 'sgd', workers=1, epochs=0.05).config['numerics']))")
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    numerics = json.loads(p.stdout.splitlines()[-1])
    if has_avx2():
        assert numerics["mkl_cbwr_env"] == "AVX2,STRICT" and numerics["aten_cpu_capability_env"] == "avx2"
        assert numerics["mkl_cbwr"].endswith(",STRICT")
        assert numerics["cpu_capability"] == "AVX2"   # torch's kernels follow the pin, even on an AVX512 CPU
    # MKL runs vendor-specific code: the CPU's vendor and model are part of what fixes the bits
    if sys.platform.startswith("linux"):
        info = Path("/proc/cpuinfo").read_text()
        assert numerics["cpu_vendor"] in info and numerics["cpu_model"] in info and numerics["cpu_model"]


SMALL_BATCH = r"""
import json, sys
import stalegrad as sg
tr, te = sg.load_pair("digits")
r = sg.train("mlp", tr, te, "asgd", workers=4, epochs=0.5, batch_size=8, seed=3)
print(json.dumps([r.summary["weights_sha256"], r.summary["threads_used"], r.summary.get("notes", [])]))
"""


def test_a_kernel_that_splits_by_thread_is_caught_before_the_run():
    """At batch 8 the mlp's last layer (8 x 128 by 128 x 10, the weight transposed) runs torch's native
    gemm, which splits the inner sum by thread even with MKL strict: the simulator finds that with one
    step of the run's shapes at each count and runs at one thread, so 1 and 2 threads give one hash."""
    import torch
    import torch.nn.functional as F

    import stalegrad  # noqa: F401  (MKL strict before torch computes)
    g = torch.Generator().manual_seed(0)
    x, W, b = torch.randn(8, 128, generator=g), torch.randn(10, 128, generator=g), torch.randn(10, generator=g)
    before = torch.get_num_threads()
    outs = []
    for n in (1, 2):
        torch.set_num_threads(n)
        outs.append(F.linear(x, W, b))
    torch.set_num_threads(before)
    if torch.equal(*outs):
        pytest.skip("this torch build's kernel does not split by thread at this shape: nothing to catch")
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    runs = []
    for n in (1, 2):
        p = subprocess.run([sys.executable, "-c", SMALL_BATCH], env={**env, "OMP_NUM_THREADS": str(n)},
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.splitlines()[-1]))
    assert runs[0][0] == runs[1][0]                       # one hash
    assert runs[1][1] == {"1": runs[1][1]["1"]}           # asked for 2 threads, ran every message at 1
    assert any("threads: 2 would change this run's bits" in n for n in runs[1][2])


DEMO_LIKE = r"""
import json
import stalegrad as sg
tr, te = sg.load_pair("digits")
# 1437 training samples, 2 held out for validation: the validation set is one chunk of 2 rows, the tiny
# output that torch's gemm splits by thread; the training batches (32) are not tiny
r = sg.train("mlp", tr, te, "asgd", workers=4, epochs=1, batch_size=32, seed=3, val_split=2)
print(json.dumps([r.summary["weights_sha256"], r.summary["threads_used"], r.summary.get("notes", []),
                  [m.get("val_loss") for m in r.metrics]]))
"""


def test_tiny_evaluation_chunks_keep_their_bits_at_any_thread_count():
    """FlatModel.predict runs a chunk of fewer than 16 rows at one thread: the module alone gives other bits
    at 2 threads on 2 to 9 rows of the mlp's last layer (if this build splits that sum), predict the same."""
    import torch

    import stalegrad  # noqa: F401
    from stalegrad.models import build_model
    from stalegrad.core.worker import FlatModel
    torch.manual_seed(0)
    model = FlatModel(build_model("mlp", (64,), 10))
    x = torch.randn(5, 64)
    before = torch.get_num_threads()
    raw, kept = [], []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.no_grad():
                raw.append(model.module(x))
                kept.append(model.predict(x))
            assert torch.get_num_threads() == n   # predict puts the count back
    finally:
        torch.set_num_threads(before)
    assert torch.equal(kept[0], kept[1]) and torch.equal(kept[0], raw[0])
    if torch.equal(raw[0], raw[1]):
        pytest.skip("this torch build's kernel does not split by thread at this shape")


def test_two_threads_asked_two_used_with_the_bits_of_one():
    """The run asks for 2 threads and its validation tail is tiny: it used to fall back to one thread for the
    whole run; now it runs at 2 and ends with the same weights and validation losses as at one."""
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    runs = []
    for n in (1, 2):
        p = subprocess.run([sys.executable, "-c", DEMO_LIKE], env={**env, "OMP_NUM_THREADS": str(n)},
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.splitlines()[-1]))
    assert runs[0][0] == runs[1][0] and runs[0][3] == runs[1][3]
    assert set(runs[1][1]) == {"2"}, runs[1]
    assert not any("would change" in n for n in runs[1][2])


def test_the_cli_says_in_one_line_when_it_runs_at_fewer_threads(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    p = subprocess.run([sys.executable, "-m", "stalegrad", "train", "--workers", "2", "--dataset", "digits",
                        "--model", "mlp", "--batch-size", "8", "--epochs", "0.2", "--seed", "3", "--quiet",
                        "--out", str(tmp_path / "run")], env={**env, "OMP_NUM_THREADS": "2"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    if set(summary["threads_used"]) != {"1"}:
        pytest.skip("this torch build's kernel does not split by thread at batch 8: nothing to say")
    warned = [line for line in p.stderr.splitlines() if "threads" in line]
    assert warned == ["stalegrad: warning: threads: 2 would change this run's bits (a kernel of torch's that "
                      "splits a sum by thread at these shapes, e.g. a batch of 8); ran at 1"]

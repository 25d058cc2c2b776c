"""Small data sets, process helpers and the experiments' scripts, as the tests share them."""
import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def experiment(name: str):
    """experiments/<name>.py as a module: the scripts are no package, and some import each other."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blobs(n=256, d=8, classes=3, seed=0):
    """Gaussian blobs around class means fixed once for all calls: ``seed`` only draws the samples."""
    means = torch.randn(classes, d, generator=torch.Generator().manual_seed(1234)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = means[y] + torch.randn(n, d, generator=g)
    return SimpleNamespace(x=x, y=y, num_classes=classes)


def logreg_grad(X, Y, classes: int):
    """Multinomial logistic regression's gradient on float64 arrays (X, Y), by hand, as the references use it:
    ``grad(w, idx) = X^T (softmax(X W^T + b) - onehot) / B`` on the rows ``idx``, w = (W flattened, b)."""
    import numpy as np
    C, D = classes, X.shape[1]

    def grad(w, idx):
        W, b = w[:C * D].reshape(C, D), w[C * D:]
        x, y = X[idx], Y[idx]
        z = x @ W.T + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        p /= len(y)
        return np.concatenate([(p.T @ x).ravel(), p.sum(0)])
    return grad


# The training and test sets of the simulator, checkpoint and reference tests.
TRAIN, TEST = blobs(seed=0), blobs(n=128, seed=1)


def checkpointed_run(out, *options):
    """A finished 1-epoch run of ``stalegrad train OPTIONS`` in ``out`` with a checkpoint every 5 updates."""
    from stalegrad.cli import main
    assert main(["train", *options, "--epochs", "1", "--checkpoint-every", "5", "--out", str(out)]) == 0
    return out


def write_trace(path, rows):
    """A delay trace file (``--delay trace:PATH``) of ``(worker, pulled, applied, wall_s)`` rows."""
    path.write_text("worker,pulled,applied,wall_s\n" + "".join(f"{w},{p},{a},{t}\n" for w, p, a, t in rows))


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def ray_started(log, proc, deadline: float) -> str:
    """The output of a `ray start ... --block` (``proc``, writing ``log``, a Path) once it says "Ray runtime
    started", which `ray start` prints only after the node is registered with the head (with its
    resources); fails the test with the log if that has not come by ``deadline`` (time.monotonic())."""
    import time
    while time.monotonic() < deadline and proc.poll() is None:
        text = log.read_text()
        if "Ray runtime started" in text:
            return text
        time.sleep(0.2)
    raise AssertionError(log.read_text())


def ray_head_ip(log, proc, deadline: float) -> str:
    """The node IP that a `ray start --head --block` prints once its runtime is up (``ray_started``)."""
    return ray_started(log, proc, deadline).split("Local node IP: ")[1].split()[0]


class Stop(Exception):
    """Raised by ``stop_after_first_checkpoint`` runtimes."""


def stop_after_first_checkpoint(runtime_cls):
    """A subclass of ``runtime_cls`` whose run raises ``Stop`` right after its first checkpoint
    is written: an interruption at a known point, for resume tests."""
    class StopAfterFirstCheckpoint(runtime_cls):
        def run(self, training, *, seed, resume=None):
            save = training.save_checkpoint

            def save_then_stop(state):
                save(state)
                raise Stop
            training.save_checkpoint = save_then_stop
            super().run(training, seed=seed, resume=resume)
    return StopAfterFirstCheckpoint


def fake_run(root, algo, lr, seed, test, val=None, workers=4, **params):
    """A finished run directory made by hand, whose figures are known: final test accuracy ``test``, and
    with ``val`` a final validation accuracy (a run made with --val-split)."""
    import json
    d = root / f"{algo}-M{workers}-lr{lr}-{'-'.join(f'{k}{v}' for k, v in params.items())}-s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo, **params}, "workers": workers, "lr": lr,
                                               "seed": seed, "runtime": {"name": "sim"},
                                               **({"val_split": 100} if val is not None else {})}))
    (d / "metrics.jsonl").write_text(
        json.dumps({"virtual_s": 0.0, "wall_s": 0.0, "test_acc": 0.1, "samples": 0}) + "\n"
        + json.dumps({"virtual_s": 10.0, "wall_s": 1.0, "test_acc": test, "samples": 1}) + "\n")
    summary = {"final_test_acc": test, "best_test_acc": test}
    if val is not None:
        summary.update(final_val_acc=val, best_val_acc=val)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "staleness.json").write_text("{}")
    return d


def snapshot(root) -> dict:
    """Every entry below ``root``: its kind, size and contents' hash (what a command must leave as it was)."""
    import hashlib
    import stat
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size if digest else 0, digest)
    return out


@contextlib.contextmanager
def full_disk(where, free_pages: int = 0):
    """A 512 KiB tmpfs mounted at ``where`` (made), filled up but ``free_pages`` pages of 4 KiB: a disk that
    is full. Mounting needs root: the test is skipped without it, or where mount fails."""
    import errno
    import subprocess

    import pytest
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    Path(where).mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        filler = Path(where) / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\1" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
            f.truncate(max(0, f.tell() - 4096 * free_pages))
        yield Path(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (TimeoutError) instead of hanging when the block runs longer than ``seconds`` (the main thread)."""
    import signal

    def late(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it hangs")
    old = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def state_tensors(state) -> list:
    """Every tensor of a rule's (nested) state, in a fixed order."""
    if hasattr(state, "to_dict"):   # a rule's declared server state (algorithms/state.py)
        return state_tensors(state.to_dict())
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in state_tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in state_tensors(v)]
    return []


def cut(train, path, monkeypatch, at_version: int = 10) -> None:
    """Run ``train(path)`` until the server's version reaches ``at_version``, where its push raises: the run
    stops as one killed there would, leaving the checkpoint it last saved at ``path``."""
    import pytest
    from stalegrad import ParameterServer

    class Interrupt(Exception):
        pass

    original = ParameterServer.push

    def push(self, worker, msg, lr):
        if self.version == at_version:
            raise Interrupt()
        return original(self, worker, msg, lr)
    with monkeypatch.context() as mp:
        mp.setattr(ParameterServer, "push", push)
        with pytest.raises(Interrupt):
            train(path)

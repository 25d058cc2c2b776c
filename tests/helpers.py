"""Small data sets, process helpers and the experiments' scripts, as the tests share them."""
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


# The training and test sets of the simulator, checkpoint and reference tests.
TRAIN, TEST = blobs(seed=0), blobs(n=128, seed=1)


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

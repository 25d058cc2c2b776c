"""Training across machines on a Ray cluster (``--runtime ray``).

The same ``Worker`` and ``ParameterServer`` as every runtime, on Ray actors:

- ``--ps-shards K`` server actors (``actors.ShardActor``), each a
  ``ParameterServer`` over one contiguous slice of the weights, driven in
  lockstep with a two-phase push so that every shard counts the same versions
  and tau (``stalegrad/core/sharding.py`` explains and tests the design);
- one actor per worker (``actors.WorkerActor``), with ``--cpus-per-worker``
  and ``--gpus-per-worker`` as its Ray resource request;
- the driver holds the training run. With one shard and an asynchronous rule
  that pulls before computing (``direct.fits``) the workers push to and pull
  from the shard themselves, one round trip per update (through the shard's
  Unix socket on its machine for weights up to 1 MiB, ``channel.py``; else a
  Ray call), and the driver reads the shard's records afterwards
  (``direct.py``, ``ledger.py``); otherwise the
  driver waits on whichever worker finishes first (``ray.wait``) and makes every
  call to the shards (``driver.py``).

Weights and messages travel as numpy arrays, inside Ray's task messages up to
1 MiB on the local instance that ``run`` starts (``LOCAL_SYSTEM_CONFIG``), else
through its object store, which hands them over without a copy. Without ``address`` a
new local Ray instance starts (never one found through ``RAY_ADDRESS`` or
``ray start``; Ray binds its ports on every interface, not only loopback: see
docs/cluster.md, Security), and it is shut down at the end, also on Ctrl-C or
an error; ``address="auto"`` or ``"HOST:PORT"`` joins a running cluster. A Ray
already initialised in this process (``ray.init`` by the caller) is used as it
is and left running; the run's actors are killed either way. Ray is an
optional extra: ``pip install 'ray>=2.9'``.

Before anything is written (``check``), a cluster is joined once in a child
process within ``connect_timeout`` seconds (``connect.probe``: refused,
unknown host, unreachable, a rejected token each end in one line), and its
nodes must be able to place every worker and shard at once
(``connect.placement_problem``); so must a Ray the caller initialised, and a
local instance (GPUs, custom resources). Ray's own fault reports ("Raylet is
terminated ...", "(raylet) A worker died ...") and its token notice at start-up
("Token authentication is enabled for this Ray cluster ...") go to the session's
log directory (``stalegrad-ray-errors.log``), not the terminal; the driver
prints one line per fault.

Placement: ``worker_resources`` and ``shard_resources`` (e.g. ``{"gpu_box": 1}``)
are custom Ray resources that each worker actor, respectively each server
shard, requests on top of its CPUs and GPUs, so that they land on the nodes
that offer them (``ray start --resources '{"gpu_box": 4}'``). Without
``shard_resources`` the shards (0 CPUs) go wherever Ray puts them.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from ...core import pacing
from ...errors import ConfigError, check_finite_positive
from ..base import Training
from .connect import (CONNECT_TIMEOUT, divert_ray_errors, init_quietly, placement_problem, probe, session_logs,
                      split_address)

RESTART_TIMEOUT = 10.0
# The local instance that run() starts passes objects of up to this many bytes (a small model's
# weights and messages) inside Ray's task messages, not through its shared-memory object store
# (Ray's default limit is 100 KiB), which costs milliseconds a hop on a small machine
# (benchmarks/archive/ray_overhead.py --inline-compare; benchmarks/archive/NOTES.md, section 6). A head started with
# --system-config='{"max_direct_call_object_size": 1048576}' does the same (benchmarks/archive/ray_system_config.py).
INLINE_BYTES = 1 << 20
LOCAL_SYSTEM_CONFIG = {"max_direct_call_object_size": INLINE_BYTES}
_PROBED: dict = {}   # address -> (when, what connect.probe read): joined once per run, not per check

INSTALL = "pip install 'ray>=2.9'"


def ray_module():
    """Ray, or the one-line error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("runtime", f"is ray, but Ray is not installed here; install it with {INSTALL}") from None
    return ray


@dataclass
class RayRuntime:
    """Workers and a (sharded) parameter server as Ray actors; see the module docstring."""
    address: str | None = None         # None: start a local Ray; "auto" or "HOST:PORT": join a cluster
    ps_shards: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    record_trace: str | os.PathLike | None = None
    max_restarts: int = 3              # how often Ray restarts a dead server shard
    restart_timeout: float = RESTART_TIMEOUT   # seconds to wait for a replacement worker or a restarted shard
    connect_timeout: float = CONNECT_TIMEOUT   # seconds to join a cluster (address) before giving up
    worker_resources: dict | None = None   # custom Ray resources each worker actor requests (placement)
    shard_resources: dict | None = None    # custom Ray resources each server shard requests (placement)
    same_node_socket: bool = True      # direct path: workers on the shard's machine use its socket (channel.py)
    delay: str | None = None           # a speed profile (core/delays.py), made real (core/pacing.py); None: none
    step_time: float | None = None     # seconds per local step of a speed-1 worker; None: automatic

    def __post_init__(self):
        if not isinstance(self.ps_shards, int) or isinstance(self.ps_shards, bool) or self.ps_shards < 1:
            raise ConfigError("ps_shards", f"must be a positive integer, got {self.ps_shards!r}")
        check_finite_positive("cpus_per_worker", self.cpus_per_worker)
        check_finite_positive("gpus_per_worker", self.gpus_per_worker, strict=False)
        check_finite_positive("restart_timeout", self.restart_timeout)
        check_finite_positive("connect_timeout", self.connect_timeout)
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError("max_restarts", f"must be a non-negative integer, got {self.max_restarts!r}")
        if not isinstance(self.same_node_socket, bool):
            raise ConfigError("same_node_socket", f"must be true or false, got {self.same_node_socket!r}")
        if self.address is not None:
            if not isinstance(self.address, str):
                raise ConfigError("address", f"must be 'auto' or HOST:PORT, got {self.address!r}")
            split_address(self.address)
        for name in ("worker_resources", "shard_resources"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                    for k, v in value.items()):
                raise ConfigError(name, f"must map Ray resource names to positive amounts, got {value!r}")
            if {"CPU", "GPU"} & set(value):
                raise ConfigError(name, "names custom resources only; CPUs and GPUs are cpus_per_worker "
                                        "and gpus_per_worker")
        self.stats: dict = {}

    def check(self, config) -> None:
        """Ray is installed and the options fit the run (before anything is written)."""
        ray_module()
        if self.gpus_per_worker and not config.device.startswith("cuda"):
            raise ConfigError("gpus_per_worker", "needs device cuda: the workers would hold a GPU and not use it")
        if self.record_trace is not None:
            from ...errors import check_writable
            check_writable("record_trace", self.record_trace)
        pacing.check_run(self.delay, self.step_time, config)
        self.check_placement(config.workers)

    def cluster_nodes(self) -> tuple[list[dict], str]:
        """The nodes the run's actors may go to, and where they are (joined once per address)."""
        ray = ray_module()
        if ray.is_initialized():   # the caller's Ray
            return [{"resources": n["Resources"]} for n in ray.nodes() if n["Alive"]], "the Ray of this process"
        if self.address is None:   # the local instance run() starts: every core, the GPUs torch sees
            import torch
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            return [{"resources": {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}}], "the local Ray"
        seen = _PROBED.get(self.address)   # (the CLI checks its options twice, with two runtime objects)
        if seen is None or time.monotonic() - seen[0] > 30:
            _PROBED[self.address] = seen = (time.monotonic(), probe(self.address, self.connect_timeout))
        return seen[1]["nodes"], f"the Ray cluster at {self.address}"

    def check_placement(self, workers: int) -> None:
        """The workers and shards can all be placed at once, or one line naming what is missing and the fix."""
        nodes, where = self.cluster_nodes()
        worker_request = {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker, **(self.worker_resources or {})}
        if self.address is None and not ray_module().is_initialized():
            worker_request["CPU"] = 0   # run() starts the local Ray with CPUs for every worker
        problem = placement_problem(nodes, workers, self.ps_shards, worker_request, dict(self.shard_resources or {}))
        if problem is None:
            return
        join = f"ray start --address {self.address if self.address not in (None, 'auto') else 'HEAD:PORT'}"
        if problem["what"] == "shards":
            raise ConfigError("shard_resources", f"asks for {problem['asks']} per server shard, but {where} can place "
                                                 f"{problem['placed']} of the {self.ps_shards} shards (its nodes offer "
                                                 f"{problem['offer']}); give fewer ps_shards, or start a node with "
                                                 f"`{join} --resources '{{\"NAME\": N}}'`")
        gives = [f"at most {problem['placed']} with workers"] if problem["placed"] else []
        short = problem["short"]
        if "CPU" in short:
            gives.append("a smaller cpus_per_worker")
        if "GPU" in short:
            gives.append("a smaller gpus_per_worker (0.5 puts two on one GPU)")
        add = " --num-cpus N" * ("CPU" in short) + " --num-gpus G" * ("GPU" in short) + \
            (" --resources '{\"NAME\": N}'" if set(short) - {"CPU", "GPU"} else "")
        fix = f"add a node (`{join}{add}`; a head started with --num-cpus 0 runs no worker)"
        fix = f"give {', '.join(gives)}, or {fix}" if gives else fix
        raise ConfigError("workers", f"is {workers}, but {where} can place {problem['placed'] or 'none'} at a time: "
                                     f"each asks for {problem['asks']}, and its nodes offer {problem['offer']}; "
                                     f"{fix}", mentions=("workers",))

    def describe(self) -> dict:
        out = {"name": "ray", "address": self.address, "ps_shards": self.ps_shards,
               "cpus_per_worker": self.cpus_per_worker, "gpus_per_worker": self.gpus_per_worker,
               "record_trace": str(self.record_trace) if self.record_trace is not None else None}
        for name in ("worker_resources", "shard_resources"):   # only when given: placement is rarely set
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        if not self.same_node_socket:
            out["same_node_socket"] = False
        out.update(pacing.profile_description(self.delay, self.step_time))
        for name, default in (("restart_timeout", RESTART_TIMEOUT), ("connect_timeout", CONNECT_TIMEOUT)):
            if getattr(self, name) != default:   # (likewise: a run's config.json names them only when set)
                out[name] = float(getattr(self, name))
        return out

    def profile(self, training: Training):
        """The run's speed profile (``core.pacing.resolve``), an automatic step time sized by the cluster's CPUs
        (this machine's when the run started its own Ray, which it gives a CPU per worker)."""
        cores = os.cpu_count() or 1
        if self.address is not None:
            cores = int(sum(n["resources"].get("CPU", 0) for n in self.cluster_nodes()[0])) or cores
        return pacing.resolve(self.delay, self.step_time, training.worker_factory, training.server.num_workers,
                              training.server.algorithm.steps_per_message, max(1, int(self.cpus_per_worker)), cores)

    def make_driver(self, training: Training, resume: dict | None):
        """The driver of one run: ``direct.DirectDriver`` where the run fits the direct path (one shard, an
        asynchronous rule that pulls before computing), else ``driver.Driver``; a subclass may return its own."""
        from .direct import DirectDriver, fits
        from .driver import Driver
        return (DirectDriver if fits(self, training) else Driver)(self, training, resume)

    def run(self, training: Training, *, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``training`` to its sample budget on Ray; ``resume`` is the state it last saved."""
        ray = ray_module()
        if resume is not None and resume.get("kind") != "ray":
            raise ConfigError("runtime", "is ray, but the checkpoint was made by another runtime; "
                                         "resume it with that runtime")
        started, driver, restore = False, None, None
        with _interruptible():
            try:
                if not ray.is_initialized():
                    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
                    if self.address is None:
                        kwargs["num_cpus"] = max(os.cpu_count() or 1,
                                                 int(self.cpus_per_worker * training.server.num_workers))
                        kwargs["_system_config"] = dict(LOCAL_SYSTEM_CONFIG)
                    started = True
                    # "local": a new instance, never one that RAY_ADDRESS or `ray start` points at
                    init_quietly(ray, address="local" if self.address is None else self.address, **kwargs)
                restore = divert_ray_errors(session_logs(ray))
                driver = self.make_driver(training, resume)
                if self.delay is not None:
                    driver.pace_by(self.profile(training), seed)
                driver.start()
                driver.run()
            finally:
                _cleanup(ray, driver, started)
                if restore is not None:
                    restore()


class _interruptible:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt in the driver while a run is on, so that the run's
    ``finally`` kills its actors and shuts down the Ray it started. Python's own handler does that
    already; SIG_DFL (an embedding host's, or one reset by a parent) would kill the driver on the
    spot, so it is replaced while the run is on. SIG_IGN (a shell's background job) and a handler
    of the caller's are left as they are."""

    def __enter__(self):
        self.replaced = threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, None)
        if self.replaced:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, *exc):
        if self.replaced:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        return False


def _cleanup(ray, driver, started: bool) -> None:
    """Kill the run's actors and shut down a Ray that this run started; a second Ctrl-C during
    this waits for it to finish rather than leave processes behind."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        if driver is not None:
            driver.stop()
        if started:   # (also after a failed ray.init: it may have started processes)
            ray.shutdown()
    finally:
        if main:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


__all__ = ["RayRuntime", "ray_module", "INSTALL"]

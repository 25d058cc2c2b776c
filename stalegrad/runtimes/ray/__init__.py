"""Training across machines on a Ray cluster (``--runtime ray``).

The same ``Worker`` and ``ParameterServer`` as every runtime, on Ray actors:

- ``--ps-shards K`` server actors (``actors.ShardActor``), each a
  ``ParameterServer`` over one contiguous slice of the weights, driven in
  lockstep with a two-phase push so that every shard counts the same versions
  and tau (``stalegrad/sharding.py`` explains and tests the design);
- one actor per worker (``actors.WorkerActor``), with ``--cpus-per-worker``
  and ``--gpus-per-worker`` as its Ray resource request;
- the driver (``driver.py``) holds the training run and waits on whichever
  worker finishes first (``ray.wait``).

Weights and messages travel as numpy arrays through Ray's object store: a
pull is K slices that the worker receives without a copy by the driver, a
push K slices that the shards receive the same way. Without ``address`` a
local Ray instance starts (bound to loopback); ``address="auto"`` or
``"HOST:PORT"`` joins a running cluster. Ray is an optional extra:
``pip install 'stalegrad[ray]'``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import ConfigError, check_finite_positive
from ..base import Training

INSTALL = "pip install 'stalegrad[ray]'"


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
    restart_timeout: float = 30.0      # seconds to wait for a restarted actor before giving up on it

    def __post_init__(self):
        if not isinstance(self.ps_shards, int) or isinstance(self.ps_shards, bool) or self.ps_shards < 1:
            raise ConfigError("ps_shards", f"must be a positive integer, got {self.ps_shards!r}")
        check_finite_positive("cpus_per_worker", self.cpus_per_worker)
        check_finite_positive("gpus_per_worker", self.gpus_per_worker, strict=False)
        check_finite_positive("restart_timeout", self.restart_timeout)
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError("max_restarts", f"must be a non-negative integer, got {self.max_restarts!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise ConfigError("address", f"must be 'auto' or HOST:PORT, got {self.address!r}")
        self.stats: dict = {}

    def check(self, config) -> None:
        """Ray is installed and the options fit the run (before anything is written)."""
        ray_module()
        if self.gpus_per_worker and not config.device.startswith("cuda"):
            raise ConfigError("gpus_per_worker", "needs device cuda: the workers would hold a GPU and not use it")
        if self.record_trace is not None:
            from ...rundir import check_writable
            check_writable("record_trace", self.record_trace)

    def describe(self) -> dict:
        return {"name": "ray", "address": self.address, "ps_shards": self.ps_shards,
                "cpus_per_worker": self.cpus_per_worker, "gpus_per_worker": self.gpus_per_worker,
                "record_trace": str(self.record_trace) if self.record_trace is not None else None}

    def run(self, training: Training, *, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``training`` to its sample budget on Ray; ``resume`` is the state it last saved."""
        ray = ray_module()
        if resume is not None and resume.get("kind") != "ray":
            raise ConfigError("runtime", "is ray, but the checkpoint was made by another runtime; "
                                         "resume it with that runtime")
        from .driver import Driver
        started = False
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if self.address is None:
                kwargs["num_cpus"] = max(os.cpu_count() or 1, int(self.cpus_per_worker * training.server.num_workers))
            ray.init(address=self.address, **kwargs)
            started = True
        driver = Driver(self, training, resume)
        try:
            driver.start()
            driver.run()
        finally:
            driver.stop()
            if started:
                ray.shutdown()


__all__ = ["RayRuntime", "ray_module", "INSTALL"]

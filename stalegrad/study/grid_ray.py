"""Grids across a Ray cluster: ``stalegrad grid FILE --out DIR --address HOST:PORT [--cpus-per-cell N]``.

``RayGridRun`` is a ``grid.GridRun`` whose cells run as Ray tasks instead of local children: one task
per cell, asking for N CPUs, each running ``stalegrad train --config CELL.toml`` with N torch threads
in a subprocess on its node, into a temporary directory there. The task returns the finished run
directory and the run's stderr as one tar (bytes, through Ray's object store), which the driver
writes into DIR/runs/<cell>/ and DIR/logs/<cell>.log by renames on DIR's own file system: no file
system is shared, and a run directory is never half there. Everything else is ``GridRun``'s: grid.json
after every cell, resume (a rerun skips finished cells), the two stages, progress, the report.

Before anything is written (``connect``): the address is joined as ``stalegrad train --runtime ray
--address`` joins it (``runtimes/ray/connect.probe``: the same one-line errors), some node must hold a
task of N CPUs, and every such node must run this machine's stalegrad version (one zero-CPU task
pinned to each; a node that joins later is checked by each cell's task, whose cell then fails with
the reason). The nodes run the stalegrad installed on them and load the data set from their own
disks (or a shared data_dir).

Faults: a task whose worker process or node dies is run again by Ray on another node, up to
``MAX_RETRIES`` times (its temporary directory is lost with it, so the cell starts afresh); a cell
is recorded ``failed`` with a one-line reason only when that is spent or the task cannot run.
Ctrl-C or SIGTERM cancels every task (``ray.cancel``: a KeyboardInterrupt in the task, which stops
its run as Ctrl-C does), forcibly after ``STOP_TIMEOUT`` s. Ray's own fault reports go to its session's
log directory (``stalegrad-ray-errors.log``), not the terminal.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .. import __version__
from ..errors import UsageError
from .grid import CHILD, GridRun

MAX_RETRIES = 3          # Ray runs a cell again on another node this often when its node or worker dies
VERSION_TIMEOUT = 60.0   # seconds for every node to answer the version check
STOP_TIMEOUT = 30.0      # seconds for cancelled cells to stop their runs before their workers are killed
CAPACITY_EVERY = 5.0     # seconds between two reads of the cluster's CPUs (cells in flight follow them)
FIX = "install the same stalegrad on every node (docs/cluster.md, Grids on a cluster)"
# `stalegrad train` as grid.CHILD starts it, watching its parent, the Ray worker: a worker killed
# (a forced cancel, a crash) must not leave its run computing unseen on the node.
NODE_CHILD = ("import os, signal, threading, time\n"
              "def _orphaned(parent=os.getppid()):\n"
              "    while os.getppid() == parent:\n"
              "        time.sleep(1)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "threading.Thread(target=_orphaned, daemon=True).start()\n" + CHILD)


# ---- on a node ------------------------------------------------------------------------------------
def node_info() -> dict:
    """The version check's task: what this node runs."""
    import ray
    return {"stalegrad": __version__, "ip": ray.util.get_node_ip_address(), "python": sys.version.split()[0]}


def run_cell(name: str, toml_text: str, threads: int, cwd: str, version: str) -> dict:
    """A cell's task: ``stalegrad train`` in a subprocess into a temporary directory, and its files
    as a tar: {"exit_code", "run_s", "files", "ip"}; {"problem"} when this node cannot run it."""
    import ray
    ip = ray.util.get_node_ip_address()
    if version != __version__:
        return {"problem": f"its node {ip} runs stalegrad {__version__}, the grid {version}; {FIX}", "ip": ip}
    with tempfile.TemporaryDirectory(prefix=f"stalegrad-cell-{name}-") as tmp:   # (ps on the node names the cell)
        config, log = Path(tmp) / "cell.toml", Path(tmp) / "cell.log"
        config.write_text(toml_text)
        cmd = [sys.executable, "-c", NODE_CHILD, "train", "--config", str(config), "--out", str(Path(tmp) / "run"),
               "--quiet"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        t0 = time.monotonic()
        with open(log, "wb") as err:   # relative paths of the cell resolve as on the driver, where they can
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                    cwd=cwd if os.path.isdir(cwd) else tmp)
        try:
            while proc.poll() is None:    # (a loop, not wait(): ray.cancel's KeyboardInterrupt lands here)
                time.sleep(0.1)
        finally:
            if proc.poll() is None:       # cancelled: the run stops as under Ctrl-C, then is killed
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=STOP_TIMEOUT / 2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        run_s = round(time.monotonic() - t0, 2)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            tar.add(log, arcname="cell.log")
            if (Path(tmp) / "run").is_dir():
                tar.add(Path(tmp) / "run", arcname="run")
        return {"exit_code": proc.returncode, "run_s": run_s, "files": buf.getvalue(), "ip": ip}


# ---- on the driver --------------------------------------------------------------------------------
def install(out: Path, name: str, files: bytes) -> None:
    """A cell's tar into DIR/logs/<name>.log and DIR/runs/<name>/, each by one rename (staged in runs/,
    on the same file system); a previous unfinished run directory of the cell is replaced."""
    runs = out / "runs"
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=runs))
    try:
        with tarfile.open(fileobj=io.BytesIO(files)) as tar:
            tar.extractall(staging, filter="data")   # (no path out of staging, no device files)
        if (staging / "cell.log").is_file():
            os.replace(staging / "cell.log", out / "logs" / f"{name}.log")
        if (staging / "run").is_dir():
            if (runs / name).exists():
                os.replace(runs / name, staging / "previous")
            os.replace(staging / "run", runs / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def one_line(error: BaseException) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else 'no message'}"


def capacity(nodes: list[dict], cpus: int) -> int:
    """How many tasks of ``cpus`` CPUs the nodes (their total ``resources``) hold at once."""
    return sum(math.floor(n["resources"].get("CPU", 0.0) / cpus + 1e-6) for n in nodes)


def offer(nodes: list[dict]) -> str:
    return " + ".join(f"{n['resources'].get('CPU', 0.0):g}" for n in nodes) or "0"


def version_problem(address: str, infos: list[dict]) -> str | None:
    """The line that refuses a cluster with a node on another stalegrad than this machine's, or None."""
    for info in infos:
        if info["stalegrad"] != __version__:
            return (f"--address {address}: node {info['ip']} runs stalegrad {info['stalegrad']}, this machine "
                    f"{__version__}; {FIX}")
    return None


class Cluster:
    """The driver's connection to the cluster for one grid (``connect``); ``close`` leaves the cluster up."""

    def __init__(self, ray, address: str, cpus_per_cell: int, nodes: list[dict], restore):
        self.ray, self.address, self.cpus_per_cell, self.nodes, self._restore = ray, address, cpus_per_cell, nodes, restore
        self.cell_task = ray.remote(num_cpus=cpus_per_cell, max_retries=MAX_RETRIES)(run_cell)

    def alive_nodes(self) -> list[dict]:
        return [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": n["Resources"]}
                for n in self.ray.nodes() if n["Alive"]]

    def describe(self, most: int | None = None) -> str:
        cpus, held = sum(n["resources"].get("CPU", 0.0) for n in self.nodes), capacity(self.nodes, self.cpus_per_cell)
        return (f"on the Ray cluster at {self.address} ({len(self.nodes)} nodes, {cpus:g} CPUs: "
                f"{min(held, most or held)} cells at once, {self.cpus_per_cell} CPU"
                f"{'s' * (self.cpus_per_cell > 1)} and torch thread{'s' * (self.cpus_per_cell > 1)} each)")

    def close(self) -> None:
        self._restore()
        self.ray.shutdown()    # this driver leaves; the cluster stays

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def connect(address: str, cpus_per_cell: int, connect_timeout: float | None = None) -> Cluster:
    """Join the cluster at ``address`` for a grid, or one line (UsageError, exit 2) saying why not."""
    from ..runtimes.ray import ray_module
    from ..runtimes.ray.connect import (CONNECT_TIMEOUT, divert_ray_errors, init_quietly, probe, session_logs,
                                       split_address)
    ray = ray_module()
    split_address(address)
    nodes = probe(address, connect_timeout or CONNECT_TIMEOUT)["nodes"]   # refused, unknown, a token: one line
    if not capacity(nodes, cpus_per_cell):
        join = f"ray start --address {address if address != 'auto' else 'HEAD:PORT'} --num-cpus {cpus_per_cell}"
        most = max((int(n["resources"].get("CPU", 0.0)) for n in nodes), default=0)
        smaller = f"give --cpus-per-cell {most} or less, or " if most else ""
        raise UsageError(f"--cpus-per-cell is {cpus_per_cell}, but no node of the Ray cluster at {address} has "
                         f"{cpus_per_cell} CPU{'s' * (cpus_per_cell > 1)} (its nodes offer CPU {offer(nodes)}); "
                         f"{smaller}add a node (`{join}`; a head started with --num-cpus 0 runs no cell)")
    init_quietly(ray, address=address, log_to_driver=False, include_dashboard=False, configure_logging=False)
    cluster = Cluster(ray, address, cpus_per_cell, nodes, divert_ray_errors(session_logs(ray)))
    try:
        check_versions(cluster)
    except BaseException:
        cluster.close()
        raise
    return cluster


def check_versions(cluster: Cluster) -> None:
    """One zero-CPU task pinned to each node that can run a cell: it must run this stalegrad."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ray = cluster.ray
    nodes = [n for n in cluster.alive_nodes() if capacity([n], cluster.cpus_per_cell)]
    task = ray.remote(num_cpus=0, max_retries=0)(node_info)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["id"], soft=False)).remote(): n
            for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=VERSION_TIMEOUT)
    if late:
        raise UsageError(f"--address {cluster.address}: node {refs[late[0]]['ip']} did not run stalegrad's version "
                         f"check within {VERSION_TIMEOUT:g} s; see `ray status`, or remove the node")
    infos = []
    for ref in ready:
        try:
            infos.append(ray.get(ref))
        except ray.exceptions.RayError as e:   # e.g. no stalegrad there: its worker cannot import the task
            cause = getattr(e, "cause", None) or e
            raise UsageError(f"--address {cluster.address}: node {refs[ref]['ip']} cannot run stalegrad's tasks "
                             f"({one_line(cause)}); {FIX}") from None
    problem = version_problem(cluster.address, infos)
    if problem:
        raise UsageError(problem)


class _Task:
    """A cell's Ray task where ``GridRun`` keeps a child process: ``poll()`` is None until it has ended."""

    def __init__(self, ref, board: "_Board"):
        self.ref, self.board, self.returncode = ref, board, None

    def poll(self):
        return 0 if self.ref in self.board.ended() else None


class _Board:
    """Which tasks have ended, by one ``ray.wait`` over all of them at most every 50 ms (``GridRun``
    polls each of its cells in turn)."""

    def __init__(self, ray):
        self.ray, self.pending, self.done, self.read = ray, [], set(), 0.0

    def add(self, ref) -> _Task:
        self.pending.append(ref)
        return _Task(ref, self)

    def ended(self) -> set:
        if self.pending and time.monotonic() - self.read > 0.05:
            ready, self.pending = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
            self.done.update(ready)
            self.read = time.monotonic()
        return self.done


class RayGridRun(GridRun):
    """``GridRun`` with each cell a Ray task on ``cluster`` (see the module docstring). ``jobs`` is the
    cells in flight: what the cluster's alive nodes hold at once, at most the ``jobs`` given (--jobs)."""

    def __init__(self, grid, out: Path, actions: dict, cluster: Cluster, jobs: int | None = None, on_cell=None):
        self.cluster, self.board = cluster, _Board(cluster.ray)
        self._capacity, self._read = capacity(cluster.nodes, cluster.cpus_per_cell), time.monotonic()
        super().__init__(grid, out, actions, jobs, cluster.cpus_per_cell, on_cell=on_cell)

    @property
    def jobs(self) -> int:
        if time.monotonic() - self._read > CAPACITY_EVERY:   # a node lost or joined: as many cells in flight
            with contextlib.suppress(Exception):
                self._capacity = capacity(self.cluster.alive_nodes(), self.cluster.cpus_per_cell)
            self._read = time.monotonic()
        return max(1, min(self._capacity, self._most or self._capacity))

    @jobs.setter
    def jobs(self, most: int | None) -> None:
        self._most = most

    def where(self) -> dict:
        return {"address": self.cluster.address, "cpus_per_cell": self.cluster.cpus_per_cell, "jobs": self.jobs,
                "threads_per_job": self.threads}

    def _start(self, cell) -> _Task:
        self.write_cell(cell)
        return self.board.add(self.cluster.cell_task.remote(cell.name, cell.toml, self.threads, os.getcwd(), __version__))

    def _finish(self, cell, task: _Task, t0: float) -> None:
        ray, rec = self.cluster.ray, self.records[cell.name]
        try:
            result = ray.get(task.ref)
        except ray.exceptions.RayError as e:   # its node died MAX_RETRIES + 1 times, or the task could not run
            cause = getattr(e, "cause", None) if isinstance(e, ray.exceptions.RayTaskError) else None
            why = f"its Ray task failed ({one_line(cause or e)})"
            if isinstance(e, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
                why = f"its Ray task was lost {MAX_RETRIES + 1} times, with its worker or node ({one_line(e)})"
            result = {"problem": why}
        if "problem" in result:
            rec.update(status="failed", exit_code=None, run_s=round(time.monotonic() - t0, 2),
                       reason=result["problem"], node=result.get("ip"))
            return
        install(self.out, cell.name, result["files"])
        task.returncode = result["exit_code"]
        super()._finish(cell, task, t0)
        rec.update(run_s=result["run_s"], node=result["ip"])   # the run's own time, not its wait in Ray's queue
        self.times[-1] = result["run_s"]

    def _stop(self, running: dict) -> None:
        """Ctrl-C: cancel every task (each stops its run as Ctrl-C does), kill the workers of those left."""
        ray, refs = self.cluster.ray, [task.ref for task in running]
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        with contextlib.suppress(KeyboardInterrupt):      # a second Ctrl-C: no more waiting
            _, late = ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT) if refs else ([], [])
            for ref in late:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        for rec in self.records.values():
            if rec["status"] == "running":
                rec.update(status="interrupted", exit_code=None, reason="interrupted; rerun the grid to run it again")

"""Joining a Ray cluster, checked before a run writes anything: the address, token authentication,
and whether the cluster can place the run's workers and server shards.

``ray.init(address=...)`` itself cannot be bounded: on Ray 2.60 it retries a refused or silent
address for more than ten minutes and a rejected token for about 20 s, printing a warning per try.
So ``probe`` first opens a plain TCP connection to HOST:PORT (refused, unknown host and unreachable
are told apart at once), then connects in a child Python process with a deadline (``timeout``),
which reads the cluster's nodes and resources and exits; a rejected token shows in that child's
log within a second, and the child is stopped there. The run's own ``ray.init`` comes afterwards.

``placement_problem`` is pure: it says which of the run's requests (CPUs, GPUs, custom resources)
the cluster's nodes cannot meet, from the nodes' totals, so that workers that could never be
placed are refused instead of waited for.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time

from ...errors import ConfigError

CONNECT_TIMEOUT = 30.0   # seconds; Ray's own connection to a healthy cluster takes about 1 s
AUTH_FIX = ("set RAY_AUTH_MODE=token, and copy the head's ~/.ray/auth_token to ~/.ray/auth_token here "
            "(chmod 600); see docs/cluster.md")

_PROBE = r"""
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, include_dashboard=False, configure_logging=False)
nodes = [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": n["Resources"]}
         for n in ray.nodes() if n["Alive"]]
print("STALEGRAD-PROBE " + json.dumps({"nodes": nodes, "available": ray.available_resources(),
                                       "version": ray.__version__}), flush=True)
"""
_AUTH_SIGNS = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError",
               "Token authentication is enabled but")


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of HOST:PORT, None for "auto"; ConfigError for anything else."""
    if address == "auto":
        return None
    if "://" in address:
        raise ConfigError("address", f"must be 'auto' or HOST:PORT of the head's GCS (e.g. 10.0.0.5:6379), got "
                                     f"{address!r}; Ray Client addresses (ray://) are not supported: run stalegrad on "
                                     "a machine of the cluster")
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("address", f"must be 'auto' or HOST:PORT (the address `ray start --head` printed, "
                                     f"e.g. 10.0.0.5:6379), got {address!r}")
    return host, int(port)


def _tcp(address: str, host: str, port: int, timeout: float) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except socket.gaierror:
        raise ConfigError("address", f"is {address}, but the host {host!r} is unknown here; give the head's "
                                     "IP address or a name this machine resolves") from None
    except ConnectionRefusedError:
        raise ConfigError("address", f"is {address}, but nothing listens there (connection refused); start the "
                                     f"head with `ray start --head --port {port}`, or give the address it "
                                     "printed") from None
    except (TimeoutError, socket.timeout):
        reason = f"no answer within {timeout:g} s"
    except OSError as e:
        reason = e.strerror or str(e)
    raise ConfigError("address", f"is {address}, but it cannot be reached from here ({reason}); check the "
                                 "address, that the head is up, and that no firewall blocks the port, or raise "
                                 "connect_timeout")


def probe(address: str, timeout: float = CONNECT_TIMEOUT) -> dict:
    """The alive nodes and resources of the cluster at ``address`` ("auto" or HOST:PORT), read
    within ``timeout`` seconds; ConfigError (one line, naming the fix) when it cannot be joined."""
    start = time.monotonic()
    hostport = split_address(address)
    if hostport is not None:
        _tcp(address, *hostport, timeout=timeout)
    left = max(1.0, timeout - (time.monotonic() - start))
    env = dict(os.environ, RAY_BACKEND_LOG_LEVEL=os.environ.get("RAY_BACKEND_LOG_LEVEL", "warning"))
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, address], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err: list[str] = []
    auth = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err.append(line)
            if any(sign in line for sign in _AUTH_SIGNS):
                auth.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    deadline = time.monotonic() + left
    while proc.poll() is None and not auth.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    timed_out = proc.poll() is None and not auth.is_set()
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate()[0] or ""
    reader.join(timeout=5)
    text = "".join(err)
    if auth.is_set() or any(sign in text for sign in _AUTH_SIGNS):
        mode = os.environ.get("RAY_AUTH_MODE")
        why = "RAY_AUTH_MODE is not set here" if mode is None else f"RAY_AUTH_MODE is {mode!r} here" \
            if mode.lower() != "token" else "the token here is missing or not the head's"
        raise ConfigError("address", f"is {address}, but the cluster refused this machine's token ({why}); "
                                     f"{AUTH_FIX}")
    for line in out.splitlines():
        if line.startswith("STALEGRAD-PROBE "):
            return json.loads(line[len("STALEGRAD-PROBE "):])
    if timed_out:
        raise ConfigError("address", f"is {address}, but Ray could not connect to it within {timeout:g} s; check "
                                     f"that it is the GCS port of a running head (`ray status --address {address}` "
                                     "on the head), or raise connect_timeout")
    if "Could not find any running Ray instance" in text:
        raise ConfigError("address", "is auto, but no Ray cluster runs on this machine; start one with "
                                     "`ray start --head`, or give HOST:PORT of the head")
    last = next((ln.strip() for ln in reversed(text.splitlines())
                 if ln.strip() and ("Error" in ln or "error" in ln)), "no error message")
    if "ersion mismatch" in text or "version" in last.lower():
        raise ConfigError("address", f"is {address}, but its Ray version differs from this machine's (Ray "
                                     f"says: {last[:300]}); install the same Ray and Python on every machine")
    raise ConfigError("address", f"is {address}, but Ray could not connect to it ({last[:300]})")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _fits(avail: dict, req: dict) -> int:
    """How many copies of request ``req`` fit in ``avail`` (Ray counts resources in 1e-4 units)."""
    n = math.inf
    for name, amount in req.items():
        if amount > 0:
            n = min(n, math.floor(avail.get(name, 0.0) / amount + 1e-6))
    return n


def placement_problem(nodes: list[dict], workers: int, shards: int, worker_request: dict,
                      shard_request: dict) -> dict | None:
    """Whether the nodes (each with its total ``resources``) can hold ``shards`` actors asking
    ``shard_request`` and ``workers`` actors asking ``worker_request`` at once: None when they can,
    else {"what": "shards" or "workers", "placed": how many fit, "short": the resources that run out,
    "asks": "1 CPU, ...", "offer": "CPU 0 + 1; ..." (per node)}."""
    free = [dict(n["resources"]) for n in nodes]

    def report(what, placed, want, short):
        return {"what": what, "placed": placed, "short": short,
                "asks": ", ".join(f"{_fmt(want[k])} {k}{'s' if k in ('CPU', 'GPU') and want[k] > 1 else ''}"
                                  for k in want),
                "offer": "; ".join(f"{k} {' + '.join(_fmt(r.get(k, 0.0)) for r in free) or 0}" for k in short)}
    need = {k: v for k, v in shard_request.items() if v > 0}
    for i in range(shards if need else 0):
        node = next((r for r in free if _fits(r, need) >= 1), None)
        if node is None:
            short = [k for k in need if max((_fits(r, {k: need[k]}) for r in free), default=0) < 1] or list(need)
            return report("shards", i, need, short)
        for k, v in need.items():
            node[k] -= v
    want = {k: v for k, v in worker_request.items() if v > 0}
    placed = min(workers, sum(min(_fits(r, want), workers) for r in free)) if want else workers
    if placed >= workers:
        return None
    short = [k for k in want if sum(min(_fits(r, {k: want[k]}), workers) for r in free) < workers] or list(want)
    return report("workers", placed, want, short)


def divert_ray_errors(log_dir: str | None):
    """Send the error messages Ray publishes to the driver ("Raylet is terminated ... Last 20 lines",
    "(raylet) A worker died ...") to ``log_dir``/stalegrad-ray-errors.log instead of the terminal;
    ``log_to_driver=False`` does not stop them. Returns a function that puts Ray's printer back."""
    path = os.path.join(log_dir, "stalegrad-ray-errors.log") if log_dir else None

    def to_file(data, ignore_prefix=False):
        if path is None:
            return
        try:
            with open(path, "a", encoding="utf-8") as f:
                for line in data.get("lines", ()):
                    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ({data.get('pid', '?')}) {line}\n")
        except OSError:
            pass
    return replace_ray_error_printer(to_file)


def replace_ray_error_printer(printer):
    """Make ``printer`` the function through which Ray prints what it publishes to the driver; returns the
    function that puts Ray's own back.

    Ray has no public setting for this: its error listener thread calls the module-level function
    ``ray._private.worker.print_to_stdstream`` by name, so only replacing that name reaches it. Where a
    Ray release moves or renames it, nothing is replaced and Ray's messages reach the terminal, as they
    would without stalegrad: a noisier run, never a failed one."""
    try:
        from ray._private import worker as ray_worker
        original = ray_worker.print_to_stdstream
    except (ImportError, AttributeError):
        return lambda: None
    ray_worker.print_to_stdstream = printer

    def restore():
        if ray_worker.print_to_stdstream is printer:
            ray_worker.print_to_stdstream = original
    return restore


# Ray's notices at ray.init, printed by the handler Ray puts on its "ray" logger when imported, whatever
# configure_logging says: "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled
# ..." on every local instance started with RAY_AUTH_MODE unset (Ray then turns tokens on itself), and on
# joining a cluster with a token file here; "... is disabled ..." likewise. A logger's name, not an import:
# where Ray renames the module, the notices reach the terminal again and nothing fails.
TOKEN_NOTICES = "ray._private.authentication.authentication_token_setup"


class _Held(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ({record.levelname}) {record.getMessage()}")


def init_quietly(ray, **kwargs) -> None:
    """``ray.init(**kwargs)`` with Ray's token notices kept off the terminal: they go to the session's
    logs (``stalegrad-ray-errors.log``, beside its fault reports) once ``ray.init`` has made them.
    Errors are not held back: a refused token raises, as before."""
    logger, held = logging.getLogger(TOKEN_NOTICES), _Held()
    propagate = logger.propagate
    logger.addHandler(held)
    logger.propagate = False
    try:
        ray.init(**kwargs)
    finally:
        logger.removeHandler(held)
        logger.propagate = propagate
    log_dir = session_logs(ray)
    if held.lines and log_dir:
        try:
            with open(os.path.join(log_dir, "stalegrad-ray-errors.log"), "a", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in held.lines)
        except OSError:
            pass


def session_logs(ray) -> str | None:
    """The logs directory of this driver's Ray session, TEMP_DIR/SESSION_NAME/logs as Ray documents it
    (None where this Ray does not say, or the directory is not there)."""
    try:
        context = ray.get_runtime_context()
        path = os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")
    except Exception:   # an older Ray without these, or not initialised: no logs directory, not an error
        return None
    return path if os.path.isdir(path) else None


def room_for(ray, request: dict) -> bool:
    """Whether the cluster has, free now, the resources of one more actor asking ``request`` (summed
    over the nodes: a request split across two nodes' leftovers reads as room, and is then waited for)."""
    try:
        free = ray.available_resources()
    except Exception:
        return True
    return _fits(free, {k: v for k, v in request.items() if v > 0}) >= 1


def wait_started(ray, shards: list, actors: dict, request: dict, say, every: float = 30.0) -> list:
    """Wait until every shard and worker actor answers a ping; the workers whose actor died meanwhile
    (its node lost while it started). While some have not answered, say so every ``every`` seconds
    instead of waiting in silence, naming the time waited: "still starting" where the cluster has room
    for one more worker (``request``) now, else both causes, since Ray does not tell an actor that holds
    its resources and starts slowly (Ray runs actors at nice 15) from one that waits for resources other
    jobs hold. Each ``ray.wait`` ends at the next notice's time: it returns only at its timeout unless
    every actor has answered, so the zero-CPU shards, which answer at once, must not restart the count."""
    pending = {s.ping.remote(): None for s in shards}
    pending.update({a.ping.remote(): m for m, a in actors.items()})
    dead, start = [], time.monotonic()
    notice = start + every
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, notice - time.monotonic()))
        for ref in ready:
            m = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                if m is None:
                    raise
                dead.append(m)
        now = time.monotonic()
        if pending and now >= notice:
            notice = now + every
            workers = sum(m is not None for m in pending.values())
            what = f"{workers} worker and {len(pending) - workers} shard actors after {now - start:.0f} s"
            if room_for(ray, request):
                say(f"still starting {what} (a loaded machine starts them slowly)")
            else:
                say(f"still waiting for {what}: they are starting (slowly on a loaded machine), or waiting "
                    "for resources that other jobs hold (see `ray status`)")
    return sorted(dead)


def shard_placement(ray, shard_resources: dict | None) -> dict:
    """Ray options of a server shard: on the nodes offering ``shard_resources`` when given, else on the
    head node, where the guide runs the driver, which exchanges every message with them, and whose loss
    ends the cluster anyway; a worker node that dies then takes no shard with it. The affinity is hard:
    Ray 2.60's soft affinity spilled 1 of 3 zero-CPU actors to another node with the head idle."""
    if shard_resources:
        return {"resources": dict(shard_resources)}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    head = next((n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]),
                None)
    if head is None:   # no head in the list (not seen on 2.60): the driver's node, where it can
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                      soft=True)}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False)}

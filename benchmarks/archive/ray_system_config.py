"""Whether a head started with ``--system-config='{"max_direct_call_object_size": 1048576}'`` carries a small
model's messages inside Ray's task messages, as the local instance that ``--runtime ray`` starts does.

    .venv/bin/python benchmarks/archive/ray_system_config.py     # about a minute: two heads, one after the other

For Ray's default and for the 1 MiB limit, it starts a head as docs/cluster.md does (``ray start --head
--block``, token authentication, in a temporary HOME and temp dir, on a free port), joins it from a child
process (``ray.init(address=...)``) and, on that cluster:

- returns five 203 KB arrays (a digits-mlp message) from an actor and counts the objects in the
  shared-memory object store (``memory_summary``): 0 when they travel inline;
- times an actor-to-actor call with such an array as argument and result (median ms), the shape of a
  worker's push that returns its next weights on the direct path.

Each head is stopped by its own process (SIGTERM, then its session's group); nothing else is touched.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
CHILD = r"""
import json, sys
import numpy as np, ray
ray.init(address=sys.argv[1], log_to_driver=False, include_dashboard=False, configure_logging=False)

sys.path.insert(0, sys.argv[2])
from common import echo_actors   # the benchmarks' folder: the same actors as ray_overhead.py's

echo, caller = echo_actors(ray)
message = np.zeros(50_826, np.float32)
held = ray.get([echo.make.remote() for _ in range(5)])
from ray._private.internal_api import memory_summary
line = next(l for l in memory_summary(address=sys.argv[1], stats_only=True).splitlines() if "Plasma memory usage" in l)
objects = int(line.split(",")[1].split()[0])
ray.get(caller.calls.remote(echo, message, 5))
print("RESULT " + json.dumps({"plasma_objects_for_5_messages": objects, "plasma_line": line.strip(),
                              "actor_to_actor_with_message_ms": ray.get(caller.calls.remote(echo, message, 300))}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def one_head(config: dict | None) -> dict:
    base = Path(tempfile.mkdtemp(prefix="sgcfg"))   # short: Ray's socket paths live under --temp-dir
    home = base / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_AUTH_MODE="token")
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=120)
    (home / ".ray" / "auth_token").chmod(0o600)
    port, log = free_port(), base / "head.log"
    cmd = [RAY, "start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard=false",
           "--disable-usage-stats", "--temp-dir", str(base / "t"), "--block"]
    if config is not None:
        cmd.append("--system-config=" + json.dumps(config))
    head = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log.read_text()[-2000:])
            time.sleep(0.2)
        ip = log.read_text().split("Local node IP: ")[1].split()[0]
        child = subprocess.run([sys.executable, "-c", CHILD, f"{ip}:{port}", str(Path(__file__).parent)], env=env, capture_output=True,
                               text=True, timeout=300)
        lines = [ln for ln in child.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(child.stderr[-2000:])
        return {"system_config": config, **json.loads(lines[0][len("RESULT "):])}
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)   # `ray start --block` stops its Ray processes on SIGTERM
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(head.pid, signal.SIGKILL)   # whatever of its session is left
        except ProcessLookupError:
            pass
        head.wait()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    load = [round(x, 2) for x in os.getloadavg()]
    rows = [one_head(None), one_head({"max_direct_call_object_size": 1 << 20})]
    for r in rows:
        print(f"head --system-config {json.dumps(r['system_config']) if r['system_config'] else '(none)'}: "
              f"{r['plasma_objects_for_5_messages']} of 5 returned 203 KB arrays in the object store; actor -> actor "
              f"call with one as argument and result {r['actor_to_actor_with_message_ms']:.3f} ms")
    print(f"load average {load} -> {[round(x, 2) for x in os.getloadavg()]}, nproc {os.cpu_count()}")


if __name__ == "__main__":
    main()

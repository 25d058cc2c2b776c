"""The direct path's socket: a worker on the server shard's machine pushes and pulls through a Unix socket.

On the direct path (``direct.py``) an update is one call from a worker to the shard: its message there, the
next weights back. As a Ray call that costs more CPU than a small model's whole update (docs/performance.md,
section 6: 2.4 ms for the digits mlp's 50,826 floats both ways, against 1 ms for the local runtime's
update). A worker on the same machine makes the same call over a socket of its own instead: the shard
listens on a Unix socket, one thread per connected worker, and each call is one message each way
(``Wire``: a pickle whose arrays travel beside it, each copied once into the socket and once out of it).
Everything else still goes through Ray: the plan, the driver's polls, checkpoints, faults, the calls of a
worker on another machine, and every call of a model whose weights exceed ``MAX_BYTES``.

- **Same machine, found by trying**: the address is in Linux's abstract socket namespace (no file, gone
  with the shard's process), so a worker elsewhere (another machine, another network namespace) finds
  nothing there, and falls back to the Ray call (``connect`` returns None). Elsewhere than Linux there is no
  socket (``available``).
- **Only the run's workers**: a random key, handed to the workers through Ray, authenticates each
  connection (multiprocessing's HMAC challenge) before anything is read from it; anything else that
  connects is dropped, and one that never answers holds only its own thread, never the others' accept.
- **Faults as with a Ray call**: a shard that dies closes its sockets with its process, and the worker's call
  raises ``ChannelClosed`` (the worker reports LOST, as for a dead actor); a worker that dies closes its
  end, and the shard's thread for it ends. An error inside the call (a NaN under ``on_nonfinite`` "stop")
  reaches the worker as ``RemoteError`` with the exception's type name and first line.

One lock orders the socket threads' calls with the calls Ray makes to the shard (``actors.ShardActor``).
Pure Python: no Ray here.
"""
from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import sys
import threading
from multiprocessing.connection import AuthenticationError, Client, Listener, answer_challenge, deliver_challenge


# The largest weights (in bytes) served through the socket; above it, Ray calls. Up to this size Ray copies
# the bytes through its own sockets (the 1 MiB inline limit, ``ray.INLINE_BYTES``) and the socket here is
# 5 to 10 times cheaper. Above it Ray hands them over in its shared-memory object store, in one copy,
# whereas a socket moves them through a kernel buffer of about 200 KB, so the sender waits for the
# receiver to be on a core again and again: timed alone the socket still wins at 19 MB (8 against 10 to
# 25 ms), but in training, agn-mlp's four workers sharing two cores, its throughput fell to 0.8 of Ray
# calls' (docs/performance.md, section 6).
MAX_BYTES = 1 << 20


class ChannelClosed(ConnectionError):
    """The shard's end of the socket is gone (its process died or was restarted)."""


class RemoteError(RuntimeError):
    """An exception inside a call on the shard: ``kind`` is its type's name, the message its first line."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


class Wire:
    """One end of an authenticated connection (``multiprocessing.connection``), sending and receiving objects
    whose arrays (pickle protocol 5's out-of-band buffers: numpy arrays, a model's weights) go through the
    socket as they are: one copy into it and one out of it, into a new writable buffer, where a plain
    pickle would copy a 19 MB message twice more on each side. The frame: the buffers' count and sizes
    with the pickle, then each buffer's bytes."""

    def __init__(self, conn):
        self.conn = conn
        self.sock = socket.socket(fileno=os.dup(conn.fileno()))   # (the same socket, for the raw buffers)

    def send(self, obj) -> None:
        buffers = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        self.conn.send_bytes(struct.pack(f"!Q{len(raws)}Q", len(raws), *(r.nbytes for r in raws)) + head)
        for raw in raws:
            self.sock.sendall(raw)

    def recv(self):
        first = self.conn.recv_bytes()
        (n,) = struct.unpack_from("!Q", first)
        buffers = []
        for size in struct.unpack_from(f"!{n}Q", first, 8):
            buf = bytearray(size)
            view, got = memoryview(buf), 0
            while got < size:
                k = self.sock.recv_into(view[got:])
                if k == 0:
                    raise EOFError("the other end closed the socket")
                got += k
            buffers.append(buf)
        return pickle.loads(memoryview(first)[8 + 8 * n:], buffers=buffers)

    def close(self) -> None:
        self.sock.close()
        self.conn.close()


def available() -> bool:
    """Whether this platform has abstract Unix sockets (Linux)."""
    return sys.platform.startswith("linux")


class ShardListener:
    """Serve ``handle(op, *args)`` under ``lock`` to every worker that connects with the key."""

    def __init__(self, handle, lock):
        self.handle, self.lock = handle, lock
        self.key = secrets.token_bytes(32)
        self.address = "\0stalegrad-shard-" + secrets.token_hex(16)   # (the leading NUL: abstract namespace)
        # (no authkey here: Listener.accept would run the challenge itself, and a peer that never answers
        # would stop every later worker from connecting; each connection's thread runs it instead)
        self.listener = Listener(self.address, family="AF_UNIX")
        self.served = 0   # calls answered since the owner last took the count (``take_served``)
        threading.Thread(target=self._accept, name="stalegrad-shard-socket", daemon=True).start()

    @property
    def channel(self) -> tuple[str, bytes]:
        return self.address, self.key

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:
                return     # the listener was closed
            threading.Thread(target=self._serve, args=(conn,), name="stalegrad-shard-worker", daemon=True).start()

    def _serve(self, conn) -> None:
        try:
            deliver_challenge(conn, self.key)   # (both ways, as Listener(authkey=...) does)
            answer_challenge(conn, self.key)
        except (AuthenticationError, EOFError, OSError):
            conn.close()   # (a connection without the key, or one that left during the challenge)
            return
        wire = Wire(conn)
        try:
            while True:
                op, args = wire.recv()
                try:
                    with self.lock:
                        reply = (True, self.handle(op, *args))
                        self.served += 1
                except Exception as e:   # noqa: BLE001  (it goes to the caller, as a Ray call's error does)
                    reply = (False, (type(e).__name__, (str(e).splitlines() or [""])[0]))
                wire.send(reply)
        except (EOFError, OSError):
            pass   # the worker's process ended
        finally:
            wire.close()

    def take_served(self) -> int:
        """The calls answered since the last time (under the lock)."""
        served, self.served = self.served, 0
        return served

    def close(self) -> None:
        self.listener.close()


class ShardConnection:
    """A worker's end: ``call(op, *args)`` returns what the shard's ``handle`` returned."""

    def __init__(self, conn):
        self.wire = Wire(conn)

    def call(self, op: str, *args):
        try:
            self.wire.send((op, args))
            ok, value = self.wire.recv()
        except (EOFError, OSError) as e:
            raise ChannelClosed("the server shard's socket closed") from e
        if not ok:
            raise RemoteError(*value)
        return value

    def close(self) -> None:
        self.wire.close()


def connect(channel: tuple[str, bytes] | None) -> ShardConnection | None:
    """A connection to the shard's socket, or None where there is none to reach from here (another
    machine or network namespace, another platform): the caller then uses a Ray call."""
    if channel is None or not available():
        return None
    address, key = channel
    try:
        return ShardConnection(Client(address, family="AF_UNIX", authkey=key))
    except (OSError, EOFError, AuthenticationError):
        return None

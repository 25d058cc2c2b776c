"""The direct path's socket: a worker on the server shard's machine pushes and pulls through a Unix socket.

On the direct path (``direct.py``) an update is one call from a worker to the shard: its message there, the
next weights back. As a Ray call that costs more CPU than a small model's whole update (benchmarks/archive/NOTES.md,
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
  connects is dropped. Any local user can reach the address (``/proc/net/unix`` lists it), so a peer gets
  ``HANDSHAKE_S`` to answer, at most ``MAX_UNAUTHENTICATED`` peers are in their challenge at once (more are
  closed on arrival), and the accept loop outlives a lack of descriptors or threads (it backs off and goes
  on). A worker gives the socket ``CONNECT_S`` to connect and authenticate, else it makes its calls through
  Ray, with the same bits (``attempt`` says why; the driver notes it once for the run, with the listener's
  first accept error, ``ShardListener.trouble``). So a local peer can slow a run down to Ray calls, not stop
  or alter it.
- **Faults as with a Ray call**: a shard that dies closes its sockets with its process, and the worker's call
  raises ``ChannelClosed`` (the worker reports LOST, as for a dead actor); a worker that dies closes its
  end, and the shard's thread for it ends. An error inside the call (a NaN under ``on_nonfinite`` "stop")
  reaches the worker as ``RemoteError`` with the exception's type name and first line.

One lock orders the socket threads' calls with the calls Ray makes to the shard (``actors.ShardActor``).
Pure Python: no Ray here.
"""
from __future__ import annotations

import errno
import os
import pickle
import secrets
import socket
import struct
import sys
import threading
import time
from multiprocessing.connection import (AuthenticationError, Connection, Listener, answer_challenge,
                                        deliver_challenge)


# The largest weights (in bytes) served through the socket; above it, Ray calls. Up to this size Ray copies
# the bytes through its own sockets (the 1 MiB inline limit, ``ray.INLINE_BYTES``) and the socket here is
# 5 to 10 times cheaper. Above it Ray hands them over in its shared-memory object store, in one copy,
# whereas a socket moves them through a kernel buffer of about 200 KB, so the sender waits for the
# receiver to be on a core again and again: timed alone the socket still wins at 19 MB (8 against 10 to
# 25 ms), but in training, agn-mlp's four workers sharing two cores, its throughput fell to 0.8 of Ray
# calls' (benchmarks/archive/NOTES.md, section 6).
MAX_BYTES = 1 << 20
HANDSHAKE_S = 1.0          # seconds a connecting peer has to answer the key's challenge
MAX_UNAUTHENTICATED = 32   # peers in their challenge at once; more are closed on arrival (a run has few workers)
CONNECT_S = 2.0            # seconds a worker gives the shard's socket to connect and authenticate


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


def _time_limit(conn, seconds: float) -> None:
    """Reads and writes on ``conn`` fail (OSError) after ``seconds`` of waiting; 0: they wait for ever."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))   # (a duplicate: the options are the socket's own)
    limit = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    sock.close()


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
        self.unauthenticated = 0   # peers in their challenge now
        self.refused = 0           # peers closed on arrival: MAX_UNAUTHENTICATED were in their challenge
        self.trouble = None        # the first error that kept accept from taking a worker ("Too many open files")
        self.closed = False
        self._count = threading.Lock()
        threading.Thread(target=self._accept, name="stalegrad-shard-socket", daemon=True).start()

    @property
    def channel(self) -> tuple[str, bytes]:
        return self.address, self.key

    def _accept(self) -> None:
        pause = 0.01
        while not self.closed:
            try:
                conn = self.listener.accept()
                with self._count:
                    full = self.unauthenticated >= MAX_UNAUTHENTICATED
                    self.unauthenticated += not full
                if full:
                    self.refused += 1
                    conn.close()
                    continue
                try:
                    threading.Thread(target=self._serve, args=(conn,), name="stalegrad-shard-worker",
                                     daemon=True).start()
                except RuntimeError:   # (no thread to be had now: as a lack of descriptors below)
                    with self._count:
                        self.unauthenticated -= 1
                    conn.close()
                    raise OSError("cannot start a thread") from None
                pause = 0.01
            except OSError as e:
                if self.closed:
                    return     # the listener was closed
                # out of descriptors (EMFILE), memory or threads: for a while, not for good. The driver says so
                # once for the run (direct.py), if a worker made Ray calls for it; the shard prints nothing.
                self.trouble = self.trouble or (e.strerror or str(e))
                time.sleep(pause)
                pause = min(1.0, 2 * pause)

    def _serve(self, conn) -> None:
        try:
            _time_limit(conn, HANDSHAKE_S)
            deliver_challenge(conn, self.key)   # (both ways, as Listener(authkey=...) does)
            answer_challenge(conn, self.key)
            _time_limit(conn, 0)
        except (AuthenticationError, EOFError, OSError):
            conn.close()   # (without the key, silent past the deadline, or gone during the challenge)
            return
        finally:
            with self._count:
                self.unauthenticated -= 1
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
        self.closed = True
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
    machine or network namespace, another platform) or it did not take this worker: the caller then uses
    a Ray call."""
    return attempt(channel)[0]


# What connect() meets where no shard of this machine listens at the address: the worker is elsewhere.
_ELSEWHERE = (errno.ECONNREFUSED, errno.ENOENT)


def attempt(channel: tuple[str, bytes] | None) -> tuple[ShardConnection | None, str | None]:
    """(``connect(channel)``, why a socket that is there did not take this worker, or None): a listener that
    cannot accept (out of descriptors: the kernel queues the connection, or refuses it when its queue is full),
    a challenge not answered within ``CONNECT_S``, a wrong key. None also where there is no socket to reach,
    which is where a worker on another machine is: it makes Ray calls as it should."""
    if channel is None or not available():
        return None, None
    address, key = channel
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:   # (multiprocessing's Client, with a deadline: a shard that cannot serve now costs CONNECT_S once)
        sock.settimeout(CONNECT_S)
        sock.connect(address)
        sock.settimeout(None)
        conn = Connection(sock.detach())
    except OSError as e:
        sock.close()
        if e.errno in _ELSEWHERE:
            return None, None
        return None, f"connecting failed: {e.strerror or 'no answer'} within {CONNECT_S:g} s"
    try:
        _time_limit(conn, CONNECT_S)
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
        _time_limit(conn, 0)
        return ShardConnection(conn), None
    except (OSError, EOFError, AuthenticationError) as e:
        conn.close()
        why = ("the key was refused" if isinstance(e, AuthenticationError) else
               "it closed the connection" if isinstance(e, EOFError) else f"no answer within {CONNECT_S:g} s")
        return None, f"connected, but {why}"

"""The direct path's socket (``runtimes/ray/channel.py``), without Ray: a call and its reply, an error inside
a call, the key, an address nobody serves, a shard whose process dies, a worker that leaves, and the lock
that orders the socket's calls with the others."""
import multiprocessing as mp
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from stalegrad.algorithms import make_algorithm
from stalegrad.runtimes.ray import INLINE_BYTES
from stalegrad.runtimes.ray.actors import ShardActor
from stalegrad.runtimes.ray.channel import (MAX_BYTES, ChannelClosed, RemoteError, ShardListener, attempt, available,
                                           connect)
from stalegrad.runtimes.ray.ledger import GO, WAIT

pytestmark = pytest.mark.skipif(not available(), reason="abstract Unix sockets are Linux's")


def echo(op, *args):
    if op == "fail":
        raise ValueError("first line\nsecond line")
    return op, args


@pytest.fixture
def listener():
    lst = ShardListener(echo, threading.Lock())
    yield lst
    lst.close()


def test_a_call_returns_what_the_handler_returned_and_arrays_arrive_whole(listener):
    conn = connect(listener.channel)
    msg = np.random.default_rng(0).standard_normal(50_826).astype(np.float32)
    op, (m, got) = conn.call("push", 3, msg)
    assert (op, m) == ("push", 3) and got.dtype == np.float32 and np.array_equal(got, msg)
    assert conn.call("pull", 1, 0) == ("pull", (1, 0))
    # a message of agn-mlp's size, beside others, nested, one of them not contiguous (it goes inside the pickle)
    big = np.arange(4_798_010, dtype=np.float32)
    stride = np.arange(10, dtype=np.float64)[::2]
    _, (parts, meta) = conn.call("push", [big, {"s": stride}], (0.5, 16, True, None))
    assert np.array_equal(parts[0], big) and np.array_equal(parts[1]["s"], stride) and meta == (0.5, 16, True, None)
    parts[0][0] = -1.0   # (a new buffer, the receiver's to keep and change)
    assert big[0] == 0.0
    assert listener.served == 3
    assert listener.address.startswith("\0")   # the abstract namespace: no file to leave behind
    conn.close()


def test_an_error_inside_a_call_reaches_the_caller_with_its_type_and_first_line_and_the_socket_goes_on(listener):
    conn = connect(listener.channel)
    with pytest.raises(RemoteError, match=r"^first line$") as e:
        conn.call("fail")
    assert e.value.kind == "ValueError"
    assert conn.call("pull", 2, 0) == ("pull", (2, 0))
    conn.close()


def test_without_the_key_nothing_connects_and_the_run_s_workers_still_do(listener):
    address, key = listener.channel
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(address)   # connects and never answers the challenge: it must not hold the others up

    def within(seconds, fn):   # (what would hang behind the silent peer fails instead)
        out = []
        t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
        t.start()
        t.join(seconds)
        assert out, f"no answer within {seconds} s"
        return out[0]

    assert within(10, lambda: connect((address, bytes(32)))) is None
    assert connect(("\0stalegrad-shard-nobody-listens-here", key)) is None
    assert connect(None) is None
    conn = within(10, lambda: connect(listener.channel))
    assert conn.call("pull", 0, 0) == ("pull", (0, 0))
    conn.close()
    silent.close()


def _serve_forever(queue):
    lst = ShardListener(echo, threading.Lock())
    queue.put(lst.channel)
    time.sleep(600)


def test_a_shard_whose_process_dies_closes_the_socket_at_once():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_serve_forever, args=(queue,), daemon=True)
    proc.start()
    try:
        channel = queue.get(timeout=60)
        conn = connect(channel)
        assert conn.call("pull", 0, 0) == ("pull", (0, 0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        t = time.monotonic()
        with pytest.raises(ChannelClosed):
            conn.call("push", 0, 0)
        assert time.monotonic() - t < 2
        assert connect(channel) is None   # (a restarted shard listens elsewhere: the worker falls back or gets the new one)
    finally:
        proc.kill()


def test_a_worker_that_leaves_ends_its_thread_on_the_shard(listener):
    before = set(threading.enumerate())
    conn = connect(listener.channel)
    conn.call("pull", 0, 0)
    mine = [t for t in set(threading.enumerate()) - before if t.name == "stalegrad-shard-worker"]
    assert len(mine) == 1 and mine[0].is_alive()
    conn.close()
    mine[0].join(5)
    assert not mine[0].is_alive()


def test_the_lock_orders_the_socket_s_calls_with_everything_else():
    lock, inside, overlaps = threading.Lock(), [], []

    def handle(op, *args):
        inside.append(op)
        if len(inside) > 1:
            overlaps.append(tuple(inside))
        time.sleep(0.002)
        inside.remove(op)
        return op

    lst = ShardListener(handle, lock)
    conns = [connect(lst.channel) for _ in range(3)]

    def hammer(conn, name):
        for _ in range(30):
            assert conn.call(name) == name

    workers = [threading.Thread(target=hammer, args=(c, f"w{i}")) for i, c in enumerate(conns)]
    for w in workers:
        w.start()
    for _ in range(30):   # what Ray's thread does: the same state, under the same lock
        with lock:
            handle("ray")
    for w in workers:
        w.join()
    assert overlaps == [] and lst.served == 90
    for c in conns:
        c.close()
    lst.close()


def test_a_shard_opens_its_socket_for_weights_up_to_ray_s_inline_limit_only():
    # (the class that Ray runs as the shard actor, here as a plain object)
    assert MAX_BYTES == INLINE_BYTES   # above it, Ray's object store moves the weights in one copy

    def shard(numel):
        s = ShardActor(make_algorithm("asgd"), numel, 2, "skip")
        s.loaded = True
        return s

    small, large = shard(MAX_BYTES // 4), shard(MAX_BYTES // 4 + 1)
    assert large.direct(0, 0, 0.0, False) is None and small.direct(0, 0, 0.0, False, False) is None
    channel = small.direct(0, 0, 0.0, False)
    conn = connect(channel)
    assert conn.call("pull", 1, 0) == (WAIT, False)   # through the ledger: nothing planned yet
    small.plan(0, [0.1, 0.1], [], None, None)
    go, lr, weights, adopted = conn.call("pull", 1, 0)
    assert (go, lr, adopted) == (GO, 0.1, []) and weights.shape == (MAX_BYTES // 4,)
    assert small.poll()[-1] == 2   # the calls the socket answered, for the driver's summary
    assert small.direct(1, 0, 0.0, False) == channel   # a new ledger, the same socket
    conn.close()
    small.listener.close()


# ---- issue 44: what a local peer can do to the socket ---------------------------------------------------
def within(seconds: float, fn, *args):
    """``fn(*args)``, or a failure after ``seconds`` (a connect without a deadline would hang the suite)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"{fn.__name__} still waiting after {seconds} s"
    return out[0]


def shard_threads() -> int:
    return sum(t.name == "stalegrad-shard-worker" for t in threading.enumerate())


def idle_peers(address: str, n: int) -> list:
    """``n`` connections that never answer the challenge (any local user can open them)."""
    peers = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
        peers.append(s)
    return peers


def test_idle_peers_hold_a_bounded_number_of_threads_for_a_second_and_the_workers_still_connect(listener):
    from stalegrad.runtimes.ray import channel
    before = shard_threads()
    peers = idle_peers(listener.address, 400)
    time.sleep(0.3)
    assert shard_threads() - before <= channel.MAX_UNAUTHENTICATED   # (400 before the cap)
    assert listener.refused >= 400 - channel.MAX_UNAUTHENTICATED - 5
    deadline = time.monotonic() + channel.HANDSHAKE_S + 3
    while listener.unauthenticated and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.unauthenticated == 0 and shard_threads() == before   # the deadline closed them
    conn = connect(listener.channel)   # (the peers are still connected, silent)
    assert conn is not None and conn.call("pull", 1, 0) == ("pull", (1, 0))
    conn.close()
    for s in peers:
        s.close()


def _serve_with_few_descriptors(address_out, go, done):
    import resource
    lst = ShardListener(echo, threading.Lock())
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 12, used + 12))
    address_out.send(lst.channel)
    done.wait(60)


def test_a_shard_out_of_descriptors_accepts_again_once_they_are_free():
    """The shard's process may open 12 more descriptors: idle peers exhaust them (EMFILE), leave, and a worker
    connects and calls (before: the accept loop ended at EMFILE, and the worker's connect hung)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    go, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_serve_with_few_descriptors, args=(send, go, done), daemon=True)
    proc.start()
    try:
        channel = recv.recv()
        peers = idle_peers(channel[0], 30)   # (the kernel queues what accept cannot take)
        time.sleep(0.5)
        assert within(10, connect, channel) is None   # nothing free: Ray calls, after the deadline, not a hang
        for s in peers:
            s.close()
        time.sleep(2.5)                      # the peers' challenges end; the loop's back-off ends
        conn = within(10, connect, channel)
        assert conn is not None and conn.call("pull", 3, 0) == ("pull", (3, 0))
        conn.close()
    finally:
        done.set()
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def test_a_socket_that_never_answers_costs_a_worker_the_deadline_then_ray_calls():
    from stalegrad.runtimes.ray.channel import CONNECT_S
    address = "\0stalegrad-test-" + os.urandom(8).hex()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)   # accepted by the kernel, never served
    try:
        t = time.monotonic()
        assert within(10, connect, (address, b"k" * 32)) is None
        assert CONNECT_S - 0.2 < time.monotonic() - t < CONNECT_S + 2
    finally:
        server.close()


def test_a_worker_is_told_why_a_socket_on_its_machine_did_not_take_it_and_not_where_there_is_none(listener):
    """What the driver notes once for the run (direct.py): a socket there but not serving, a wrong key; nothing
    where no socket listens (a worker on another machine makes Ray calls as it should)."""
    from stalegrad.runtimes.ray.channel import CONNECT_S
    address, key = listener.channel
    assert attempt(("\0stalegrad-shard-nobody-listens-here", key)) == (None, None)
    assert attempt(None) == (None, None)
    assert within(10, attempt, (address, bytes(32))) == (None, "connected, but the key was refused")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind("\0stalegrad-test-" + os.urandom(8).hex())
    silent.listen(1)   # accepted by the kernel, never served: a shard whose accept fails (EMFILE)
    try:
        assert within(10, attempt, (silent.getsockname(), key)) == (None, f"connected, but no answer within "
                                                                          f"{CONNECT_S:g} s")
    finally:
        silent.close()
    conn, problem = attempt(listener.channel)
    assert problem is None and conn.call("pull", 0, 0) == ("pull", (0, 0))
    conn.close()

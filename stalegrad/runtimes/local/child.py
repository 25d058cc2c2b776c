"""A worker process: the simulator's worker loop, with pulls and pushes through shared memory."""
from __future__ import annotations

import pickle
import sys
import time
import traceback

import torch
from torch import Tensor

from ...core.server import to_device
from ...core.worker import FlatModel, WorkerFactory
from .processes import become_child, worker_device
from .protocol import (ADOPT, ERROR, PULL, PULL_RING, PUSH, PUSH_RING, READY, RESTORE, STATE, STEPS, STOP, Buffers,
                       record_latency, record_pacing)


class _Stop(Exception):
    pass


def worker_main(m: int, factory: WorkerFactory, blob: bytes, device: str, threads: int, pull_buf: Tensor,
                push_buf: Tensor, bn_buf: Tensor, meters: Tensor, conn, pacer=None) -> None:
    """Worker m. ``factory`` is the run's, made portable (the training set in shared memory);
    ``pull_buf`` holds the server's weights, the first ones too; ``pacer`` (a ``core.pacing.Pacer``) makes
    each message last its speed profile's drawn time."""
    become_child(threads)
    try:
        dev = worker_device(device, m)
        on_cpu = dev.type == "cpu"
        model = FlatModel(pickle.loads(blob), dev)
        pulled = pull_buf if on_cpu else pull_buf.to(dev)
        worker = factory.build(m, model=model, w0=pulled)
        buffers = Buffers(model.module)
        algo = worker.algorithm
        steps = 0
        grad_fn = worker.grad_fn

        def counted(w):   # local steps, for the throughput the server measures
            nonlocal steps
            out = grad_fn(w)
            steps += 1
            meters[STEPS] = steps
            return out
        worker.grad_fn = counted

        def ask(msg):
            """Send ``msg``; handle what the server says until its answer comes."""
            conn.send(msg)
            while True:
                reply = conn.recv()
                kind = reply[0]
                if kind == ADOPT:
                    worker.stream.extend(torch.from_numpy(reply[1]))
                elif kind == STATE:       # a checkpoint: we are between two messages
                    conn.send((STATE, to_device(worker.state_dict(), "cpu")))
                elif kind == RESTORE:     # resuming: the state a checkpoint saved
                    worker.load_state_dict(reply[1])
                elif kind == STOP:
                    raise _Stop
                else:
                    return reply

        def pull() -> float:
            t0 = time.perf_counter()
            _, _, lr = ask((PULL,))
            if not on_cpu:
                pulled.copy_(pull_buf)
            record_latency(meters, PULL_RING, time.perf_counter() - t0)
            return lr

        ready = ask((READY,))
        lr = ready[1]
        if pacer is not None and len(ready) > 2:   # every worker starts now: the profile's second 0
            pacer.t0 = ready[2]
        while True:
            if algo.pull_before_compute:
                lr = pull()
            if pacer is None:
                loss, computed = worker.compute(pulled, lr)
            else:
                loss, computed = pacer.run(worker.compute, pulled, lr)
                record_pacing(meters, pacer.figures())
            if not algo.pull_before_compute:   # elastic averaging: the centre, after the local steps
                lr = pull()
            msg = worker.message(pulled, computed)
            t0 = time.perf_counter()
            push_buf.copy_(msg)
            if buffers.numel:
                buffers.write(bn_buf)
            lr = ask((PUSH, worker.samples_per_message, loss, worker.train_acc))[1]
            record_latency(meters, PUSH_RING, time.perf_counter() - t0)
    except (_Stop, EOFError, ConnectionError):
        pass   # told to stop, or the server is gone
    except BaseException as e:
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"stalegrad: worker {m} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            conn.send((ERROR, text))
        except (OSError, ValueError):
            pass
        sys.exit(1)
    finally:
        conn.close()

"""Test-set evaluation in its own process, so that the server never waits for it.

``evaluator_main`` is the process; ``ProcessEvaluator`` its server side, which
implements ``runtimes.base.Evaluator``: ``TrainingRun.evaluate`` hands it
snapshots of the weights, and it completes their records in order.
"""
from __future__ import annotations

import pickle
import sys
import traceback
from collections import deque
from multiprocessing.connection import wait
from typing import Callable

import torch
from torch import Tensor

from ...core.worker import FlatModel
from .processes import become_child, describe_exit
from .protocol import ERROR, EVAL, RESULT, STOP, Buffers, WorkerError, zeros


def evaluator_main(blob: bytes, device: str, threads: int, x: Tensor, y: Tensor, snap: Tensor, bn_snap: Tensor,
                   conn) -> None:
    """Evaluate weight snapshots on the test set, one at a time, in order."""
    become_child(threads)
    try:
        dev = torch.device(device)
        model = FlatModel(pickle.loads(blob), dev)
        buffers = Buffers(model.module)
        x, y = x.to(dev), y.to(dev)
        w = snap if dev.type == "cpu" else torch.empty(snap.shape, device=dev)
        while conn.recv()[0] == EVAL:
            if dev.type != "cpu":
                w.copy_(snap)
            if buffers.numel:
                buffers.read(bn_snap)
            conn.send((RESULT, *model.evaluate(w, x, y)))
    except (EOFError, ConnectionError):
        pass
    except BaseException as e:
        print(f"stalegrad: evaluator failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            conn.send((ERROR, "".join(traceback.format_exception_only(type(e), e)).strip()))
        except (OSError, ValueError):
            pass
        sys.exit(1)
    finally:
        conn.close()


Complete = Callable[[dict, float, float], None]


class ProcessEvaluator:
    """The server's side of the evaluator process (``runtimes.base.Evaluator``): FIFO.

    ``bn`` is the shared vector of the workers' BatchNorm statistics, snapshot
    with the weights. If the process dies, the evaluations go on in the server
    (``model``, the run's own, on ``test``): that stalls it, but nothing is lost.
    """

    def __init__(self, ctx, *, blob: bytes, device: str, threads: int, test_x: Tensor, test_y: Tensor,
                 bn: Tensor, model: FlatModel, test, note: Callable[[str], None]):
        self.bn, self.model, self.test, self.note = bn, model, test, note
        self.bn_model = Buffers(model.module)
        self.snap = zeros(model.numel)
        self.bn_snap = zeros(bn.numel())
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=evaluator_main, name="stalegrad-evaluator", daemon=True,
                                args=(blob, device, threads, test_x, test_y, self.snap, self.bn_snap, child))
        self.proc.start()
        child.close()
        self.current: tuple[dict, Complete] | None = None   # the record being evaluated
        self.queue: deque = deque()        # (record, complete, weights, statistics) waiting for the process
        self.alive = True

    # ---- runtimes.base.Evaluator -------------------------------------------------------
    def submit(self, weights: Tensor, record: dict, complete: Complete) -> None:
        """Copy ``weights`` (and the statistics) now; ``complete(record, loss, acc)`` later, in order."""
        if self.current is None:
            self._send(record, complete, weights, self.bn)
        else:
            self.queue.append((record, complete, weights.detach().clone(), self.bn.clone()))

    def drain(self) -> None:
        """Wait for every submitted evaluation."""
        while self.current is not None:
            ready = wait([self.conn, self.proc.sentinel], timeout=1.0)
            if self.conn in ready:
                self.on_ready()
            elif self.proc.sentinel in ready:
                self.lost(describe_exit(self.proc))

    # ---- the server loop's calls ---------------------------------------------------------
    def on_ready(self) -> None:
        """The process answered (or its pipe broke)."""
        try:
            msg = self.conn.recv()
        except (EOFError, ConnectionError):
            self.lost(describe_exit(self.proc))
            return
        if msg[0] == ERROR:
            raise WorkerError(f"the evaluator failed: {msg[1]}")
        (record, complete), self.current = self.current, None
        complete(record, msg[1], msg[2])
        if self.queue:
            self._send(*self.queue.popleft())

    def lost(self, why: str) -> None:
        """The process died: evaluate in the server from now on."""
        if not self.alive:
            return
        self.alive = False
        self.note(f"the evaluator process died ({why}); evaluating in the server from now on")
        if self.current is not None:
            self._evaluate_here()

    def ask_stop(self) -> None:
        try:
            self.conn.send((STOP,))
        except (OSError, ValueError):
            pass

    # ---- internals -------------------------------------------------------------------
    def _send(self, record: dict, complete: Complete, w: Tensor, bn: Tensor) -> None:
        self.snap.copy_(w)
        self.bn_snap.copy_(bn)
        self.current = (record, complete)
        if self.alive:
            try:
                self.conn.send((EVAL,))
                return
            except (OSError, ValueError):
                self.lost("its pipe broke")
        self._evaluate_here()

    def _evaluate_here(self) -> None:
        while self.current is not None:
            if self.bn_model.numel:
                self.bn_model.read(self.bn_snap)
            loss, acc = self.model.evaluate(self.snap, self.test.x, self.test.y)
            (record, complete), self.current = self.current, None
            complete(record, loss, acc)
            if self.queue:
                record, complete, w, bn = self.queue.popleft()
                self.snap.copy_(w)
                self.bn_snap.copy_(bn)
                self.current = (record, complete)

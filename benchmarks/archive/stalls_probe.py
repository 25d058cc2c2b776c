"""Diagnostics behind benchmarks/archive/NOTES.md, "Stalls" (issue 11 part 4); not part of run_all.py.

    .venv/bin/python benchmarks/archive/stalls_probe.py threads dcasgd-c
        # 1 vs 2 threads, lr 0.1 (diverges) vs 0.01 (learns), (CPU s, wall s) per 1/8 epoch, in one process
    .venv/bin/python benchmarks/archive/stalls_probe.py subnormals dcasgd-c 0 4
        # one thread, flush off (0) or on (1), 4 epochs: subnormal floats counted at every step in the
        # weights loaded, every layer's output and output gradient, and the flat gradient

Run with torch's own OMP_WAIT_POLICY (import order: torch loads before stalegrad here on purpose,
so the library's short-spin default does not apply), as the runs of the issue did.
"""
import sys
import time
import os
import torch
import stalegrad as sg
from stalegrad.core import worker as W


def threads(algo):
    train, test = sg.load_pair("fashion-mnist")

    def run(lr, n, epochs=0.5):
        torch.set_num_threads(n)
        rows = []
        last = [time.process_time(), time.perf_counter()]

        def on_eval(r):
            c, w = time.process_time(), time.perf_counter()
            rows.append((round(c - last[0], 2), round(w - last[1], 2)))
            last[0], last[1] = c, w
        res = sg.train("mlp", train, test, algo, workers=16, epochs=epochs, lr=lr, seed=0, eval_every=0.125,
                       on_eval=on_eval)
        print(f"{algo} lr {lr} threads {n} acc {res.summary['final_test_acc']:.3f} (cpu, wall) per 1/8 epoch: "
              f"{rows[1:]} load {os.getloadavg()[0]:.1f}", flush=True)
    for _ in range(2):
        for n in (1, 2):
            for lr in (0.1, 0.01):
                run(lr, n)


def subnormals(algo, flush, epochs):
    torch.set_num_threads(1)
    torch.set_flush_denormal(flush)
    train, test = sg.load_pair("fashion-mnist")
    tiny = torch.finfo(torch.float32).tiny

    def sub(t):
        return int(((t != 0) & (t.abs() < tiny)).sum())
    counts = {"act": 0, "grad": 0, "w": 0, "gradout": 0, "steps": 0}
    orig = W.FlatModel.loss_and_grad
    hooked = set()

    def lag(self, w, x, y):
        if id(self) not in hooked:
            hooked.add(id(self))
            for mod in self.module.modules():
                if not list(mod.children()):
                    mod.register_forward_hook(
                        lambda m, i, o: counts.__setitem__("act", counts["act"] + sub(o)) if m.training else None)
                    mod.register_full_backward_hook(lambda m, gi, go: counts.__setitem__(
                        "gradout", counts["gradout"] + sum(sub(g) for g in go if g is not None)))
        counts["w"] += sub(w)
        r = orig(self, w, x, y)
        counts["grad"] += sub(r[1])
        counts["steps"] += 1
        return r
    W.FlatModel.loss_and_grad = lag
    last = [time.process_time()]

    def on_eval(r):
        now = time.process_time()
        dt = now - last[0]
        last[0] = now
        print(f"ep {r['epoch']:.2f} cpu {dt:6.2f}s acc {r['test_acc']:.3f} {counts}", flush=True)
        for k in counts:
            counts[k] = 0
    res = sg.train("mlp", train, test, algo, workers=16, epochs=epochs, lr=0.1, seed=0, eval_every=0.5,
                   on_eval=on_eval)
    print("sha", res.summary["weights_sha256"][:16])


if __name__ == "__main__":
    if sys.argv[1:2] == ["threads"] and len(sys.argv) == 3:
        threads(sys.argv[2])
    elif sys.argv[1:2] == ["subnormals"] and len(sys.argv) == 5:
        subnormals(sys.argv[2], sys.argv[3] == "1", float(sys.argv[4]))
    else:
        sys.exit(__doc__)

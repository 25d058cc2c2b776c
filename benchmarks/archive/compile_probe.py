"""Why the earlier torch.compile attempt at DC-ASGD-a took 42 ms (benchmarks/archive/NOTES.md, section 1):
the rule compiled as a function returning new tensors, against the same rule writing into
existing buffers, 10M float32 parameters. Needs a C++ compiler (inductor). T=threads.

    T=1 .venv/bin/python benchmarks/archive/compile_probe.py
"""
import os
import time

import torch
torch.set_num_threads(int(os.environ.get("T", "1")))
n = 10_000_000
g, w, wb, ms, out, src, dst = [torch.rand(n) for _ in range(7)]
lr, lam0, mom, eps = 0.1, 2.0, 0.95, 1e-7
def rule_new(g, w, wb, ms):          # as the earlier attempt: returns new tensors
    ms2 = mom * ms + (1 - mom) * g * g
    d = -lr * (g + lam0 / torch.sqrt(ms2 + eps) * g * g * (w - wb))
    return ms2, d
def rule_inplace(g, w, wb, ms, out):  # state and step written into existing buffers
    ms2 = mom * ms + (1 - mom) * g * g
    ms.copy_(ms2)
    out.copy_(-lr * (g + lam0 / torch.sqrt(ms2 + eps) * g * g * (w - wb)))
c0 = time.perf_counter(); f_new = torch.compile(rule_new); f_new(g, w, wb, ms); t_new = time.perf_counter() - c0
c0 = time.perf_counter(); f_in = torch.compile(rule_inplace); f_in(g, w, wb, ms, out); t_in = time.perf_counter() - c0
def T(fn, k=10):
    fn(); best = 1e9
    for _ in range(k):
        c = time.process_time() if torch.get_num_threads() == 1 else time.perf_counter(); fn()
        best = min(best, (time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()) - c)
    return best * 1e3
for r in range(2):
    print("threads", torch.get_num_threads(), f"compile new {t_new:.1f}s inplace {t_in:.1f}s |",
          f"copy {T(lambda: dst.copy_(src)):.2f} ms, eager {T(lambda: rule_new(g, w, wb, ms)):.1f}, "
          f"compiled new-tensors {T(lambda: f_new(g, w, wb, ms)):.1f}, compiled in-place {T(lambda: f_in(g, w, wb, ms, out)):.1f} ms",
          os.getloadavg()[0])

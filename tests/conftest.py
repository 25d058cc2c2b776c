import os
import signal

# stalegrad before torch, as a user's script imports them: stalegrad sets OpenMP's spin count before torch
# loads OpenMP, which reads it once. With torch first (as this file did), every parallel region of the tests
# spun at OpenMP's default: test_vectorised and test_runtime_contract took 310 s at load 5-8, 25 s at load ~4
# (issue 33).
import stalegrad  # noqa: F401
import torch

# One intra-op thread in the test process (STALEGRAD_TEST_THREADS=N for N): the tests' tensors are tiny, and
# two threads on a 2-core machine that runs other work too (a niced study, or a second pytest-xdist worker)
# wait on each other at every operation: those two files took 17 s at one thread, 25 s at two (load ~4).
# What depends on the thread count is tested at the counts it names (test_numerics, test_threads, test_fused).
torch.set_num_threads(int(os.environ.get("STALEGRAD_TEST_THREADS", "1")))

# The signal tests send Ctrl-C (SIGINT) to the processes they start. A suite started in the background by a
# non-interactive shell (`make test &`, setsid, some CI runners) inherits SIGINT ignored, and so would every process
# it starts, where Python installs no Ctrl-C handler: those tests then failed for the launcher's reason, not the
# code's. A terminal's Ctrl-C is what they test, so its default is restored here (what a grid started in the
# background does is tested on purpose, with SIGINT ignored in that child alone).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

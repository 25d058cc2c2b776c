import os

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

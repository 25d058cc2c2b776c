import os

# stalegrad before torch, as a user's script imports them: stalegrad sets OpenMP's spin count before torch
# loads OpenMP, which reads it once. With torch first (as this file did), every parallel region of the tests
# spun at OpenMP's default: test_vectorised and test_runtime_contract took 310 s at load 5-8, 25 s at load ~4
# (issue 33).
import stalegrad  # noqa: F401
import torch

# Under pytest-xdist every worker process is a full PyTorch; two of them with
# two intra-op threads each on a 2-core machine thrash. One thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import os

import torch

# Under pytest-xdist every worker process is a full PyTorch; two of them with
# two intra-op threads each on a 2-core machine thrash. One thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

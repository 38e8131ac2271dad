"""Set-up for every test folder. Under pytest-xdist (the README's test command runs one worker
per core) each worker computes on one thread, and so do the processes it starts: two workers
on two cores never wait on each other's OpenMP threads."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

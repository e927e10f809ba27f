"""Suite-wide settings: deterministic, single-threaded numerics per worker (the suite runs as `pytest -n 2`)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# the MX Triton kernels (accel.backends.mx_triton) run here under Triton's CPU interpreter, which triton only honours
# when it is set before triton is first imported (torch imports it where it is installed)
os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # torch is an optional extra; tests that need it import it themselves
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

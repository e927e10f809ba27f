"""Suite-wide settings: deterministic, single-threaded numerics per worker (the suite runs as `pytest -n 2`)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

try:  # torch is an optional extra; tests that need it import it themselves
    import torch

    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        # without a GPU the MX Triton kernels (accel.backends.mx_triton) run under Triton's CPU interpreter, which
        # triton honours only when set before triton is first imported (importing torch does not import it)
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

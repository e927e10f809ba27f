"""Settings of the speculative decoding tests: torch single-threaded (the tiny models are latency-bound and the CI
machine's 2 cores are shared). The models themselves come from ``tests.helpers.decoders``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

"""measure_host builds a valid profile; the multi-token fit recovers a known curve."""

import numpy as np
import pytest

from accel.sim import measure_host
from accel.sim.host import fit_multi_token


def test_fit_multi_token_recovers_power_law():
    rows = np.array([1, 2, 4, 8, 16])
    t = 0.01 * (1 + 0.16 * (rows - 1) ** 0.67)
    beta, gamma = fit_multi_token(rows, t)
    assert beta == pytest.approx(0.16, rel=1e-9) and gamma == pytest.approx(0.67, rel=1e-9)
    assert fit_multi_token(rows, np.full(5, 0.01)) == (0.0, 1.0)


def test_measure_host_small():
    hw = measure_host(copy_bytes=8e6, stream_bytes=4e6, rows=(1, 2, 4), matmul_n=256, ort_calls=30)
    assert hw.memory_bandwidth_bytes_per_s > 1e8 and hw.peak_flops("fp32") > 1e8
    assert 0 < hw.bandwidth_efficiency <= 1 and 0 < hw.call_overhead_s < 0.05
    assert "fp32" in hw.peak_flops_per_s and hw.peak_flops("fp16") == hw.peak_flops("fp32")
    assert "measured" in hw.source

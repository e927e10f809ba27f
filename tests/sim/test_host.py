"""measure_host builds a valid profile; the multi-token fit recovers a known curve."""

import numpy as np
import pytest

from accel.sim import measure_host
from accel.sim.host import NBITS_FORMATS, fit_multi_token, layer_terms
from accel.sim.host_layers import LayerShape, layer_weight_elements


def test_fit_multi_token_recovers_power_law():
    rows = np.array([1, 2, 4, 8, 16])
    t = 0.01 * (1 + 0.16 * (rows - 1) ** 0.67)
    beta, gamma = fit_multi_token(rows, t)
    assert beta == pytest.approx(0.16, rel=1e-9) and gamma == pytest.approx(0.67, rel=1e-9)
    assert fit_multi_token(rows, np.full(5, 0.01)) == (0.0, 1.0)


def test_layer_terms_recover_known_costs():
    """An 8-bit layer = overhead + weights at the kernel's rate; a float32 one = overhead + its bytes at a bandwidth,
    growing over rows as 1 + beta (r-1)^gamma: layer_terms gives back the overhead, the bandwidth and (beta, gamma)."""
    n, bw, over, rate = 3_000_000, 20e9, 1.5e-4, 25e9
    t8 = {1: over + n / rate}
    t32 = {r: over + 4 * n / bw * (1 + 0.2 * (r - 1) ** 0.8) for r in (1, 2, 4)}
    got = layer_terms({"fp32": t32, "nbits8": t8}, n, rate)
    assert got["layer_overhead_s"] == pytest.approx(over, rel=1e-9)
    assert got["fp32_bytes_per_s"] == pytest.approx(bw, rel=1e-9)
    assert (got["beta"], got["gamma"]) == (pytest.approx(0.2, rel=1e-6), pytest.approx(0.8, rel=1e-6))
    # an 8-bit layer faster than its weights at the kernel's rate: no negative overhead
    assert layer_terms({"fp32": t32, "nbits8": {1: 1e-6}}, n, rate)["layer_overhead_s"] == 0.0
    assert layer_weight_elements(LayerShape()) == 576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536  # SmolLM2-135M


def test_measure_host_small():
    tiny = LayerShape(hidden=64, intermediate=128, heads=4, kv_heads=2, ctx_len=32, past=8)
    hw = measure_host(
        copy_bytes=8e6, stream_bytes=4e6, rows=(1, 2, 4), matmul_n=256, ort_calls=30, ort_width=256, ort_chain=2,
        layer=tiny, layer_counts=(1, 2), layer_calls=3,
    )  # fmt: skip
    assert hw.memory_bandwidth_bytes_per_s > 1e8 and hw.peak_flops("fp32") > 1e8
    assert 0 < hw.bandwidth_efficiency <= 1 and 0 < hw.call_overhead_s < 0.05
    assert "fp32" in hw.peak_flops_per_s and hw.peak_flops("fp16") == hw.peak_flops("fp32")
    assert "measured" in hw.source and hw.layer_overhead_s >= 0
    assert set(hw.decompress_elements_per_s) == set(NBITS_FORMATS) and hw.decompress_rate("mxfp6") > 0

"""measure_host builds a valid profile; the multi-token fit recovers a known curve; the simulator prices an 8-bit
multi-row step as the calibration measured it."""

import numpy as np
import pytest

from accel.backends.onnx_graph import legacy_spec
from accel.errors import SimError
from accel.sim import Hardware, measure_host, step_time
from accel.sim.host import NBITS_FORMATS, HostProbe, fit_multi_token, layer_terms
from accel.sim.host_layers import LayerShape, layer_graph_spec, layer_weight_elements
from accel.sim.roofline import CallShape


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
    probe = HostProbe(
        copy_bytes=8e6, stream_bytes=4e6, rows=(1, 2, 4), matmul_n=256, ort_calls=30, ort_width=256, ort_chain=2,
        layer=tiny, layer_counts=(1, 2), layer_calls=3,
    )  # fmt: skip
    hw = measure_host(probe)
    assert hw.memory_bandwidth_bytes_per_s > 1e8 and hw.peak_flops("fp32") > 1e8
    assert 0 < hw.bandwidth_efficiency <= 1 and 0 < hw.call_overhead_s < 0.05
    assert "fp32" in hw.peak_flops_per_s and hw.peak_flops("fp16") == hw.peak_flops("fp32")
    assert "measured" in hw.source and hw.layer_overhead_s >= 0
    assert set(hw.decompress_elements_per_s) == set(NBITS_FORMATS) and hw.decompress_rate("mxfp6") > 0
    assert hw.decompress_multi_token_penalty is not None and hw.decompress_multi_token_exponent is not None
    assert "graph call" in hw.notes  # the fixed cost of one call of accel's graph, from the layer pair


def _calibrated(n: int, over: float, rate: float, t8: dict[int, float]) -> Hardware:
    """A host profile whose 8-bit terms come from ``layer_terms`` of these layer times (memory and compute far
    faster than the kernel, so the decompression term sets each layer's pace)."""
    t32 = {r: over + 4 * n / 20e9 * (1 + 0.1 * (r - 1)) for r in (1, 2, 4)}
    got = layer_terms({"fp32": t32, "nbits8": t8, "call": {1: 4e-4}}, n, rate)
    return Hardware(
        name="host", memory_bandwidth_bytes_per_s=1e13, memory_capacity_bytes=1e10, peak_flops_per_s={"fp32": 1e16},
        call_overhead_s=got["call_s"], layer_overhead_s=got["layer_overhead_s"],
        decompress_elements_per_s={"mxfp6": rate},
        multi_token_penalty=got["beta"], multi_token_exponent=got["gamma"],
        decompress_multi_token_penalty=got["dec_beta"], decompress_multi_token_exponent=got["dec_gamma"],
    )  # fmt: skip


def test_layer_terms_fit_the_8bit_growth_and_the_call():
    """The 8-bit layer's growth over rows (less the overhead) is its own multi-token term, not the float32 one's."""
    n, over, rate = 3_000_000, 1.5e-4, 25e9
    t8 = {r: over + n / rate * (1 + 0.5 * (r - 1) ** 1.2) for r in (1, 2, 4)}
    t32 = {r: over + 4 * n / 20e9 * (1 + 0.1 * (r - 1)) for r in (1, 2, 4)}
    got = layer_terms({"fp32": t32, "nbits8": t8, "call": {1: 4e-4, 2: 5e-4}}, n, rate)
    assert (got["dec_beta"], got["dec_gamma"]) == (pytest.approx(0.5, rel=1e-6), pytest.approx(1.2, rel=1e-6))
    assert (got["beta"], got["gamma"]) == (pytest.approx(0.1, rel=1e-6), pytest.approx(1.0, rel=1e-6))
    assert got["call_s"] == 4e-4
    assert "call_s" not in layer_terms({"fp32": t32, "nbits8": t8}, n, rate)


def test_8bit_multi_row_step_grows_as_calibrated():
    """SmolLM2-135M (30 layers of 3,538,944 weights) on a profile calibrated from 8-bit layer times at 1, 2, 4 rows:
    the simulated step grows by 30 x the layer's measured growth (the head at one row), and a profile without the
    8-bit term (the float32 layer's growth for both paths) under-prices it: the error this term fixes."""
    n, over, rate = layer_weight_elements(LayerShape()), 1.8e-4, 29e9
    t8 = {1: over + n / rate, 2: over + 1.24 * n / rate, 4: over + 1.73 * n / rate}  # growth as measured here
    hw = _calibrated(n, over, rate, t8)
    step = {
        r: step_time("smollm2-135m", hw, CallShape(context_len=128, new_tokens=r), weight_format="mxfp6")
        for r in (1, 2, 4)
    }
    for r in (2, 4):
        assert step[r].time_s - step[1].time_s == pytest.approx(30 * (t8[r] - t8[1]), rel=1e-6)
        assert step[r].decompress_s > step[r].memory_s and step[r].decompress_s > step[r].compute_s
    assert step[1].overhead_s == pytest.approx(4e-4 + 30 * hw.layer_overhead_s, rel=1e-9)
    shared = hw.with_(decompress_multi_token_penalty=None, decompress_multi_token_exponent=None)
    old = step_time("smollm2-135m", shared, CallShape(context_len=128, new_tokens=4), weight_format="mxfp6")
    assert old.time_s - step[1].time_s < 0.5 * (step[4].time_s - step[1].time_s)
    # the float32 path keeps the memory terms: its growth is the float32 layer's
    f32 = {
        r: step_time("smollm2-135m", hw, CallShape(context_len=128, new_tokens=r), weight_format="fp32") for r in (1, 4)
    }
    assert f32[4].memory_s / f32[1].memory_s < 1.31


def test_decompress_multi_token_terms_are_validated():
    base = dict(name="h", memory_bandwidth_bytes_per_s=1e10, memory_capacity_bytes=1e9, peak_flops_per_s={"fp32": 1e11})
    for field, bad in (("decompress_multi_token_penalty", -0.1), ("decompress_multi_token_exponent", 2.5)):
        with pytest.raises(SimError, match=field):
            Hardware(**base, **{field: bad})


def test_layer_graphs_are_described_by_a_graph_spec():
    """``measure_host`` builds its layer graphs from a ``GraphSpec`` (issue 34), the same graphs the builder's older
    keywords described: float32, and 8-bit ``MatMulNBits`` with int8 activations, onnxruntime's fused ops."""
    shape = LayerShape()
    for nbits in (False, True):
        spec = layer_graph_spec(shape, nbits)
        assert spec == legacy_spec(ctx_len=shape.ctx_len, batch_size=1, matmul_nbits=4 if nbits else 0, fused=True)
        assert spec.ort_ops and spec.runtime == ("nbits" if nbits else "float")

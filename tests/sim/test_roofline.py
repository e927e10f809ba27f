"""Roofline step time: hand calculations, limits, monotonicity, bounds."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import hardware, preset, step_time


def test_decode_step_by_hand_memory_bound():
    """Llama 2 7B, batch 1, one token, empty cache on one A100: weights + KV write + activations over achieved BW."""
    hw = hardware("a100-80gb")
    spec = preset("llama-2-7b")
    d, f, V, L = 4096, 11008, 32000, 32
    weights = 2 * (L * (4 * d * d + 3 * d * f + 2 * d) + V * d + d)  # everything but the embedding table is read
    kv_write = L * 2 * d * 2
    acts = L * (4 * d + 2 * d + 2 * d + 3 * f) * 2 + d * 2 + V * 4  # matmul in/out, embedding row, fp32 logits
    expected = 30e-6 + (weights + kv_write + acts) / (2039e9 * 0.8)
    st = step_time(spec, hw)
    assert st.time_s == pytest.approx(expected, rel=1e-12)
    assert st.bound == "memory" and st.compute_bound_s == 0.0
    norms = L * 2 * d + d  # no matmul FLOPs; attention over the one new key: 4 * d * 1 per layer
    assert st.flops == pytest.approx(2 * (spec.num_params - V * d - norms) + L * 4 * d * 1, rel=1e-12)


def test_prefill_is_compute_bound_and_matches_flops():
    hw = hardware("a100-80gb")
    spec = preset("llama-2-7b")
    S = 4096
    st = step_time(spec, hw, new_tokens=S, num_logits=1)
    assert st.bound == "compute"
    linear_flops = 2 * S * (spec.num_params - 2 * 32000 * 4096)
    assert st.flops > linear_flops and st.flops < 1.6 * linear_flops  # + attention (~S/2 keys) + 1-logit head
    assert st.time_s > st.flops / (312e12 * 0.6)


def test_breakdown_partitions_time():
    for S, L in [(1, 0), (8, 1000), (512, 0)]:
        st = step_time("llama-3-8b", "h100-sxm", new_tokens=S, context_len=L, num_logits=1)
        assert st.time_s == pytest.approx(st.memory_bound_s + st.compute_bound_s + st.comm_s + st.overhead_s)


@pytest.mark.parametrize("fmt", ["fp16", "mxfp6", "mxfp4", "int4"])
@pytest.mark.parametrize("S,L,B", [(1, 0, 1), (8, 2048, 1), (1, 512, 64), (256, 0, 4)])
def test_more_bandwidth_never_slower(fmt, S, L, B):
    hw = hardware("l40s")
    times = [
        step_time(
            "mistral-7b",
            hw.with_(memory_bandwidth_bytes_per_s=bw),
            weight_format=fmt,
            new_tokens=S,
            context_len=L,
            batch_size=B,
        ).time_s
        for bw in np.geomspace(1e11, 1e13, 9)
    ]
    assert np.all(np.diff(times) <= 0)


def test_longer_context_and_bigger_batch_never_faster():
    t = [step_time("llama-2-7b", "cloud-ai-100-pro", context_len=L).time_s for L in (0, 128, 1024, 4096)]
    assert np.all(np.diff(t) > 0)
    t = [step_time("llama-2-7b", "cloud-ai-100-pro", batch_size=b).time_s for b in (1, 2, 8, 64)]
    assert np.all(np.diff(t) > 0)


def test_mx_decode_faster_than_fp16_by_byte_ratio_at_most():
    hw = hardware("cloud-ai-100-pro")
    t16 = step_time("llama-2-7b", hw).memory_bound_s
    t6 = step_time("llama-2-7b", hw, weight_format="mxfp6").memory_bound_s
    assert 1.0 < t16 / t6 < 16 / 6.25


def test_mx_decompression_when_slow_becomes_the_bottleneck():
    hw = hardware("a100-80gb").with_(mx_decompress_elements_per_s=1e11)
    st = step_time("llama-2-7b", hw, weight_format="mxfp6")
    lin = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    assert st.bound == "compute"
    assert st.decompress_s == pytest.approx(lin / 1e11)
    assert step_time("llama-2-7b", hw, weight_format="fp16").decompress_s == 0.0


def test_multi_token_penalty_scales_weight_time_only_above_one_row():
    hw = hardware("cloud-ai-100-pro")
    pen = hw.with_(multi_token_penalty=0.5, multi_token_exponent=1.0)
    assert step_time("llama-2-7b", pen).time_s == step_time("llama-2-7b", hw).time_s
    a = step_time("llama-2-7b", hw, new_tokens=5, num_logits=5)
    b = step_time("llama-2-7b", pen, new_tokens=5, num_logits=5)
    assert b.time_s > a.time_s
    w_layers = a.weight_bytes - 32000 * 4096 * 2 - 4096 * 2
    extra = 0.5 * 4 * w_layers / (137e9 * 0.6)  # g(5) - 1 = 0.5 * 4 for the layers (head: 5 logits, same rows)
    extra += 0.5 * 4 * (32000 * 4096 * 2 + 4096 * 2) / (137e9 * 0.6)
    assert b.time_s - a.time_s == pytest.approx(extra, rel=1e-9)


def test_tensor_parallel_adds_two_allreduces_per_layer():
    hw = hardware("cloud-ai-100-ultra")
    one = step_time("llama-2-7b", hw, devices=1)
    four = step_time("llama-2-7b", hw, devices=4)
    n = 4
    ar = 2 * (n - 1) / n * 4096 * 2 / 16e9 + 2 * (n - 1) * 10e-6
    assert four.comm_s == pytest.approx(32 * 2 * ar)
    assert one.comm_s == 0.0
    assert four.memory_bound_s == pytest.approx(one.memory_bound_s / 4)


def test_bad_sizes():
    for kw in [dict(batch_size=0), dict(new_tokens=0), dict(context_len=-1), dict(new_tokens=2, num_logits=3)]:
        with pytest.raises(SimError):
            step_time("gpt2", "l4", **kw)
    with pytest.raises(SimError, match="devices"):
        step_time("gpt2", "l4", devices=2)
    with pytest.raises(SimError, match="weight format"):
        step_time("gpt2", "l4", weight_format="fp12")


def test_kv_cache_read_with_grouped_query_attention():
    """Llama-3-8B (8 KV heads of 128): reading a 4096-token cache costs 4096 * 2 * 32 * 8 * 128 * 2 bytes."""
    hw = hardware("h100-sxm")
    L = 4096
    a = step_time("llama-3-8b", hw, context_len=0)
    b = step_time("llama-3-8b", hw, context_len=L)
    kv = L * 2 * 32 * 8 * 128 * 2
    assert b.kv_read_bytes == kv
    assert b.memory_bound_s - a.memory_bound_s == pytest.approx(kv / (3350e9 * 0.8), rel=1e-9)
    fp8 = step_time("llama-3-8b", hw, context_len=L, kv_format="fp8")
    assert fp8.kv_read_bytes == kv / 2

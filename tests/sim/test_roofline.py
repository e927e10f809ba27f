"""Roofline step time: hand calculations, limits, monotonicity, bounds, decompression, links, caches, experts."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import ModelSpec, hardware, load_hardware, preset, step_time
from accel.sim.roofline import CallShape


def test_decode_step_by_hand_memory_bound():
    """Llama 2 7B, batch 1, one token, empty cache on one A100: weights + KV write + activations over achieved BW,
    plus the fixed costs per call and per layer."""
    hw = hardware("a100-80gb")
    spec = preset("llama-2-7b")
    d, f, V, L = 4096, 11008, 32000, 32
    weights = 2 * (L * (4 * d * d + 3 * d * f + 2 * d) + V * d + d)  # everything but the embedding table is read
    kv_write = L * 2 * d * 2
    acts = L * (4 * d + 2 * d + 2 * d + 3 * f) * 2 + d * 2 + V * 4  # matmul in/out, embedding row, fp32 logits
    fixed = hw.call_overhead_s + L * hw.layer_overhead_s
    expected = fixed + (weights + kv_write + acts) / (2039e9 * hw.bandwidth_efficiency)
    st = step_time(spec, hw)
    assert st.time_s == pytest.approx(expected, rel=1e-12)
    assert st.overhead_s == pytest.approx(fixed)
    assert st.bound == "memory" and st.compute_bound_s == 0.0
    norms = L * 2 * d + d  # no matmul FLOPs; attention over the one new key: 4 * d * 1 per layer
    assert st.flops == pytest.approx(2 * (spec.num_params - V * d - norms) + L * 4 * d * 1, rel=1e-12)


def test_prefill_is_compute_bound_and_matches_flops():
    hw = hardware("a100-80gb")
    spec = preset("llama-2-7b")
    S = 4096
    st = step_time(spec, hw, CallShape(new_tokens=S, num_logits=1))
    assert st.bound == "compute"
    linear_flops = 2 * S * (spec.num_params - 2 * 32000 * 4096)
    assert st.flops > linear_flops and st.flops < 1.6 * linear_flops  # + attention (~S/2 keys) + 1-logit head
    assert st.time_s > st.flops / (312e12 * hw.compute_efficiency)


def test_breakdown_partitions_time():
    for S, L in [(1, 0), (8, 1000), (512, 0)]:
        for fmt in ("bf16", "int4", "mxfp6"):
            st = step_time(
                "llama-3-8b", "h100-sxm", CallShape(new_tokens=S, context_len=L, num_logits=1), weight_format=fmt
            )
            assert st.time_s == pytest.approx(st.memory_bound_s + st.compute_bound_s + st.comm_s + st.overhead_s)


@pytest.mark.parametrize("fmt", ["fp16", "mxfp6", "mxfp4", "int4"])
@pytest.mark.parametrize("S,L,B", [(1, 0, 1), (8, 2048, 1), (1, 512, 64), (256, 0, 4)])
def test_more_bandwidth_never_slower(fmt, S, L, B):
    hw = hardware("l40s")
    times = [
        step_time(
            "mistral-7b",
            hw.with_(memory_bandwidth_bytes_per_s=bw),
            CallShape(new_tokens=S, context_len=L, batch_size=B),
            weight_format=fmt,
        ).time_s
        for bw in np.geomspace(1e11, 1e13, 9)
    ]
    assert np.all(np.diff(times) <= 0)


def test_longer_context_and_bigger_batch_never_faster():
    t = [step_time("llama-2-7b", "cloud-ai-100-pro", CallShape(context_len=L)).time_s for L in (0, 128, 1024, 4096)]
    assert np.all(np.diff(t) > 0)
    t = [step_time("llama-2-7b", "cloud-ai-100-pro", CallShape(batch_size=b)).time_s for b in (1, 2, 8, 64)]
    assert np.all(np.diff(t) > 0)


def test_mx_bytes_shrink_by_the_byte_ratio_at_most():
    hw = hardware("cloud-ai-100-pro")
    t16 = step_time("llama-2-7b", hw).memory_s
    t6 = step_time("llama-2-7b", hw, weight_format="mxfp6").memory_s
    assert 1.0 < t16 / t6 < 16 / 6.25


def test_decompression_serial_adds_and_overlapped_takes_the_max():
    """The mistake 'MX speedup is a pure byte ratio': decompression is a term, beside or after the weight stream."""
    lin = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    serial = hardware("a100-80gb").with_(decompress_elements_per_s={"mxfp6": 1e11}, decompress_overlap=False)
    st = step_time("llama-2-7b", serial, weight_format="mxfp6")
    assert st.decompress_s == pytest.approx(lin / 1e11)
    assert st.time_s == pytest.approx(st.memory_s + st.decompress_s + st.overhead_s, rel=1e-9)
    assert st.bound == "decompress"
    assert step_time("llama-2-7b", serial, weight_format="fp16").decompress_s == 0.0
    over = serial.with_(decompress_overlap=True)
    ov = step_time("llama-2-7b", over, weight_format="mxfp6")
    assert max(ov.memory_s, ov.decompress_s) + ov.overhead_s <= ov.time_s < st.time_s
    assert ov.time_s == pytest.approx(ov.decompress_s + ov.overhead_s, rel=0.05)  # the layers run at the decoder's pace
    # a fast decoder hides behind the stream: the byte ratio again
    fast = over.with_(decompress_elements_per_s={"mxfp6": 1e15})
    assert step_time("llama-2-7b", fast, weight_format="mxfp6").bound == "memory"


def test_catalog_mx_gain_is_below_the_byte_ratio_on_cloud_ai_100():
    """Published MXFP6 gains on Cloud AI 100 are 1.6-1.8x (accel/sim/published.py); bytes alone promise ~2.4x."""
    hw = hardware("cloud-ai-100-standard")
    call = CallShape(context_len=1024, kv_slots=2048)
    t16 = step_time("gpt-j-6b", hw, call).time_s
    t6 = step_time("gpt-j-6b", hw, call, weight_format="mxfp6", compress_lm_head=True)
    assert 1.5 < t16 / t6.time_s < 1.9
    assert t16 / (t6.memory_s + t6.overhead_s) > 2.1  # what the pure byte ratio would have said


def test_multi_token_penalty_scales_weight_time_only_above_one_row():
    hw = hardware("cloud-ai-100-pro")
    pen = hw.with_(multi_token_penalty=0.5, multi_token_exponent=1.0)
    assert step_time("llama-2-7b", pen).time_s == step_time("llama-2-7b", hw).time_s
    a = step_time("llama-2-7b", hw, CallShape(new_tokens=5, num_logits=5))
    b = step_time("llama-2-7b", pen, CallShape(new_tokens=5, num_logits=5))
    assert b.time_s > a.time_s
    w_layers = a.weight_bytes - 32000 * 4096 * 2 - 4096 * 2
    bw = 137e9 * hw.bandwidth_efficiency
    extra = 0.5 * 4 * w_layers / bw  # g(5) - 1 = 0.5 * 4 for the layers (head: 5 logits, same rows)
    extra += 0.5 * 4 * (32000 * 4096 * 2 + 4096 * 2) / bw
    assert b.time_s - a.time_s == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_tensor_parallel_all_reduces_per_layer(n):
    hw = hardware("a100-80gb")
    one = step_time("llama-2-7b", hw, devices=1)
    many = step_time("llama-2-7b", hw, devices=n)  # more devices than one GPU: a node of n
    ar = (
        hw.allreduce_latency_s
        + hw.link_latency_s * np.log2(n)
        + 2 * (n - 1) / n * 4096 * 2 / hw.link_bandwidth_bytes_per_s
    )
    assert many.comm_s == pytest.approx(32 * 2 * ar)
    assert one.comm_s == 0.0
    assert many.memory_bound_s == pytest.approx(one.memory_bound_s / n)
    assert many.overhead_s == one.overhead_s  # per-call and per-layer costs do not shrink with devices
    parallel = step_time("gpt-j-6b", hw, devices=n)  # attention and MLP in parallel: one all-reduce per layer
    assert parallel.comm_s == pytest.approx(28 * ar)


def test_communication_bound_is_reported_as_communication():
    slow = hardware("cloud-ai-100-ultra").with_(link_latency_s=1e-3)
    assert step_time("llama-2-7b", slow, devices=4).bound == "communication"


def test_fixed_cache_reads_every_slot():
    """A QEfficient-style compile attends over all ctx_len slots: the KV read does not depend on the position."""
    a = step_time("llama-2-7b", "cloud-ai-100-ultra", CallShape(context_len=10, kv_slots=2048))
    b = step_time("llama-2-7b", "cloud-ai-100-ultra", CallShape(context_len=2000, kv_slots=2048))
    assert a.kv_read_bytes == b.kv_read_bytes == 2048 * 2 * 32 * 4096 * 2
    assert a.time_s == pytest.approx(b.time_s)
    grow = step_time("llama-2-7b", "cloud-ai-100-ultra", CallShape(context_len=10))
    assert grow.kv_read_bytes == 10 * 2 * 32 * 4096 * 2


def test_sliding_window_caps_the_kv_read():
    mistral = preset("mistral-7b")  # window 4096 on every layer
    st = step_time(mistral, "h100-sxm", CallShape(context_len=20000))
    assert st.kv_read_bytes == 4096 * 2 * 32 * 8 * 128 * 2
    half = mistral.model_copy(update={"sliding_layers": 16})
    st = step_time(half, "h100-sxm", CallShape(context_len=20000))
    assert st.kv_read_bytes == pytest.approx((16 * 4096 + 16 * 20000) * 2 * 8 * 128 * 2)


def test_mixture_of_experts_reads_the_experts_it_touches():
    mix = preset("mixtral-8x7b")
    d, f = 4096, 14336
    one = step_time(mix, "h100-sxm", weight_format="bf16", devices=2)
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    expert = 3 * d * f
    layer = (attn + 8 * d + 2 * expert) * 2 + (2 * d) * 2  # one row touches top-2 experts
    assert one.weight_bytes == pytest.approx(32 * layer + 32000 * d * 2 + d * 2)
    big = step_time(mix, "h100-sxm", CallShape(batch_size=64), weight_format="bf16", devices=2)
    touched = 8 * (1 - (1 - 2 / 8) ** 64)
    assert big.weight_bytes == pytest.approx(
        32 * ((attn + 8 * d + touched * expert) * 2 + 2 * d * 2) + 32000 * d * 2 + d * 2
    )
    assert mix.num_params == 46_702_792_704


def test_bad_sizes():
    for call, kw in [
        (CallShape(batch_size=0), {}),
        (CallShape(new_tokens=0), {}),
        (CallShape(context_len=-1), {}),
        (CallShape(new_tokens=2, num_logits=3), {}),
        (None, dict(devices=0)),
        (None, dict(devices=5000)),
        (CallShape(batch_size=True), {}),  # a bool is not a count
        (CallShape(new_tokens=1.5), {}),
        (CallShape(context_len=10, kv_slots=5), {}),
        (CallShape(new_tokens=2**25), {}),  # beyond the token bound, refused before any work
    ]:
        with pytest.raises(SimError):
            step_time("gpt2", "l4", call, **kw)
    with pytest.raises(SimError, match="weight format"):
        step_time("gpt2", "l4", weight_format="fp12")


def test_kv_cache_read_with_grouped_query_attention():
    """Llama-3-8B (8 KV heads of 128): reading a 4096-token cache costs 4096 * 2 * 32 * 8 * 128 * 2 bytes."""
    hw = hardware("h100-sxm")
    L = 4096
    a = step_time("llama-3-8b", hw, CallShape(context_len=0))
    b = step_time("llama-3-8b", hw, CallShape(context_len=L))
    kv = L * 2 * 32 * 8 * 128 * 2
    assert b.kv_read_bytes == kv
    assert b.memory_bound_s - a.memory_bound_s == pytest.approx(kv / (3350e9 * hw.bandwidth_efficiency), rel=1e-9)
    fp8 = step_time("llama-3-8b", hw, CallShape(context_len=L), kv_format="fp8")
    assert fp8.kv_read_bytes == kv / 2


def test_custom_spec_dtype_sets_the_default_format():
    spec = ModelSpec(n_layers=2, d_model=64, n_heads=4, ffn_dim=128, vocab_size=100, dtype="bf16")
    st = step_time(spec, "h100-sxm")
    assert st.weight_bytes == pytest.approx(step_time(spec, "h100-sxm", weight_format="bf16").weight_bytes)


def test_row_overhead_is_per_layer_per_extra_row():
    """``row_overhead_s``: each layer pays it for every row of a call beyond the first (batch x new tokens), so a
    one-row call is unchanged; 0 on every catalog device but the H200 entry."""
    spec = preset("tinyllama-1.1b")
    hw = hardware("h200")
    assert hw.row_overhead_s > 0 and hardware("a100-80gb").row_overhead_s == 0.0
    off = hw.with_(row_overhead_s=0.0)
    one, one_off = step_time(spec, hw), step_time(spec, off)
    assert one.time_s == one_off.time_s
    for batch, s in ((1, 8), (4, 2)):
        st = step_time(spec, hw, CallShape(batch_size=batch, new_tokens=s, num_logits=s))
        base = step_time(spec, off, CallShape(batch_size=batch, new_tokens=s, num_logits=s))
        extra = spec.n_layers * hw.row_overhead_s * (batch * s - 1)
        assert st.overhead_s - base.overhead_s == pytest.approx(extra, rel=1e-12)
        assert st.time_s - base.time_s == pytest.approx(extra, rel=1e-12)


def test_fp32_products_run_at_the_cuda_core_peak():
    """A float32 product without TF32 runs on the CUDA cores: the datasheets' FP32 peak (A100 19.5, H100 SXM and
    H200 67 TFLOP/s), not the FP16 tensor cores'."""
    for name, tflops in (("a100-80gb", 19.5), ("h100-sxm", 67), ("h200", 67)):
        hw = hardware(name)
        assert hw.peak_flops("fp32") == tflops * 1e12 < hw.peak_flops("fp16")
        st = step_time(preset("tinyllama-1.1b"), hw, CallShape(new_tokens=512, num_logits=1), weight_format="fp32")
        assert st.compute_s == pytest.approx(st.flops / (tflops * 1e12 * hw.compute_efficiency), rel=1e-9)


def test_the_kv_cache_reads_at_its_own_efficiency():
    """``kv_bandwidth_efficiency`` prices the cache reads alone: unset (or equal to the weights' efficiency) it changes
    nothing; at half the weights' rate a batched step's memory time grows by exactly the cache bytes at that rate."""
    hw = hardware("a100-80gb")
    assert hw.kv_bandwidth_efficiency is None
    call = CallShape(batch_size=16, context_len=1000)
    base = step_time(preset("llama-2-7b"), hw, call)
    same = step_time(preset("llama-2-7b"), hw.with_(kv_bandwidth_efficiency=hw.bandwidth_efficiency), call)
    assert same.time_s == pytest.approx(base.time_s, rel=1e-12)
    slow = step_time(preset("llama-2-7b"), hw.with_(kv_bandwidth_efficiency=hw.bandwidth_efficiency / 2), call)
    extra = base.kv_read_bytes / (hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency)
    assert base.kv_read_bytes > 0 and slow.memory_s - base.memory_s == pytest.approx(extra, rel=1e-9)
    with pytest.raises(SimError, match="kv_bandwidth_efficiency"):
        load_hardware({"base": "a100-80gb", "kv_bandwidth_efficiency": 1.5})

"""Draft placement (devices shared with the target by default) and the deployed dtype (independent of the
checkpoint's), issue 35 parts 2 and 3."""

import warnings

import pytest

from accel.errors import SimError
from accel.sim import Deployment, SimWarning, from_hf_config, predict_speedup, step_time, weight_breakdown
from accel.sim.deployment import DeployedDtype
from accel.sim.roofline import CallShape

T, D = "llama-2-7b", "qualcomm-llama2-draft-115m"


def test_the_draft_follows_the_target_onto_its_devices():
    """A 16-device target: the draft is tensor-parallel over the same 16 (it used to default to one device, which
    priced SpD slower than AR); capped at one attention head per device."""
    dep = Deployment(target="llama-2-70b", draft="llama-2-7b", hardware="tpu-v4", devices=16)
    assert dep.draft_devices == 16 and dep.draft_shares_devices
    small = Deployment(target="llama-2-70b", draft="smollm2-135m", hardware="tpu-v4", devices=16)
    assert small.draft_devices == min(16, small.draft.n_heads) == 9
    own = Deployment(
        target="llama-2-70b", draft="llama-2-7b", hardware="tpu-v4", devices=16, draft_shares_devices=False
    )
    assert not own.draft_shares_devices and own.draft_devices == 1
    with pytest.raises(SimError, match="draft_devices=32 exceeds"):
        Deployment(target="llama-2-70b", draft="llama-2-7b", hardware="tpu-v4", devices=16, draft_devices=32)
    with pytest.raises(SimError, match="draft_shares_devices=True"):
        Deployment(target=T, draft=D, hardware="h100-sxm", draft_hardware="a100-80gb", draft_shares_devices=True)


def test_shared_devices_share_memory():
    shared = predict_speedup(T, D, "cloud-ai-100-ultra")
    apart = predict_speedup(T, D, "cloud-ai-100-ultra", draft_shares_devices=False)
    draft_weights = shared.config("fp16 + SpD").memory_bytes - apart.config("fp16 + SpD").memory_bytes
    assert draft_weights > 0.2e9  # the 115M draft's fp16 weights (+ its cache) count in the shared pool only


def test_a_placement_that_makes_spd_slower_than_ar_is_warned_with_a_better_one():
    """A 7B draft on one chip beside a 70B target on 16: slower than AR; on the 16 it would be faster."""
    kw = dict(devices=16, draft_devices=1, k=4, acceptance=0.8)
    with pytest.warns(SimWarning, match="slower than autoregressive.*draft on 1 device.*draft_devices=16 would make"):
        p = predict_speedup("llama-2-70b", "llama-2-7b", "tpu-v4", **kw)
    assert p.config("fp16 + SpD").decode_speedup < 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimWarning)
        q = predict_speedup("llama-2-70b", "llama-2-7b", "tpu-v4", devices=16, k=4, acceptance=0.8)
    assert q.config("fp16 + SpD").decode_speedup > 1 and q.draft_devices == 16
    with pytest.warns(SimWarning, match="no other draft placement beats AR"):
        predict_speedup(T, D, "cloud-ai-100-ultra", k=4, acceptance=0.0)


FP32_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "vocab_size": 32000,
    "torch_dtype": "float32",
    "max_position_embeddings": 4096,
}


def test_deployed_dtype_is_independent_of_the_checkpoint():
    """A float32 HF config deployed as fp16: every weight (norms and the LM head too) at 2 bytes, like the same
    architecture with an fp16 checkpoint; the KV cache follows unless given."""
    spec = from_hf_config(FP32_LLAMA)
    assert spec.dtype == "fp32"
    dep = Deployment(target=spec, hardware="a100-80gb", dtype="fp16")
    fp16_spec = spec.model_copy(update={"dtype": "fp16"})
    assert dep.target.dtype == "fp16" and dep.baseline == "fp16" and dep.kv_format == "fp16"
    assert weight_breakdown(dep.target, dep.baseline) == weight_breakdown(fp16_spec, "fp16")
    p, q = predict_speedup(dep), predict_speedup(fp16_spec, None, "a100-80gb")
    assert p.configs[0].name == "fp16 AR" and p.configs[0].tpot_s == pytest.approx(q.configs[0].tpot_s, rel=1e-12)
    as_ckpt = predict_speedup(spec, None, "a100-80gb", target_format="fp32")
    assert as_ckpt.configs[0].name == "fp32 AR"  # the checkpoint's dtype would double the bytes
    assert as_ckpt.configs[0].memory_bytes == pytest.approx(2 * p.configs[0].memory_bytes, rel=0.05)


def test_deployed_weights_and_kv_cache_separately_mx_included():
    spec = from_hf_config(FP32_LLAMA)
    dep = Deployment(target=spec, hardware="cloud-ai-100-ultra", dtype={"weights": "mxfp6", "kv_cache": "mxint8"})
    assert dep.dtype == DeployedDtype(weights="mxfp6", kv_cache="mxint8")
    assert dep.baseline == "mxfp6" and dep.kv_format == "mxint8" and dep.target.dtype == "fp16"  # dense parts fp16
    t = step_time(
        dep.target,
        dep.hardware,
        CallShape(context_len=1024),
        weight_format="mxfp6",
        kv_format="mxint8",
        devices=dep.n_devices,
    )
    assert predict_speedup(dep, prompt_len=1024, gen_len=2).configs[0].tpot_s == pytest.approx(t.time_s, rel=1e-12)
    bf = Deployment(target=spec, hardware="a100-80gb", dtype={"weights": "int8", "kv_cache": "fp8", "dense": "bf16"})
    assert bf.target.dtype == "bf16" and bf.kv_format == "fp8"
    assert Deployment(target=spec, hardware="a100-80gb", dtype="bf16").kv_format == "bf16"
    with pytest.raises(SimError, match=r"contradicts dtype\.kv_cache"):
        Deployment(target=spec, hardware="a100-80gb", dtype="fp16", kv_format="int8")
    with pytest.raises(SimError, match="deployed dense dtype"):
        Deployment(target=spec, hardware="a100-80gb", dtype={"weights": "int8", "dense": "int8"})
    with pytest.raises(SimError, match="deployed weight format"):
        Deployment(target=spec, hardware="a100-80gb", dtype="fp5")
    # a copy keeps the deployed dtype and re-derives what follows from it
    again = dep.with_(batch_size=2)
    assert again.kv_format == "mxint8" and again.baseline == "mxfp6" and again.batch_size == 2

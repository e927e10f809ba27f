"""Deployment: one typed description shared by predict_speedup, best_k, break_even_alpha and sweep; AR-only
predictions; names and dtypes carried through; devices per model size; bounds checked before any work."""

import json
import tracemalloc

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import (
    Deployment,
    ModelSpec,
    best_k,
    break_even_alpha,
    hardware,
    predict_speedup,
    preset,
    step_time,
    sweep,
)
from accel.sim.roofline import CallShape
from accel.sim.sweeps import SweepAxes

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"
LLAMA_CFG = {
    "model_type": "llama",
    "hidden_size": 768,
    "num_hidden_layers": 9,
    "num_attention_heads": 12,
    "intermediate_size": 2176,
    "vocab_size": 32000,
    "torch_dtype": "bfloat16",
}


def test_one_deployment_serves_every_entry_point():
    dep = Deployment(target=T, draft=D, hardware=HW, prompt_len=512, gen_len=1)
    legacy = predict_speedup(T, D, HW, prompt_len=512, gen_len=1, acceptance=0.8)
    typed = predict_speedup(dep, acceptance=0.8)
    assert typed.model_dump() == legacy.model_dump()
    assert best_k(dep, 0.8) == best_k(T, D, HW, 0.8, context_len=512)
    assert break_even_alpha(dep, 5) == break_even_alpha(T, D, HW, 5, context_len=512)
    s = sweep(dep, k=[3], alpha=[0.8], axes=SweepAxes(context_len=[512], target_format=["mxfp6"]))
    assert s.speedup[0, 0, 0, 0, 0] == pytest.approx(typed.best_k_speedup if typed.best_k == 3 else s.speedup.item())
    # settings override a Deployment's fields; a Deployment plus (draft, hardware) is ambiguous
    assert predict_speedup(dep, batch_size=4).batch_size == 4
    with pytest.raises(SimError, match="either a Deployment"):
        predict_speedup(dep, D, HW)


def test_autoregressive_only_prediction_needs_no_draft():
    p = predict_speedup(T, None, HW)
    assert [c.name for c in p.configs] == ["fp16 AR", "mxfp6 AR"]
    assert p.draft is None and p.best_k is None and p.k is None
    assert "autoregressive only" in p.table()
    spd = predict_speedup(T, D, HW)
    assert p.config("mxfp6 AR").tpot_s == spd.config("mxfp6 AR").tpot_s
    with pytest.raises(SimError, match="draft"):
        predict_speedup(T, None, HW, acceptance=0.7)
    same = predict_speedup(T, None, HW, target_format="fp16")
    assert [c.name for c in same.configs] == ["fp16 AR"]


def test_names_and_dtypes_are_carried_through():
    """A config dict keeps a name (its own or one given), and a bf16 model's baseline row is labelled bf16."""
    p = predict_speedup(LLAMA_CFG, None, HW)
    assert p.target == "llama-116m" and p.configs[0].name == "bf16 AR"
    named = predict_speedup(Deployment(target=dict(LLAMA_CFG, _name_or_path="org/my-draft"), hardware=HW))
    assert named.target == "org/my-draft"
    assert predict_speedup("llama-3-8b", None, "h100-sxm").configs[0].name == "bf16 AR"
    assert "llama-3-8b" in predict_speedup("llama-3-8b", None, "h100-sxm").table()


def test_devices_follow_model_size_and_may_span_cards():
    assert Deployment(target="smollm2-135m", hardware=HW).devices == 1  # a 135M model stays on one SoC
    assert Deployment(target=T, draft=D, hardware=HW).devices == 4
    # the draft follows the target (issue 35: it used to default to one device while the target spread over four)
    assert Deployment(target=T, draft=D, hardware=HW).draft_devices == 4
    assert Deployment(target=T, draft=D, hardware=HW, draft_shares_devices=False).draft_devices == 1  # own, by size
    assert Deployment(target=T, draft="llama-3-8b", hardware=HW).draft_devices == 4
    assert Deployment(target="opt-2.7b", hardware=HW, baseline_format="mxfp6").devices == 4
    # catalog GPUs are single devices; 8 or 16 of them is a deployment choice, not a different catalog entry
    p = predict_speedup("llama-2-70b", None, "a100-80gb", devices=8, target_format="int8")
    assert p.devices == 8 and p.fits
    alone = predict_speedup("llama-2-70b", None, "a100-80gb")
    assert not alone.fits and "devices=2" in alone.fit_message
    with pytest.raises(SimError, match="devices=4"):
        predict_speedup("llama-2-70b", None, "a100-80gb", devices=1, batch_size=64, prompt_len=2048).require_fit()


def test_fixed_cache_layout():
    dep = Deployment(target=T, hardware=HW, cache="fixed", ctx_len=2048, prompt_len=1024, gen_len=1024)
    p = predict_speedup(dep)
    st = step_time(T, HW, CallShape(context_len=1500, kv_slots=2048))
    assert p.config("fp16 AR").tpot_s == pytest.approx(st.time_s)  # every decode step reads all 2048 slots
    assert p.ctx_len == 2048 and "fixed cache of 2048" in p.table()
    assert Deployment(target=T, hardware=HW, cache="fixed").ctx_len == 128 + 896
    with pytest.raises(SimError, match="shorter"):
        Deployment(target=T, hardware=HW, cache="fixed", ctx_len=100)
    with pytest.raises(SimError, match="cache='fixed'"):
        Deployment(target=T, hardware=HW, ctx_len=4096)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(k=True), "K"),  # a bool is not K = 1
        (dict(k=10**6), r"\[1, 64\]"),  # the limit is in the message
        (dict(host_s=float("inf")), "host_s"),  # not 0 tok/s
        (dict(host_s=float("nan")), "host_s"),
        (dict(host_s=-1.0), "host_s"),
        (dict(batch_size=True), "batch_size"),
        (dict(batch_size=2**21), "batch_size"),
        (dict(prompt_len=3000, gen_len=2000), "maximum context of 4096"),
        (dict(gen_len=2**30), "gen_len"),
        (dict(devices=10**6), "devices"),
        (dict(devices=2.0), "devices"),
        (dict(target_format="fp12"), "weight format"),
        (dict(kv_format="int4"), "KV-cache format"),
        (dict(cache="paged"), "cache"),
        (dict(compress_lm_head="yes"), "compress_lm_head"),
        (dict(tree=10**6), "tree nodes"),
        (dict(tree=True), "tree nodes"),
        (dict(acceptance=True), "alpha"),
        (dict(loop_stats={"tokens_per_loop": float("inf"), "drafts_per_loop": 3.0}), "tokens_per_loop"),
    ],
)
def test_bad_input_is_refused_with_the_limit(kw, match):
    with pytest.raises(SimError, match=match):
        predict_speedup(T, D, HW, **kw)


def test_huge_sizes_are_refused_before_allocating():
    """predict_speedup(k=10**6) once allocated 24 GB; every size is checked before any array is made."""
    tracemalloc.start()
    for kw in (dict(k=10**6), dict(gen_len=10**9), dict(batch_size=10**9), dict(tree=10**7)):
        with pytest.raises(SimError):
            predict_speedup(T, D, HW, **kw)
    with pytest.raises(SimError, match="at most 5,000,000"):
        sweep(T, D, HW, k=range(1, 65), alpha=np.linspace(0, 1, 1001), axes=SweepAxes(batch_size=list(range(1, 200))))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50e6


def test_long_generations_are_averaged_over_evenly_spread_steps():
    """gen_len of a million tokens costs 2048 evaluations, and the mean matches the exact one closely."""
    exact = predict_speedup("llama-3.1-8b", None, "h100-sxm", prompt_len=100, gen_len=2049)
    spread = Deployment(target="llama-3.1-8b", hardware="h100-sxm", prompt_len=100, gen_len=4097)
    assert len(spread.decode_contexts()) == 2048
    assert exact.config("bf16 AR").tpot_s < predict_speedup(spread).config("bf16 AR").tpot_s
    big = predict_speedup("llama-3.1-8b", None, "h100-sxm", prompt_len=1000, gen_len=100_000)
    assert big.config("bf16 AR").tpot_s > exact.config("bf16 AR").tpot_s


def test_context_beyond_a_custom_spec_is_allowed_when_unknown():
    spec = preset(T).model_copy(update={"max_context": None})
    assert predict_speedup(spec, None, HW, prompt_len=8000, gen_len=100).prompt_len == 8000


def test_deployment_json_round_trip(tmp_path):
    dep = Deployment(target=T, draft=D, hardware=HW, batch_size=2, cache="fixed", ctx_len=2048)
    back = Deployment(**json.loads(dep.model_dump_json()))
    assert back == dep
    assert isinstance(back.target, ModelSpec) and back.hardware == hardware(HW)

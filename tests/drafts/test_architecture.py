"""The draft architecture: the training forward equals the reference decoder, the SVD embedding init is a projection."""

from __future__ import annotations

import pytest
import torch

from accel.drafts import DistillConfig
from accel.drafts.architecture import build_draft, causal_logits, draft_config, svd_embedding
from accel.models.decoder import Decoder
from tests.helpers.drafts import tiny_config


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("tied", [False, True])
def test_causal_logits_equal_reference_causal_forward(kv_heads, tied):
    model = Decoder(tiny_config(num_kv_heads=kv_heads, tie_word_embeddings=tied)).init_weights(seed=3, std=0.1)
    ids = torch.randint(0, 256, (3, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.causal_forward(ids)
        got = causal_logits(model, ids)
    # same math, different attention kernel (SDPA vs masked matmul + softmax): float32 rounding only
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_svd_embedding_is_projection_on_top_directions():
    gen = torch.Generator().manual_seed(0)
    # a weight with a known 3-D principal subspace plus small noise
    basis = torch.linalg.qr(torch.randn(16, 3, generator=gen))[0]
    w = torch.randn(500, 3, generator=gen) * torch.tensor([10.0, 5.0, 2.0]) @ basis.T
    w += 1e-3 * torch.randn(500, 16, generator=gen)
    proj = svd_embedding(w, 3)
    assert proj.shape == (500, 3)
    # the projection keeps all but the noise energy, and its columns are ordered by energy
    assert proj.pow(2).sum() / w.pow(2).sum() > 0.9999
    energy = proj.pow(2).sum(0)
    assert energy[0] > energy[1] > energy[2]
    # d larger than the width: zero padding
    assert torch.all(svd_embedding(w, 20)[:, 16:] == 0)


def test_build_draft_keeps_target_vocab_and_rope():
    target = Decoder(tiny_config(rope_theta=50000.0, eos_token_id=3)).init_weights(seed=1)
    cfg = DistillConfig(layers=1, d_model=32, heads=2)
    dc = draft_config(target.config, cfg)
    assert (dc.vocab_size, dc.rope_theta, dc.eos_token_id, dc.hidden_size) == (256, 50000.0, 3, 32)
    a, b = build_draft(target, cfg), build_draft(target, cfg)
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), n  # deterministic in the seed
    assert a.lm_head.weight is a.embed_tokens.weight  # tied by default
    torch.testing.assert_close(a.embed_tokens.weight, svd_embedding(target.embed_tokens.weight, 32))

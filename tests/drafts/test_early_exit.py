"""Early-exit heads (``accel.drafts.early_exit``): the plain exit is the target's norm + head on the stage path's
residual states, training raises the top-k agreement on held-out positions (full and sampled softmax), save/load
round trip, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel.backends import TorchBackend
from accel.backends.stages import StageSpec
from accel.drafts.data import self_generate
from accel.drafts.early_exit import (
    ExitHead,
    ExitTrainConfig,
    exit_hidden,
    load_exit_head,
    save_exit_head,
    topk_agreement,
    train_exit_head,
)
from accel.errors import DraftError
from accel.models import Decoder, ModelConfig

LAYERS, VOCAB = 4, 64


@pytest.fixture(scope="module")
def target() -> Decoder:
    cfg = ModelConfig(
        vocab_size=VOCAB, hidden_size=48, num_layers=LAYERS, num_heads=4, num_kv_heads=2, intermediate_size=96
    )
    return Decoder(cfg).init_weights(11, std=0.35).eval()


@pytest.fixture(scope="module")
def data(target):
    """Sampled continuations of random prompts with the target's top-16 (train) and greedy ones (held out)."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (4,), generator=gen).tolist() for _ in range(168)]
    train = self_generate(target, prompts[:160], [1.0] * 160, 24, 16, seed=1)
    held = self_generate(target, prompts[160:], [0.0] * 8, 24, 1, seed=2)
    return train, held


def _held_out(target, held, layer):
    hidden = exit_hidden(target, held.tokens, layer)
    nxt = torch.cat([held.tokens[:, 1:], torch.zeros_like(held.tokens[:, :1])], dim=1)
    mask = held.mask.clone()
    mask[:, -1] = False
    return hidden, nxt, mask


def test_plain_exit_is_the_targets_norm_and_head_on_the_stage_output(target):
    tokens = torch.tensor([[3, 9, 27, 1, 50, 2]])
    hidden = exit_hidden(target, tokens, 2)
    stage = TorchBackend(target, ctx_len=16, batch_size=1, stage=StageSpec(0, 2, LAYERS, exit_logits=True))
    out = stage.forward_stage(np.arange(6)[None], input_ids=tokens.numpy())
    np.testing.assert_allclose(hidden.numpy(), out.hidden, rtol=1e-5, atol=1e-4)  # another cache length
    with torch.no_grad():
        np.testing.assert_allclose(ExitHead(target, 2)(hidden).numpy(), out.logits, rtol=1e-4, atol=1e-4)
        # the last layer's exit is the model itself
        full = target.causal_forward(tokens).float()
        last = ExitHead(target, LAYERS - 1)(exit_hidden(target, tokens, LAYERS - 1))
    assert not torch.allclose(last, full, atol=1e-3)  # one layer short of the model: different logits


def test_topk_agreement_counts_by_hand(target):
    head = ExitHead(target, 2)
    hidden = torch.randn(1, 5, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        top = head(hidden).topk(3, dim=-1).indices[0]
    nxt = torch.stack([top[0, 0], top[1, 1], top[2, 2], top[3, 0], top[4, 0]])[None]
    nxt[0, 4] = next(t for t in range(VOCAB) if t not in top[4].tolist())  # a miss
    assert topk_agreement(head, hidden, nxt, torch.ones(1, 5, dtype=torch.bool)) == {1: 0.4, 2: 0.6, 3: 0.8}
    mask = torch.tensor([[True, True, True, True, False]])
    assert topk_agreement(head, hidden, nxt, mask) == {1: 0.5, 2: 0.75, 3: 1.0}


@pytest.mark.parametrize("negatives", [0, 24])
def test_training_raises_held_out_agreement(target, data, negatives):
    train, held = data
    layer = 2
    rows = train.mask.nonzero(as_tuple=True)
    hidden = exit_hidden(target, train.tokens, layer)[rows]
    ho = _held_out(target, held, layer)
    head = ExitHead(target, layer, width=128)
    before = topk_agreement(head, *ho)
    cfg = ExitTrainConfig(steps=300, lr=1e-2, warmup=10, batch_positions=256, eval_every=100, negatives=negatives)
    history = train_exit_head(
        head,
        hidden,
        train.topk_ids[rows],
        train.topk_logp[rows],
        cfg,
        eval_fn=lambda h: topk_agreement(h, *ho)[1],
        log=lambda _: None,
    )
    after = topk_agreement(head, *ho)
    assert [h["step"] for h in history] == [100, 200, 300]
    assert history[-1]["loss"] < history[0]["loss"]
    assert after[1] > before[1] + 0.05 and after[3] > before[3] + 0.1, (before, after)
    assert after[1] <= after[2] <= after[3]


def test_save_and_load_round_trip(target, tmp_path):
    head = ExitHead(target, 3, width=32)
    with torch.no_grad():
        head.mlp.down_proj.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    path = save_exit_head(head, target, tmp_path / "exit", {"note": "test"})
    loaded = load_exit_head(path, target)
    assert (loaded.layer, loaded.width) == (3, 32)
    x = torch.randn(4, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        np.testing.assert_allclose(loaded(x).numpy(), head(x).numpy(), atol=2e-2, rtol=0)  # fp16 storage
    other = Decoder(target.config.with_(num_layers=6)).init_weights(0, 0.1)
    with pytest.raises(DraftError, match="trained for a target"):
        load_exit_head(path, other)
    with pytest.raises(DraftError, match="not an exit head directory"):
        load_exit_head(tmp_path, target)
    with pytest.raises(DraftError, match=r"card's keys \['target'\] are the head's own"):
        save_exit_head(head, target, tmp_path / "exit2", {"target": "a name would hide the target's shape"})
    (path / "exit_head.json").write_text("{not json")
    with pytest.raises(DraftError, match="bad exit head card"):
        load_exit_head(path, target)


def test_errors(target):
    with pytest.raises(DraftError, match="exit layer"):
        ExitHead(target, LAYERS)
    with pytest.raises(DraftError, match="exit layer"):
        ExitHead(target, 0)
    with pytest.raises(DraftError, match="width"):
        ExitHead(target, 1, width=-1)
    with pytest.raises(DraftError, match="token ids"):
        exit_hidden(target, torch.tensor([[VOCAB]]), 1)
    with pytest.raises(DraftError, match="2-D integer"):
        exit_hidden(target, torch.zeros(3, dtype=torch.long), 1)
    head = ExitHead(target, 1)
    with pytest.raises(DraftError, match="same M positions"):
        train_exit_head(head, torch.zeros(4, 48), torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2))
    with pytest.raises(DraftError, match="no masked positions"):
        none = torch.zeros(1, 2, dtype=torch.bool)
        topk_agreement(head, torch.zeros(1, 2, 48), torch.zeros(1, 2, dtype=torch.long), none)

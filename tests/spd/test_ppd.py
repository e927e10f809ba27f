"""Predictive Pipelined Decoding (``accel.spd.ppd``): greedy PPD == greedy AR token for token (torch and onnxruntime
stages, several exit layers and k, concurrent and serial), the decoder's match rate == the exit head's top-k
agreement measured directly, sampled PPD has the target's law (chi-square against exact enumeration, with a wrong
law that fails at the same sample size), and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel.backends import OrtBackend, TorchBackend, export_onnx
from accel.backends.stages import StageSpec, split_layers
from accel.drafts.early_exit import ExitHead, exit_hidden, topk_agreement
from accel.errors import SpdError
from accel.models import Decoder, ModelConfig
from accel.spd import Sampling, generate_ar
from accel.spd.ppd import GREEDY, generate_ppd
from tests.helpers.decoders import perturbed, random_model
from tests.helpers.spd import ALPHA, NEW, PROMPT, VOCAB, chi_square, exact_law

LAYERS, V, CTX, MAX_NEW = 4, 48, 64, 40
PROMPTS = ([3, 1, 4, 1, 5], [9, 2, 6])
RUNS = 3000  # sampled runs of the chi-square test


@pytest.fixture(scope="module")
def target() -> Decoder:
    cfg = ModelConfig(
        vocab_size=V, hidden_size=32, num_layers=LAYERS, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    return Decoder(cfg).init_weights(5, std=0.4).eval()


def _torch_stages(model, exit_layer, k, head=None):
    front_spec, back_spec = split_layers(model.config.num_layers, [exit_layer], exit_logits=True)
    front = TorchBackend(model, ctx_len=CTX, batch_size=k, stage=front_spec, exit_head=head)
    return front, TorchBackend(model, ctx_len=CTX, batch_size=1, stage=back_spec)


def _ar(model, prompt, max_new=MAX_NEW):
    res = generate_ar(TorchBackend(model, ctx_len=CTX, batch_size=1), [prompt], max_new_tokens=max_new, sampling=GREEDY)
    return res.tokens[0]


@pytest.mark.parametrize(("exit_layer", "k", "concurrent"), [(1, 1, True), (2, 2, True), (2, 3, False), (3, 2, True)])
def test_greedy_ppd_equals_greedy_ar_torch(target, exit_layer, k, concurrent):
    front, back = _torch_stages(target, exit_layer, k)
    for prompt in PROMPTS:
        res = generate_ppd(front, back, prompt, max_new_tokens=MAX_NEW, concurrent=concurrent)
        assert res.tokens == _ar(target, prompt)
        s = res.stats
        assert (s.k, s.exit_layer, s.num_layers, s.new_tokens, s.steps) == (k, exit_layer, LAYERS, MAX_NEW, MAX_NEW - 1)
        assert s.hits == sum(s.hits_at_rank) and len(s.p_correct) == k
        assert 0 < s.hits < s.steps  # both paths (hit and miss) were taken


def test_greedy_ppd_equals_greedy_ar_onnxruntime(target, tmp_path):
    """Stage graphs (an exit stage with a non-trivial adapter) on onnxruntime == the whole graph's greedy AR."""
    head = ExitHead(target, 2, width=16)
    with torch.no_grad():
        head.mlp.down_proj.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(0))
    whole = OrtBackend(export_onnx(target, tmp_path / "whole.onnx", ctx_len=CTX, batch_size=1, progress=False))
    front_spec, back_spec = split_layers(LAYERS, [2], exit_logits=True)
    back = OrtBackend(
        export_onnx(target, tmp_path / "b.onnx", ctx_len=CTX, batch_size=1, progress=False, stage=back_spec)
    )
    for k in (1, 3):
        path = export_onnx(
            target, tmp_path / f"f{k}.onnx", ctx_len=CTX, batch_size=k, progress=False, stage=front_spec, exit_head=head
        )
        front = OrtBackend(path, threads=1)
        for prompt in PROMPTS:
            ar = generate_ar(whole, [prompt], max_new_tokens=MAX_NEW, sampling=GREEDY).tokens[0]
            res = generate_ppd(front, back, prompt, max_new_tokens=MAX_NEW)
            assert res.tokens == ar == _ar(target, prompt)
            assert res.stats.hits > 0


def test_match_rate_equals_the_exit_heads_topk_agreement(target):
    """Step s of the decoder hits at rank < k' iff the true token is among the exit head's top k' at the position
    before it: the decoder's p_correct equals ``topk_agreement`` over the generated positions."""
    head = ExitHead(target, 2)
    front, back = _torch_stages(target, 2, 3, head)
    prompt = PROMPTS[0]
    res = generate_ppd(front, back, prompt, max_new_tokens=MAX_NEW)
    seq = torch.tensor([prompt + res.tokens])
    nxt = torch.cat([seq[:, 1:], torch.zeros_like(seq[:, :1])], dim=1)
    mask = torch.zeros_like(seq, dtype=torch.bool)
    # speculation steps: candidates from positions n0 - 1 .. n0 + steps - 2 predict tokens 1 .. steps
    mask[0, len(prompt) : len(prompt) + res.stats.steps] = True
    direct = topk_agreement(head, exit_hidden(target, seq, 2), nxt, mask)
    assert res.stats.p_correct == pytest.approx([direct[1], direct[2], direct[3]], abs=1e-12)


def test_sampled_ppd_has_the_targets_law():
    """3,000 sampled continuations of 3 tokens (PPD decodes one row at a time); a perturbed target's AR samples
    fail the same test at the same size."""
    model = random_model(7, vocab_size=VOCAB)
    law = exact_law(model, dict(temperature=1.0))
    front, back = (
        TorchBackend(model, ctx_len=8, batch_size=b, stage=s)
        for b, s in zip((2, 1), split_layers(2, [1], exit_logits=True), strict=True)
    )
    rng = np.random.default_rng(0)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    hits = 0
    for _ in range(RUNS):
        res = generate_ppd(front, back, PROMPT, max_new_tokens=NEW, sampling=Sampling(), seed=rng, concurrent=False)
        counts[tuple(res.tokens)] += 1
        hits += res.stats.hits
    assert chi_square(counts, law) > ALPHA
    assert 0 < hits < 2 * RUNS
    wrong = generate_ar(
        TorchBackend(perturbed(model, 1, 0.3), ctx_len=8, batch_size=RUNS),
        [PROMPT] * RUNS,
        max_new_tokens=NEW,
        seed=1,
    )
    counts_w = np.zeros_like(counts)
    np.add.at(counts_w, tuple(np.array(wrong.tokens).T), 1)
    assert chi_square(counts_w, law) < ALPHA


def test_stops_and_errors(target):
    front, back = _torch_stages(target, 2, 2)
    assert generate_ppd(front, back, [1, 2], max_new_tokens=0).tokens == []
    one = generate_ppd(front, back, [1, 2], max_new_tokens=1)
    assert one.tokens == _ar(target, [1, 2], 1) and one.stats.steps == 0
    ar = _ar(target, [1, 2])
    eos = generate_ppd(front, back, [1, 2], max_new_tokens=MAX_NEW, eos_token_id=ar[5])
    assert eos.tokens == ar[: ar.index(ar[5]) + 1] and eos.finish_reason == "eos"
    full = generate_ppd(front, back, [i % 40 for i in range(60)], max_new_tokens=10)
    assert len(full.tokens) == CTX - 60 and full.finish_reason == "context"
    with pytest.raises(SpdError, match="front stage"):
        generate_ppd(back, front, [1], max_new_tokens=3)
    plain = TorchBackend(target, ctx_len=CTX, batch_size=2, stage=StageSpec(0, 2, LAYERS))
    with pytest.raises(SpdError, match="exit logits"):
        generate_ppd(plain, back, [1], max_new_tokens=3)
    wide_back = TorchBackend(target, ctx_len=CTX, batch_size=2, stage=StageSpec(2, 4, LAYERS))
    with pytest.raises(SpdError, match="batch_size 1"):
        generate_ppd(front, wide_back, [1], max_new_tokens=3)
    with pytest.raises(SpdError, match="token ids"):
        generate_ppd(front, back, [V], max_new_tokens=3)
    with pytest.raises(SpdError, match="non-empty"):
        generate_ppd(front, back, [], max_new_tokens=3)
    with pytest.raises(SpdError, match="max_new_tokens"):
        generate_ppd(front, back, [1], max_new_tokens=-1)
    with pytest.raises(SpdError, match="does not fit"):
        generate_ppd(front, back, list(range(1, 40)) * 2, max_new_tokens=3)

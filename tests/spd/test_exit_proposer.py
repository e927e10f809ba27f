"""``EarlyExit`` (PPD's top-k exit candidates as a depth-1 token tree) in the speculative decoding loop: greedy ==
greedy AR on torch and onnxruntime (ragged batch, several exit layers and k), sampled output has the target's law
(chi-square against exact enumeration) while a wrong variant (the same candidates declared as sampled from the exit
distribution) fails, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from accel.backends import OrtBackend, TorchBackend, export_onnx
from accel.backends.stages import StageSpec, split_layers
from accel.errors import SpdError
from accel.models import Decoder, ModelConfig
from accel.spd import Sampling, generate, generate_ar
from accel.spd.exit_proposer import EarlyExit
from accel.spd.tree import TokenTree
from tests.helpers.decoders import random_model
from tests.helpers.spd import ALPHA, NEW, PROMPT, ROWS, VOCAB, chi_square, exact_law

LAYERS, V, CTX, MAX_NEW = 4, 48, 64, 30
PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [7, 7, 2]]
GREEDY = Sampling(greedy=True)


@pytest.fixture(scope="module")
def target() -> Decoder:
    cfg = ModelConfig(
        vocab_size=V, hidden_size=32, num_layers=LAYERS, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    return Decoder(cfg).init_weights(5, std=0.4).eval()


def _front(model, exit_layer, batch, ctx=CTX):
    spec = StageSpec(0, exit_layer, model.config.num_layers, exit_logits=True)
    return TorchBackend(model, ctx_len=ctx, batch_size=batch, stage=spec)


@pytest.mark.parametrize(("exit_layer", "k"), [(1, 1), (2, 3), (3, 2)])
def test_greedy_equals_ar_torch(target, exit_layer, k):
    tb = TorchBackend(target, ctx_len=CTX, batch_size=2)
    ar = generate_ar(tb, PROMPTS, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(tb, EarlyExit(_front(target, exit_layer, 2), k), PROMPTS, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    assert res.stats.accepted_drafts > 0  # some candidates matched


def test_greedy_equals_ar_onnxruntime(target, tmp_path):
    whole = OrtBackend(
        export_onnx(target, tmp_path / "t.onnx", ctx_len=CTX, batch_size=2, progress=False, tree=True), threads=1
    )
    spec = split_layers(LAYERS, [2], exit_logits=True)[0]
    front = OrtBackend(
        export_onnx(target, tmp_path / "f.onnx", ctx_len=CTX, batch_size=2, progress=False, stage=spec), threads=1
    )
    ar = generate_ar(TorchBackend(target, ctx_len=CTX, batch_size=2), PROMPTS, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(whole, EarlyExit(front, 3), PROMPTS, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens


class _DeclaredSampled(EarlyExit):
    """Wrong: the top-k candidates declared as sampled from the exit's distribution."""

    def propose(self, run, rows):
        trees = super().propose(run, rows)
        out = []
        for t in trees:
            if t is None:
                out.append(None)
                continue
            dists = np.zeros((t.size, run.target.vocab_size))
            dists[1:] = 1.0 / run.target.vocab_size  # the declared law: uniform
            out.append(TokenTree(t.tokens, t.parents, dists, None, "wrong"))
        return out


def _counts(model, proposer_cls, seed):
    tb = TorchBackend(model, ctx_len=8, batch_size=ROWS)
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    accepted = 0
    for _ in range(5):
        prop = proposer_cls(_front(model, 1, ROWS, ctx=8), 2)
        res = generate(tb, prop, [PROMPT] * ROWS, max_new_tokens=NEW, seed=rng, sampling=Sampling())
        np.add.at(counts, tuple(np.array(res.tokens).T), 1)
        accepted += res.stats.accepted_drafts
    return counts, accepted


def test_sampling_has_the_targets_law():
    """10,000 sampled continuations of 3 tokens (significance 0.001); the wrong variant fails at the same size."""
    model = random_model(7, vocab_size=VOCAB)
    law = exact_law(model, dict(temperature=1.0))
    counts, accepted = _counts(model, EarlyExit, 0)
    assert accepted > 0
    assert chi_square(counts, law) > ALPHA
    wrong, _ = _counts(model, _DeclaredSampled, 1)
    assert chi_square(wrong, law) < ALPHA


def test_errors(target):
    with pytest.raises(SpdError, match="k \\(candidates"):
        EarlyExit(_front(target, 2, 2), 0)
    plain = TorchBackend(target, ctx_len=CTX, batch_size=2, stage=StageSpec(0, 2, LAYERS))
    with pytest.raises(SpdError, match="exit logits"):
        EarlyExit(plain, 2)
    tb = TorchBackend(target, ctx_len=CTX, batch_size=2)
    with pytest.raises(SpdError, match="batch_size"):
        generate(tb, EarlyExit(_front(target, 2, 3), 2), PROMPTS, max_new_tokens=4, sampling=GREEDY)

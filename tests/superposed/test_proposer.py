"""Superposed drafts as a proposer for exact speculative decoding (``accel.superposed.proposer``): the k drafts of a
round form a token tree of deterministic guesses that the target verifies.

Exact: greedy output equals greedy AR token for token (torch and onnxruntime, ragged batches); sampling keeps the
target's law (chi-square against exact enumeration, significance ALPHA = 0.001, fixed seed), and a wrong variant
(the same trees verified as if sampled from a uniform distribution) fails the same test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import accel.spd.loop as loop_module  # noqa: E402
from accel.backends import OrtBackend, export_onnx  # noqa: E402
from accel.spd import Sampling, generate, generate_ar  # noqa: E402
from accel.superposed import SuperposedConfig, SuperposedError  # noqa: E402
from accel.superposed.decode import Draft  # noqa: E402
from accel.superposed.proposer import SuperposedProposer, trie  # noqa: E402
from tests.helpers.decoders import backend, perturbed, random_model  # noqa: E402
from tests.helpers.spd import ALPHA, SETTINGS, VOCAB, chi_square, exact_law, sample_counts  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 30, 11, 4]]
CFG = SuperposedConfig(k=3, temperature=1.0)


@pytest.fixture(scope="module")
def pair32():
    target = random_model(seed=5, vocab_size=32, std=0.5)
    return target, perturbed(target, seed=6, rel=0.2)


def test_trie_merges_prefixes_and_keeps_the_budget():
    drafts = [Draft([4, 5, 6], -1.0, False), Draft([4, 5, 7], -2.0, False), Draft([8, 9], -3.0, True)]
    t = trie(0, drafts, max_nodes=10, max_depth=3)
    assert t is not None and t.tokens.tolist() == [0, 4, 5, 6, 7, 8, 9] and t.parents.tolist() == [-1, 0, 1, 2, 2, 0, 5]
    assert t.dists is None and t.source == "superposed"
    t = trie(0, drafts, max_nodes=4, max_depth=3)  # the third draft does not fit: skipped
    assert t.tokens.tolist() == [0, 4, 5, 6, 7]
    t = trie(0, drafts, max_nodes=10, max_depth=1)  # cut at depth 1: [4] twice is one node
    assert t.tokens.tolist() == [0, 4, 8] and t.parents.tolist() == [-1, 0, 0]
    assert trie(0, drafts, max_nodes=0, max_depth=3) is None


@pytest.mark.parametrize("depth", [1, 3])
def test_greedy_equals_ar_torch(pair32, depth):
    target, draft = pair32
    tb, db = backend(target, 3, ctx_len=64), backend(draft, 3, ctx_len=64)
    greedy = Sampling(greedy=True)
    ref = generate_ar(tb, PROMPTS, max_new_tokens=24, sampling=greedy).tokens
    res = generate(tb, SuperposedProposer(db, depth, CFG), PROMPTS, max_new_tokens=24, sampling=greedy)
    assert res.tokens == ref
    assert res.stats.tokens_per_target_call > 1.2  # the drafts are used, not only verified away


def test_greedy_equals_ar_onnxruntime(pair32, tmp_path):
    target, draft = pair32
    tgt = OrtBackend(export_onnx(target, tmp_path / "t.onnx", ctx_len=64, batch_size=3, progress=False, tree=True))
    dft = OrtBackend(export_onnx(draft, tmp_path / "d.onnx", ctx_len=64, batch_size=3, progress=False, mix_inputs=True))
    greedy = Sampling(greedy=True)
    ref = generate_ar(tgt, PROMPTS, max_new_tokens=20, sampling=greedy).tokens
    res = generate(tgt, SuperposedProposer(dft, 3, CFG), PROMPTS, max_new_tokens=20, sampling=greedy)
    assert res.tokens == ref


def _superposed(db):
    return SuperposedProposer(db, 2, SuperposedConfig(k=2, temperature=1.0, n_token_sample=4))


@pytest.fixture(scope="module")
def pair8():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


def test_sampling_keeps_the_target_law(pair8):
    target, draft = pair8
    sampling = SETTINGS["all"]
    counts, stats = sample_counts(target, draft, sampling, seed=105, runs=3, proposer=_superposed)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [superposed proposer]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert sum(s.new_tokens for s in stats) > 1.2 * sum(s.target_calls for s in stats)  # drafts were accepted


def test_wrong_variant_fails(pair8, monkeypatch):
    """Power check: the superposed trees verified as if sampled from a uniform law (not as point masses) are not
    exact, and the same test sees it."""
    target, draft = pair8
    sampling = SETTINGS["all"]
    real = loop_module.verify_sampled

    def as_if_uniform(tree, q_of, rng):
        if tree.source != "superposed":
            return real(tree, q_of, rng)
        return real(dataclasses.replace(tree, dists=np.full((tree.size, VOCAB), 1.0 / VOCAB), sampled=None), q_of, rng)

    monkeypatch.setattr(loop_module, "verify_sampled", as_if_uniform)
    counts, _ = sample_counts(target, draft, sampling, seed=105, runs=3, proposer=_superposed)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [superposed wrong variant]: {pvalue:.4g}")
    assert pvalue < ALPHA


def test_bad_proposers(pair32, tmp_path):
    target, draft = pair32
    plain = OrtBackend(export_onnx(draft, tmp_path / "p.onnx", ctx_len=32, batch_size=3, progress=False))
    with pytest.raises(SuperposedError, match="mix_inputs=True"):
        SuperposedProposer(plain)
    with pytest.raises(SuperposedError, match="depth"):
        SuperposedProposer(backend(draft, 3), depth=0)
    no_tree = OrtBackend(export_onnx(target, tmp_path / "t.onnx", ctx_len=32, batch_size=3, progress=False))
    with pytest.raises(Exception, match="tree"):
        generate(no_tree, SuperposedProposer(backend(draft, 3, ctx_len=32)), PROMPTS, max_new_tokens=4)

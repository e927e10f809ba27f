"""Speculative decoding with Hydra trees (``HydraProposer`` in ``accel.spd.generate``): greedy output equals greedy
AR token for token (torch and onnxruntime targets, Hydra and Hydra++, trees and chains, ragged batches), and sampled
output has the target's law (chi-square against exact enumeration, vocabulary 8, significance ALPHA = 0.001 at a
fixed seed), while Hydra's own typical acceptance (its reference code's verification) fails the same test."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import accel.spd.loop as loop_module  # noqa: E402
from accel.drafts.hydra import HydraProposer, HydraRuntime, TreeShape, export_hydra  # noqa: E402
from accel.drafts.hydra.tree import DECODE_BUDGET  # noqa: E402
from accel.errors import DraftError, SpdError  # noqa: E402
from accel.spd import GREEDY, FirstOf, Merge, NgramLookup, generate, generate_ar  # noqa: E402
from accel.spd.verify import TreeOutcome  # noqa: E402
from tests.helpers.decoders import backend, random_model  # noqa: E402
from tests.helpers.hydra import random_heads, tiny_target, trained_heads  # noqa: E402
from tests.helpers.spd import ALPHA, ROWS, SETTINGS, VOCAB, chi_square, exact_law, sample_counts  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 20, 11, 4]]  # ragged; one row starts with no target state
NEW = 24
CTX = 64


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def exported(target, tmp_path_factory):
    """Trained Hydra and Hydra++ heads (so that trees are accepted often), exported for batch 3."""
    root = tmp_path_factory.mktemp("hydra-spd")
    out = {}
    for prefix in (False, True):
        heads = trained_heads(target, root / f"train-{prefix}", prefix=prefix)
        out[prefix] = export_hydra(heads, root / f"onnx-{prefix}", ctx_len=CTX, batch_size=len(PROMPTS))
    return out


SHAPES = {
    "tree": TreeShape(depth=3, top_k=3, beam=2, budget=8),
    "chain": TreeShape.chain(3),
    "wide": TreeShape(depth=2, top_k=5, beam=5, budget=20),
    "decoding": TreeShape.for_decoding(3),  # the default: 4 nodes, grown with early stops
    "thresholds": TreeShape(depth=3, top_k=3, beam=3, budget=8, min_prob=0.05, expand_prob=0.2),
}


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_hydra_equals_ar(target, exported, prefix, shape):
    tb = backend(target, len(PROMPTS), ctx_len=CTX)
    ar = generate_ar(tb, PROMPTS, max_new_tokens=NEW, sampling=GREEDY)
    prop = HydraProposer(HydraRuntime(exported[prefix], threads=1), SHAPES[shape])
    res = generate(tb, prop, PROMPTS, max_new_tokens=NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    s = res.stats
    assert s.accepted_drafts > 0.25 * s.rounds, (s.accepted_drafts, s.rounds)  # the heads do get accepted
    assert s.target_calls < ar.stats.target_calls
    assert s.draft_calls > 0 and s.draft_s > 0


@pytest.mark.parametrize("how", ["first", "merge"])
def test_greedy_hydra_with_lookup_equals_ar(target, exported, how):
    """n-gram lookup before the Hydra tree (``FirstOf``) or joined into it (``Merge``), as ``accel generate --hydra
    DIR --ngram N [--ngram-merge]``: still the target's greedy tokens, and lookup is used."""
    tb = backend(target, len(PROMPTS), ctx_len=CTX)
    prompts = [p * 3 for p in PROMPTS]  # repeated text: lookup matches
    ar = generate_ar(tb, prompts, max_new_tokens=NEW, sampling=GREEDY)
    shape = SHAPES["thresholds" if how == "first" else "decoding"]  # "decoding": always 4 nodes while room lasts
    heads = HydraProposer(HydraRuntime(exported[True], threads=1), shape)
    prop = (FirstOf if how == "first" else Merge)(NgramLookup(3, 5), heads)
    res = generate(tb, prop, prompts, max_new_tokens=NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    s = res.stats
    assert s.accepted_drafts > 0
    if how == "first":
        assert 0 < s.lookup_rounds < s.row_calls  # lookup where it matches, the heads elsewhere
    else:
        assert sum(s.tree_nodes_histogram[shape.budget + 1 :]) > 0  # lookup's nodes joined the heads' tree


def test_greedy_on_onnxruntime_target(target, exported, tmp_path):
    """The whole loop on onnxruntime: the target exported with tree inputs and hidden states, Hydra++ heads."""
    from accel.backends import OrtBackend, export_onnx

    path = export_onnx(
        target, tmp_path / "t.onnx", ctx_len=CTX, batch_size=len(PROMPTS), hidden_output=True, tree=True, progress=False
    )
    tb = OrtBackend(path, threads=1)
    ar = generate_ar(tb, PROMPTS, max_new_tokens=NEW, sampling=GREEDY)
    prop = HydraProposer(HydraRuntime(exported[True], threads=1))
    assert prop.shape == TreeShape.for_decoding(3) and prop.info.max_nodes == DECODE_BUDGET
    res = generate(tb, prop, PROMPTS, max_new_tokens=NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    assert res.stats.accepted_drafts > 0


def test_proposer_errors(target, exported, tmp_path):
    rt = HydraRuntime(exported[True], threads=1)
    with pytest.raises(DraftError, match="needs 4 heads"):
        HydraProposer(rt, TreeShape(depth=4))
    with pytest.raises(SpdError, match="batch 3"):
        generate(backend(target, 2, ctx_len=CTX), HydraProposer(rt), PROMPTS[:2], max_new_tokens=4)
    with pytest.raises(SpdError, match="vocabulary"):
        generate(backend(random_model(seed=3, vocab_size=30), 3), HydraProposer(rt), PROMPTS, max_new_tokens=4)


# ---------------------------------------------------------------------------------------------- sampling exactness


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The exactness tests' vocabulary-8 target and Hydra++ heads for it (random, so that top-k candidates are often
    wrong and both verification outcomes are frequent), exported for ROWS rows."""
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    heads = random_heads(target, num_heads=2, prefix=True, scale=0.3)
    out = export_hydra(heads, tmp_path_factory.mktemp("hx8") / "heads", ctx_len=8, batch_size=ROWS)
    return target, HydraRuntime(out, threads=1)


SMALL = {
    "tree": TreeShape(depth=2, top_k=2, beam=2, budget=4),
    "thresholds": TreeShape(depth=2, top_k=2, beam=2, budget=4, min_prob=0.15, expand_prob=0.3),
}


def _hydra(rt, shape: str = "tree"):
    return lambda _: HydraProposer(rt, SMALL[shape])


@pytest.mark.parametrize("name,shape", [("plain", "tree"), ("all", "tree"), ("plain", "thresholds")])
def test_sampled_hydra_trees_match_target_exactly(pair, name, shape):
    """10,000 samples per setting (seed 300). Checked once at 80,000 samples too (seeds 300 and 301 x 40,000, tree
    depth 2 top-2): p = 0.14 pooled. With thresholds, trees are smaller where the heads are unsure: still exact."""
    target, rt = pair
    sampling = SETTINGS[name]
    counts, stats = sample_counts(target, target, sampling, seed=300, runs=5, proposer=_hydra(rt, shape))
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [hydra {name} {shape}]: {pvalue:.4g}")
    assert pvalue > ALPHA
    hist = np.sum([s.accepted_histogram for s in stats], axis=0)
    assert hist[0] > 500 and hist[1:].sum() > 500, hist  # rejections and acceptances both frequent
    nodes = np.sum([np.pad(s.tree_nodes_histogram, (0, 5))[:5] for s in stats], axis=0)
    # top-2 children: 2 or 4 nodes (fewer where the row's room ends); thresholds also drop single unsure children
    assert (nodes[1] + nodes[3] > 0) == (shape == "thresholds"), nodes


@pytest.mark.parametrize("shape", ["tree", "thresholds"])
def test_typical_acceptance_fails(pair, monkeypatch, shape):
    """Hydra's reference verification (typical acceptance, from Medusa: accept the first child whose target
    probability exceeds min(0.3, 0.09 exp(-entropy)), then sample the next token from the target) is not exact: the
    same chi-square test rejects it."""
    target, rt = pair

    def typical(tree, q_of, rng):
        kids = tree.children()
        out = TreeOutcome([0], -1)
        v = 0
        while True:
            q = q_of(v)
            entropy = -float(np.sum(q * np.log(np.maximum(q, 1e-30))))
            ok = [c for c in kids[v] if q[int(tree.tokens[c])] > min(0.3, 0.09 * np.exp(-entropy))]
            if not ok:
                out.next_token = int(rng.choice(len(q), p=q / q.sum()))
                return out
            v = ok[0]
            out.path.append(v)

    monkeypatch.setattr(loop_module, "verify_sampled", typical)
    counts, _ = sample_counts(target, target, SETTINGS["plain"], seed=300, runs=5, proposer=_hydra(rt, shape))
    pvalue = chi_square(counts, exact_law(target, SETTINGS["plain"]))
    print(f"chi-square p-value [typical acceptance]: {pvalue:.4g}")
    assert pvalue < ALPHA

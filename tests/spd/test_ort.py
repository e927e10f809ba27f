"""Greedy equivalence on onnxruntime: real ONNX files exported with ``export_onnx``, run by ``OrtBackend``.

Same checks as ``test_loop.test_greedy_equals_target_greedy``: greedy SpD equals greedy AR of the target (both on
onnxruntime), for a low-acceptance and a high-acceptance draft, batch 1 and 3 with ragged prompts.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

from accel.backends import OrtBackend, export_onnx
from accel.spd import GREEDY, DraftChain, Sampling, generate, generate_ar
from tests.helpers.decoders import perturbed, random_model
from tests.helpers.spd import MAX_NEW, PROMPTS_1, PROMPTS_3

CTX = 64


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("spd_onnx")
    target = random_model(seed=1, std=0.5)
    models = {"target": target, "random": random_model(seed=2, std=0.5), "perturbed": perturbed(target, 3, 0.02)}
    return {
        (name, b): export_onnx(m, d / f"{name}_b{b}.onnx", ctx_len=CTX, batch_size=b, progress=False)
        for name, m in models.items()
        for b in (1, 3)
    }


@pytest.fixture(scope="module")
def ort_ar(onnx_files):
    return {
        b: generate_ar(OrtBackend(onnx_files[("target", b)], threads=1), p, max_new_tokens=MAX_NEW, sampling=GREEDY)
        for b, p in ((1, PROMPTS_1), (3, PROMPTS_3))
    }


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("draft_kind", ["random", "perturbed"])
def test_ort_greedy_equals_target_greedy(onnx_files, ort_ar, k, batch, draft_kind):
    prompts = PROMPTS_1 if batch == 1 else PROMPTS_3
    tb = OrtBackend(onnx_files[("target", batch)], threads=1)
    db = OrtBackend(onnx_files[(draft_kind, batch)], threads=1)
    res = generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ort_ar[batch].tokens
    assert res.stats.accepted_histogram[0] > 0
    if draft_kind == "perturbed":
        assert res.stats.all_accepted_rounds > 0 and res.stats.alpha_counts > 0.6


def test_ort_matches_torch_greedy(onnx_files, ort_ar):
    """The ORT run decodes the same greedy continuation as the torch reference (tiny fp32 models: no near-ties)."""
    from tests.helpers.decoders import backend

    ref = generate_ar(backend(random_model(seed=1, std=0.5), 3), PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert ort_ar[3].tokens == ref.tokens


def test_ort_draft_equals_target_multinomial(onnx_files):
    tb = OrtBackend(onnx_files[("target", 3)], threads=1)
    db = OrtBackend(onnx_files[("target", 3)], threads=1)
    res = generate(
        tb, DraftChain(db, k=3), PROMPTS_3, max_new_tokens=MAX_NEW, seed=3, sampling=Sampling(temperature=0.8)
    )
    assert res.stats.alpha_counts == 1.0 and res.stats.alpha_overlap > 1 - 1e-5

"""Restricted LM heads (``ModelConfig.head_vocab``): logits, checkpoints, ONNX export and greedy SpD exactness.

Tolerances: a restricted head's logit at a kept id is the same dot product (head row . hidden state) as the full
head's, but computed inside a MatMul of a different shape ([head_vocab, d] instead of [vocab, d]), so the BLAS kernel
may sum in another order: fp32 rounding, measured <1e-7 on O(1) logits; ``atol=1e-5`` leaves margin while a wrong
row/id mapping moves logits by O(0.1). Masked positions are compared exactly (they are a constant fill).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import accel
from accel.backends import TorchBackend
from accel.drafts import restrict_head
from accel.drafts.architecture import causal_logits
from accel.errors import DraftError, ModelError
from accel.models import MASKED_LOGIT, Decoder, ModelConfig, load_checkpoint, new_cache, save_pretrained
from tests.helpers.scenario import make_tokens, run_scenario

ATOL = 1e-5
VOCAB = 96
KEEP = np.array([90, 0, 3, 7, 8, 15, 31, 32, 33, 50, 64, 77, 95, 12, 40, 41])  # unsorted on purpose
CTX = 32
PROMPTS = (4, 6)


def _full(tied: bool = False, seed: int = 0) -> Decoder:
    cfg = ModelConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=80,
        tie_word_embeddings=tied,
    )
    return Decoder(cfg).init_weights(seed, std=0.1).eval()


@pytest.fixture(scope="module", params=(False, True), ids=("untied", "tied"))
def pair(request):
    full = _full(tied=request.param)
    return full, restrict_head(full, KEEP).eval()


def _check_restricted(got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray) -> None:
    """``got`` equals ``want`` at the kept ids (fp32 tolerance) and is exactly MASKED_LOGIT elsewhere."""
    got, want = np.asarray(got), np.asarray(want)
    keep = np.sort(KEEP)
    masked = np.setdiff1d(np.arange(VOCAB), keep)
    assert got.shape == want.shape and got.shape[-1] == VOCAB
    np.testing.assert_allclose(got[..., keep], want[..., keep], atol=ATOL, rtol=0)
    assert np.all(got[..., masked] == np.float32(MASKED_LOGIT))


# ---------------------------------------------------------------------------------------------- logits


def test_restricted_model_structure(pair):
    full, small = pair
    assert small.config.head_vocab == len(KEEP) and not small.config.tie_word_embeddings
    assert small.lm_head.weight.shape == (len(KEEP), 64)
    assert small.lm_head_token_ids.dtype == torch.int64
    assert torch.equal(small.lm_head_token_ids, torch.from_numpy(np.sort(KEEP)))
    assert torch.equal(small.lm_head.weight, full.lm_head.weight[torch.from_numpy(np.sort(KEEP))])
    assert "lm_head_token_ids" in small.state_dict()


def test_causal_forward_and_causal_logits(pair):
    full, small = pair
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _check_restricted(small.causal_forward(ids), full.causal_forward(ids))
        _check_restricted(causal_logits(small, ids), causal_logits(full, ids))


def test_kv_cache_forward(pair):
    """Prefill + single steps + a scoring call through the cache (TorchBackend drives Decoder.forward)."""
    full, small = pair
    rows = make_tokens(VOCAB, PROMPTS, seed=3)
    got = run_scenario(TorchBackend(small, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    want = run_scenario(TorchBackend(full, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    for g, w in zip(got, want, strict=True):
        _check_restricted(g, w)


def test_forward_num_logits_and_fp16_fill(pair):
    _, small = pair
    ids = torch.tensor([[1, 2, 3]])
    pos = torch.arange(3)[None]
    keys, values = new_cache(small.config, 1, 8)
    with torch.no_grad():
        logits, _, _ = small(ids, pos, keys, values, num_logits=2)
    assert logits.shape == (1, 2, VOCAB)
    half = copy.deepcopy(small).half()
    keys, values = new_cache(half.config, 1, 8, dtype=torch.float16)
    with torch.no_grad():
        logits, _, _ = half(ids, pos, keys, values)
    assert torch.isfinite(logits).all()  # -1e9 does not fit float16: the fill clamps to its lowest finite value
    assert torch.softmax(logits.float(), -1)[..., 1].max() == 0.0  # id 1 is not kept


# ---------------------------------------------------------------------------------------------- checkpoints


@pytest.fixture()
def saved(pair, tmp_path):
    _, small = pair
    return small, save_pretrained(small, tmp_path / "ckpt")


def test_save_load_round_trip(saved):
    small, path = saved
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["accel_head_vocab"] == len(KEEP)
    from safetensors.torch import load_file

    stored = load_file(path / "model.safetensors")
    assert stored["lm_head.token_ids"].dtype == torch.int64
    loaded = load_checkpoint(path)
    assert loaded.config == small.config
    for name, t in small.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name


def test_full_config_has_no_head_vocab_key():
    assert "accel_head_vocab" not in _full().config.to_hf()
    assert ModelConfig.from_hf(_full().config.to_hf()).head_vocab == 0


def test_compressed_checkpoint_round_trip(saved, tmp_path):
    from accel.formats import compress_checkpoint

    small, path = saved
    out = tmp_path / "mx"
    report = compress_checkpoint(path, out, "mxfp6", progress=False)
    assert "lm_head.token_ids" in report.skipped and "lm_head.weight" in report.skipped
    loaded = load_checkpoint(out)
    assert torch.equal(loaded.lm_head_token_ids, small.lm_head_token_ids)
    reference = copy.deepcopy(small)
    accel.compress(reference, "mxfp6")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(loaded.causal_forward(ids), reference.causal_forward(ids))


def test_accel_save_load_round_trip(pair, tmp_path):
    _, small = pair
    model = copy.deepcopy(small)
    accel.compress(model, "mxfp6")
    accel.save_compressed(model, tmp_path / "m.safetensors")
    skeleton = Decoder(small.config)
    assert not torch.equal(skeleton.lm_head_token_ids, small.lm_head_token_ids)
    back = accel.load_compressed(tmp_path / "m.safetensors", skeleton)
    assert torch.equal(back.lm_head_token_ids, small.lm_head_token_ids)
    ids = torch.tensor([[4, 9, 2]])
    with torch.no_grad():
        assert torch.equal(back.causal_forward(ids), model.causal_forward(ids))


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(head_vocab=VOCAB), "< vocab_size"),
        (dict(head_vocab=VOCAB + 5), "< vocab_size"),
        (dict(head_vocab=-1), "< vocab_size"),
        (dict(head_vocab=8, tie_word_embeddings=True), "tie_word_embeddings"),
        (dict(head_vocab=8.0), "must be an int"),
    ],
)
def test_invalid_config(changes, match):
    with pytest.raises(ModelError, match=match):
        _full().config.with_(**changes)


def test_invalid_config_json():
    cfg = _full().config.to_hf()
    with pytest.raises(ModelError, match="accel_head_vocab"):
        ModelConfig.from_hf({**cfg, "accel_head_vocab": "8"})
    with pytest.raises(ModelError, match="tie_word_embeddings"):
        ModelConfig.from_hf({**cfg, "accel_head_vocab": 8, "tie_word_embeddings": True})


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (torch.tensor([0, 3, 3, 9]), "sorted ascending without repeats"),
        (torch.tensor([0, 9, 3, 10]), "sorted ascending without repeats"),
        (torch.tensor([-1, 3, 4, 9]), "outside"),
        (torch.tensor([0, 3, 4, VOCAB]), "outside"),
        (torch.tensor([0.0, 3.0, 4.0, 9.0]), "integer"),
        (torch.tensor([0, 3, 4]), "shape"),
    ],
)
def test_bad_token_ids_in_checkpoint(tmp_path, ids, match):
    from safetensors.torch import load_file, save_file

    path = save_pretrained(restrict_head(_full(), [0, 3, 4, 9]), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.token_ids"] = ids
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelError, match=match):
        load_checkpoint(path)


def test_missing_token_ids_in_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_pretrained(restrict_head(_full(), [0, 3, 4, 9]), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.token_ids"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelError, match="lm_head_token_ids"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([], "non-empty"),
        ([[1, 2]], "1-D"),
        ([1, 2, 2], "repeated"),
        ([-1, 2], r"\[0, 96\)"),
        ([1, VOCAB], r"\[0, 96\)"),
        ([1.0, 2.0], "integers"),
        (list(range(VOCAB)), "fewer than vocab_size"),
    ],
)
def test_restrict_head_bad_ids(ids, match):
    with pytest.raises(DraftError, match=match):
        restrict_head(_full(), ids)


def test_restrict_a_restricted_head(pair):
    full, small = pair
    sub = restrict_head(small, [90, 3, 31])
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a, b = sub.causal_forward(ids), full.causal_forward(ids)
    keep = torch.tensor([3, 31, 90])
    torch.testing.assert_close(a[..., keep], b[..., keep], atol=ATOL, rtol=0)
    with pytest.raises(DraftError, match="does not score"):
        restrict_head(small, [1, 2])  # 1 and 2 are not in KEEP


# ---------------------------------------------------------------------------------------------- ONNX


@pytest.mark.parametrize("weights", ["fp32", "fp16", "mx-rounded", "mx-packed"])
def test_onnx_export_matches_torch(pair, weights, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    from accel.backends import OrtBackend, export_onnx

    _, small = pair
    path = export_onnx(small, tmp_path / "m.onnx", ctx_len=CTX, batch_size=2, weights=weights, progress=False)
    proto = onnx.load(str(path))
    out = proto.graph.output[0]
    assert out.name == "logits"
    assert [d.dim_value or d.dim_param for d in out.type.tensor_type.shape.dim] == [2, "seq_len", VOCAB]
    assert "ScatterElements" in {n.op_type for n in proto.graph.node}
    reference = small
    if weights.startswith("mx"):
        reference = copy.deepcopy(small)
        accel.compress(reference, "mxfp6")  # lm_head stays float, as in the export
    elif weights == "fp16":  # parameters rounded to fp16 (not the RoPE buffer, which the graph recomputes)
        reference = copy.deepcopy(small)
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(p.half().float())
    rows = make_tokens(VOCAB, PROMPTS, seed=5)
    want = run_scenario(TorchBackend(reference, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    got = run_scenario(OrtBackend(path, threads=1), rows, PROMPTS)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)
        masked = np.setdiff1d(np.arange(VOCAB), KEEP)
        assert np.all(g[..., masked] == np.float32(MASKED_LOGIT))


# ---------------------------------------------------------------------------------------------- greedy SpD


def test_greedy_spd_with_restricted_draft_equals_ar_on_ort(tmp_path):
    """Greedy SpD is token-identical to greedy AR whatever the draft; the restricted draft still gets accepted."""
    pytest.importorskip("onnxruntime")
    from accel.backends import OrtBackend, export_onnx
    from accel.spd import GREEDY, DraftChain, generate, generate_ar
    from tests.helpers.decoders import perturbed, random_model

    target = random_model(seed=1, std=0.5)
    draft = restrict_head(perturbed(target, 3, 0.02), [*list(range(0, 32, 2)), 1, 3, 5])
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 30, 11, 4]]
    tpath = export_onnx(target, tmp_path / "t.onnx", ctx_len=64, batch_size=3, progress=False)
    dpath = export_onnx(draft, tmp_path / "d.onnx", ctx_len=64, batch_size=3, progress=False)
    ar = generate_ar(OrtBackend(tpath, threads=1), prompts, max_new_tokens=24, sampling=GREEDY)
    for k in (1, 3, 5):
        res = generate(
            OrtBackend(tpath, threads=1),
            DraftChain(OrtBackend(dpath, threads=1), k=k),
            prompts,
            max_new_tokens=24,
            sampling=GREEDY,
        )
        assert res.tokens == ar.tokens
        assert res.stats.alpha_counts > 0.2


# ---------------------------------------------------------------------------------------------- simulator


def test_sim_counts_the_restricted_head(pair):
    """accel.sim's ModelSpec from the config (config.json or ModelConfig.to_dict) counts head_vocab head rows."""
    from accel.errors import SimError
    from accel.sim.models import from_hf_config

    full, small = pair
    for cfg in (small.config.to_hf(), small.config.to_dict()):
        spec = from_hf_config(cfg)
        assert spec.head_vocab == len(KEEP) and spec.lm_head_params == len(KEEP) * 64
        assert spec.num_params == small.num_parameters
    assert from_hf_config(full.config.to_hf()).num_params == full.num_parameters
    with pytest.raises(SimError, match="head_vocab"):
        from_hf_config({**small.config.to_hf(), "accel_head_vocab": VOCAB})

"""export_onnx + OrtBackend: the KV-cache contract, agreement with torch, MX weights, and input validation.

Tolerances: ORT and torch run the same fp32 graph with different kernels (MatMul blocking, fused softmax, rsqrt vs
1/sqrt), measured ~1e-7 on O(1) logits; ``atol=1e-5`` leaves margin and still catches a wrong cache slot or mask
(O(0.1)). Comparisons of one runtime with itself (overwrite vs fresh run) are exact.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from accel.backends import GraphSpec, OrtBackend, TorchBackend, export_onnx
from accel.backends.base import BackendInfo
from accel.backends.calls import TreeInputs, check_step_inputs
from accel.backends.stages import StageSpec
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig, load_checkpoint
from tests.helpers.scenario import SCORE, hf_reference, make_tokens, run_scenario, smollm2_model, tiny_hf_model

PROMPTS = (4, 6)
CTX = 32
ATOL = 1e-5


def _tiny_llama(seed: int = 0) -> Decoder:
    cfg = ModelConfig(
        vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=80, norm_eps=1e-5
    )
    return Decoder(cfg).init_weights(seed, std=0.1)


@pytest.fixture(scope="module", params=("llama", "qwen2", "mistral", "gpt2"))
def exported(request, tmp_path_factory):
    hf = tiny_hf_model(request.param)
    model = load_checkpoint(hf)
    path = export_onnx(
        model, tmp_path_factory.mktemp("onnx") / f"{request.param}.onnx", ctx_len=CTX, batch_size=2, progress=False
    )
    return hf, model, path


def test_ort_matches_torch_and_transformers(exported):
    hf, model, path = exported
    rows = make_tokens(model.config.vocab_size, PROMPTS, seed=1)
    ort_out = run_scenario(OrtBackend(path, threads=1), rows, PROMPTS)
    torch_out = run_scenario(TorchBackend(model, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    for o, t, r in zip(ort_out, torch_out, hf_reference(hf, rows), strict=True):
        np.testing.assert_allclose(o, t, atol=ATOL, rtol=0)
        np.testing.assert_allclose(o, r, atol=2e-5, rtol=0)


def test_graph_contract_and_metadata(exported):
    _, model, path = exported
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert proto.ir_version <= 13
    c = model.config
    ins = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    outs = [o.name for o in proto.graph.output]
    assert ins["input_ids"] == ins["position_ids"] == [2, "seq_len"]
    for i in range(c.num_layers):
        assert ins[f"past_key.{i}"] == ins[f"past_value.{i}"] == [2, c.num_kv_heads, CTX, c.head_dim]
    assert outs == ["logits"] + [f"past_{kv}.{i}_RetainedState" for i in range(c.num_layers) for kv in ("key", "value")]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["accel.weights"] == "fp32" and meta["accel.ctx_len"] == str(CTX) and meta["accel.batch_size"] == "2"
    info = OrtBackend(path).info
    assert (info.vocab_size, info.ctx_len, info.batch_size, info.num_layers) == (c.vocab_size, CTX, 2, c.num_layers)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = _tiny_llama()
    path = export_onnx(model, tmp_path_factory.mktemp("llama") / "m.onnx", ctx_len=CTX, batch_size=2, progress=False)
    return model, path


def _prefill(backend, rows, n):
    ids = np.stack([r[:n] for r in rows])
    backend.forward(ids, np.broadcast_to(np.arange(n), ids.shape))


@pytest.mark.parametrize("runtime", ["ort", "torch"])
def test_scoring_equals_sequential_steps(llama, runtime):
    model, path = llama
    make = (lambda: OrtBackend(path)) if runtime == "ort" else (lambda: TorchBackend(model, ctx_len=CTX, batch_size=2))
    rows = make_tokens(96, (10, 10), seed=2)
    a, b = make(), make()
    _prefill(a, rows, 6)
    _prefill(b, rows, 6)
    ids = np.stack([r[6 : 6 + SCORE] for r in rows])
    pos = np.broadcast_to(np.arange(6, 6 + SCORE), ids.shape)
    scored = a.forward(ids, pos, num_logits=SCORE)
    steps = np.concatenate([b.forward(ids[:, j : j + 1], pos[:, j : j + 1]) for j in range(SCORE)], axis=1)
    np.testing.assert_allclose(scored, steps, atol=ATOL, rtol=0)


@pytest.mark.parametrize("runtime", ["ort", "torch"])
def test_rescoring_overwrites_stale_slots(llama, runtime):
    model, path = llama
    make = (lambda: OrtBackend(path)) if runtime == "ort" else (lambda: TorchBackend(model, ctx_len=CTX, batch_size=2))
    rows = make_tokens(96, (10, 10), seed=4)
    other = make_tokens(96, (10, 10), seed=5)
    pos = np.broadcast_to(np.arange(6, 6 + SCORE), (2, SCORE))
    reused, fresh = make(), make()
    _prefill(reused, rows, 6)
    reused.forward(np.stack([r[6 : 6 + SCORE] for r in other]), pos)  # rejected draft
    new_ids = np.stack([r[6 : 6 + SCORE] for r in rows])
    got = reused.forward(new_ids, pos)
    _prefill(fresh, rows, 6)
    np.testing.assert_array_equal(got, fresh.forward(new_ids, pos))
    # a shorter re-score leaves stale slots beyond it: they must be masked
    got = reused.forward(new_ids[:, :2], pos[:, :2])
    np.testing.assert_array_equal(got, fresh.forward(new_ids[:, :2], pos[:, :2]))


def test_reset_and_cache_stays_in_runtime_buffers(llama):
    _, path = llama
    backend = OrtBackend(path)
    rows = make_tokens(96, (8, 8), seed=6)
    ids = np.stack([r[:8] for r in rows])
    pos = np.broadcast_to(np.arange(8), ids.shape)
    first = backend.forward(ids, pos)
    assert np.any(backend.cache()[0] != 0)
    backend.reset()
    assert not np.any(backend.cache()[0])
    np.testing.assert_array_equal(backend.forward(ids, pos), first)


def test_reset_zeroes_every_slot_a_call_tree_or_move_wrote(tmp_path):
    """reset zeroes only the slots up to the highest written since the last reset; every slot written by a chain
    call, a stage call's positions, a tree call's slot ids or a cache move is among them, so the whole cache is zero
    after it, and the next decode equals a fresh backend's."""
    opts = {"ctx_len": CTX, "batch_size": 2, "tree": True, "progress": False}
    b = OrtBackend(export_onnx(_tiny_llama(), tmp_path / "t.onnx", **opts))
    ids, pos = np.tile(np.arange(1, 6), (2, 1)), np.tile(np.arange(5), (2, 1))
    pos[1, :2] = -1  # padding writes nothing
    b.forward(ids, pos)
    mask = np.zeros((2, 2, CTX), bool)
    mask[:, :, :5] = True
    mask[:, 0, 20] = mask[:, 1, 21] = True
    mask[:, 1, 20] = True
    b.forward(ids[:, :2], np.tile([5, 6], (2, 1)), tree=TreeInputs(np.tile([20, 21], (2, 1)), mask))
    b.move_cache(np.array([[21], [-1]]), np.array([[8], [-1]]))  # below the tree's slots: they set the highest
    kv = np.stack(b.cache())
    assert np.any(kv[:, 0, :, 8]) and np.any(kv[:, :, :, 21]) and not np.any(kv[:, :, :, 22:])
    b.reset()
    assert not np.any(np.stack(b.cache()))
    b.forward(ids, pos)
    b.move_cache(np.array([[4], [-1]]), np.array([[27], [-1]]))  # above every call's slots: the move sets it
    assert np.any(np.stack(b.cache())[:, 0, :, 27])
    b.reset()
    assert not np.any(np.stack(b.cache()))
    fresh = OrtBackend(export_onnx(_tiny_llama(), tmp_path / "f.onnx", **opts))
    np.testing.assert_array_equal(b.forward(ids, pos), fresh.forward(ids, pos))


def test_baked_num_logits(llama, tmp_path):
    model, _ = llama
    path = export_onnx(model, tmp_path / "last2.onnx", ctx_len=CTX, batch_size=2, num_logits=2, progress=False)
    baked, full = OrtBackend(path), OrtBackend(llama[1])
    ids = np.tile(np.arange(5), (2, 1))
    pos = np.tile(np.arange(5), (2, 1))
    np.testing.assert_allclose(baked.forward(ids, pos, num_logits=2), full.forward(ids, pos, num_logits=2), atol=ATOL)
    with pytest.raises(BackendError, match="only the last 2 logits"):
        baked.forward(ids, pos)


@pytest.mark.parametrize("extras", [{}, {"hidden_output": True, "tree": True}])
def test_num_logits_input(llama, tmp_path, extras):
    """A graph with the input num_logits runs the head on the last num_logits tokens only (the session's own output
    has that many rows) and gives the full graph's logits there; hidden states stay every token's."""
    model, _ = llama
    full_path = export_onnx(model, tmp_path / "all.onnx", ctx_len=CTX, batch_size=2, progress=False, **extras)
    path = export_onnx(
        model, tmp_path / "last.onnx", ctx_len=CTX, batch_size=2, logits_input=True, progress=False, **extras
    )
    part, full = OrtBackend(path), OrtBackend(full_path)
    assert part.contract.logits_input and part.graph_spec.logits_input and not full.contract.logits_input
    assert part.metadata["accel.logits_input"] == "1"
    ids = np.tile(np.arange(7), (2, 1))
    pos = np.tile(np.arange(7), (2, 1))
    for n in (1, 3, 7):
        part.reset()
        full.reset()
        got = part.forward(ids, pos, num_logits=n)
        assert got.shape == (2, n, model.config.vocab_size)
        np.testing.assert_allclose(got, full.forward(ids, pos, num_logits=n), atol=ATOL, rtol=0)
        assert part._binding.get_outputs()[0].shape()[1] == n  # the graph computed n rows, not 7
    if extras:
        part.reset()
        full.reset()
        logits, hidden = part.forward_hidden(ids, pos, num_logits=2)
        ref_logits, ref_hidden = full.forward_hidden(ids, pos, num_logits=2)
        assert hidden.shape == ref_hidden.shape == (2, 7, model.config.hidden_size)
        np.testing.assert_allclose(hidden, ref_hidden, atol=ATOL, rtol=0)
        np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)


def test_num_logits_input_is_refused_with_a_fixed_count_or_in_a_stage():
    with pytest.raises(BackendError, match="logits_input"):
        GraphSpec(ctx_len=CTX, num_logits=2, logits_input=True)
    with pytest.raises(BackendError, match="logits_input"):
        GraphSpec(ctx_len=CTX, logits_input=True, stage=StageSpec(0, 1, 2))
    spec = GraphSpec(ctx_len=CTX, logits_input=True)
    assert GraphSpec.from_json(spec.to_json()) == spec
    assert "logits_input" not in GraphSpec(ctx_len=CTX).to_dict()  # older graphs' cache keys stay


def test_num_logits_input_of_the_wrong_shape_is_named(llama, tmp_path):
    model, _ = llama
    path = export_onnx(model, tmp_path / "last.onnx", ctx_len=CTX, batch_size=2, logits_input=True, progress=False)
    proto = onnx.load(str(path))
    dim = next(i for i in proto.graph.input if i.name == "num_logits").type.tensor_type.shape.dim[0]
    dim.dim_value = 2
    onnx.save(proto, str(tmp_path / "bad.onnx"))
    with pytest.raises(BackendError, match="num_logits must be int64 \\[1\\]"):
        OrtBackend(tmp_path / "bad.onnx")


def test_fp16_weights(llama, tmp_path):
    model, _ = llama
    path = export_onnx(model, tmp_path / "h.onnx", ctx_len=CTX, batch_size=2, weights="fp16", progress=False)
    rounded = _tiny_llama()
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    rows = make_tokens(96, PROMPTS, seed=7)
    for o, t in zip(
        run_scenario(OrtBackend(path), rows, PROMPTS),
        run_scenario(TorchBackend(rounded, ctx_len=CTX, batch_size=2), rows, PROMPTS),
        strict=True,
    ):
        np.testing.assert_allclose(o, t, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "ids, pos, kwargs, match",
    [
        (np.zeros((2, 1), np.int64), np.full((2, 1), CTX), {}, "beyond the KV cache"),
        (np.zeros((2, CTX + 1), np.int64), np.tile(np.arange(CTX + 1), (2, 1)) % CTX, {}, "sequence length"),
        (np.zeros((3, 1), np.int64), np.zeros((3, 1), np.int64), {}, "batch size 3"),
        (np.full((2, 1), 96), np.zeros((2, 1), np.int64), {}, "outside the vocabulary"),
        (np.zeros((2, 2), np.int64), np.tile(np.arange(2), (2, 1)), {"num_logits": 3}, "num_logits=3"),
    ],
)
def test_bad_inputs_raise_backend_error(llama, ids, pos, kwargs, match):
    with pytest.raises(BackendError, match=match):
        OrtBackend(llama[1]).forward(ids, pos, **kwargs)


@pytest.mark.parametrize("padded", [False, True])
def test_step_inputs_are_checked_with_and_without_padding(padded):
    """check_step_inputs takes a reduction-only path for calls without padding (position -1): both paths refuse the
    same inputs, name the same value, and only the padded one lets a padding column hold any id (replaced by 0)."""
    info = BackendInfo("t", vocab_size=96, ctx_len=CTX, batch_size=1, max_seq_len=CTX)
    lead = ([-1], [500]) if padded else ([], [])  # a padding column first, holding an id outside the vocabulary
    ids, pos = check_step_inputs(info, np.array([[*lead[1], 5, 6]]), np.array([[*lead[0], 3, 4]]))
    assert ids.tolist() == [[*([0] if padded else []), 5, 6]] and ids.dtype == np.int64 and ids.flags.writeable
    assert pos.tolist() == [[*lead[0], 3, 4]]
    bad = [
        ([5, 6], [3, -2], "below -1 \\(the padding marker\\): min -2"),
        ([5, 6], [3, CTX + 4], f"position {CTX + 4} is beyond the KV cache"),
        ([5, 96], [3, 4], "token id 96 is outside"),
        ([-3, 6], [3, 4], "token id -3 is outside"),
    ]
    for row_ids, row_pos, match in bad:
        with pytest.raises(BackendError, match=match):
            check_step_inputs(info, np.array([[*lead[1], *row_ids]]), np.array([[*lead[0], *row_pos]]))
    view = np.broadcast_to(np.array([[5, 6]]), (1, 2))  # read-only: the ids handed to the runtime are a copy
    assert check_step_inputs(info, view, np.array([[3, 4]]))[0].flags.writeable


def test_wrong_batch_size_at_load(llama):
    with pytest.raises(BackendError, match="exported for batch size 2, not 1"):
        OrtBackend(llama[1], batch_size=1)


def test_graph_missing_expected_io(llama, tmp_path):
    proto = onnx.load(str(llama[1]))
    kept = [o for o in proto.graph.output if o.name != "past_value.1_RetainedState"]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save(proto, tmp_path / "no_out.onnx")
    with pytest.raises(BackendError, match=r"'past_value.1_RetainedState' is missing"):
        OrtBackend(tmp_path / "no_out.onnx")
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["input_ids"], ["logits"])],
        "g",
        [onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, 1])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.INT64, [1, 1])],
    )
    onnx.save(
        onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8),
        tmp_path / "bare.onnx",
    )
    with pytest.raises(BackendError, match="input 'position_ids' is missing"):
        OrtBackend(tmp_path / "bare.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(BackendError, match="onnxruntime cannot load"):
        OrtBackend(tmp_path / "junk.onnx")


def test_inplace_cache_needs_reads_before_the_write(llama, tmp_path):
    """OrtBackend binds each cache buffer as input and output; a graph reading past_* after (or independently of)
    its ScatterND write, or writing it with another op, would see the new values: rejected by name."""
    proto = onnx.load(str(llama[1]))
    proto.graph.node.append(onnx.helper.make_node("ReduceSum", ["past_value.1"], ["late_read"], keepdims=0))
    proto.graph.output.append(onnx.helper.make_tensor_value_info("late_read", onnx.TensorProto.FLOAT, []))
    onnx.save(proto, tmp_path / "late.onnx")
    with pytest.raises(BackendError, match=r"past_value.1 is read by .* independently of its cache write"):
        OrtBackend(tmp_path / "late.onnx")
    proto = onnx.load(str(llama[1]))
    writer = next(n for n in proto.graph.node if "past_key.0_RetainedState" in n.output)
    writer.output[0] = "scattered"
    proto.graph.node.append(onnx.helper.make_node("Identity", ["scattered"], ["past_key.0_RetainedState"]))
    onnx.save(proto, tmp_path / "copy.onnx")
    with pytest.raises(
        BackendError, match=r"past_key.0_RetainedState is not a ScatterND \(or ai.accel::CacheAttention\) of past_key.0"
    ):
        OrtBackend(tmp_path / "copy.onnx")


def test_export_rejects_bad_settings(llama, tmp_path):
    model, _ = llama
    with pytest.raises(BackendError, match="weights='int3'"):
        export_onnx(model, tmp_path / "x.onnx", ctx_len=CTX, weights="int3", progress=False)
    with pytest.raises(BackendError, match="opset 13"):
        export_onnx(model, tmp_path / "x.onnx", ctx_len=CTX, opset=13, progress=False)
    assert not list(tmp_path.iterdir())  # nothing half-written


# ---------------------------------------------------------------------------------------------- SmolLM2


@pytest.mark.slow
def test_smollm2_ort_matches_torch(tmp_path):
    model = smollm2_model()
    path = export_onnx(model, tmp_path / "smol.onnx", ctx_len=16, batch_size=2, progress=False)
    prompts = (3, 5)
    rows = make_tokens(model.config.vocab_size, prompts, seed=8)
    ort_out = run_scenario(OrtBackend(path), rows, prompts)
    torch_out = run_scenario(TorchBackend(model, ctx_len=16, batch_size=2), rows, prompts)
    for o, t in zip(
        ort_out, torch_out, strict=True
    ):  # logits reach ~30: fp32 order over 30 layers, see test_smollm2.py
        np.testing.assert_allclose(o, t, atol=1e-3, rtol=0)


@pytest.mark.parametrize("runtime", ["ort", "torch"])
def test_padding_writes_nothing(llama, runtime):
    """A row that is all padding (a finished sequence) or right-padded keeps its cache untouched."""
    model, path = llama
    make = (lambda: OrtBackend(path)) if runtime == "ort" else (lambda: TorchBackend(model, ctx_len=CTX, batch_size=2))
    rows = make_tokens(96, (12, 12), seed=9)
    padded, plain = make(), make()
    _prefill(padded, rows, 6)
    _prefill(plain, rows, 6)
    # row 1 idles (all padding) while row 0 advances; then row 1 is right-padded while row 0 is left-padded
    padded.forward(np.array([[rows[0][6]], [5]]), np.array([[6], [-1]]))
    plain.forward(np.array([[rows[0][6]], [rows[1][6]]]), np.array([[6], [6]]))
    plain.forward(np.array([[rows[0][6]], [rows[1][6]]]), np.array([[6], [6]]))  # same write again: idempotent
    got = padded.forward(np.array([[0, rows[0][7]], [rows[1][6], 0]]), np.array([[-1, 7], [6, -1]]))
    want = plain.forward(np.array([[rows[0][7], rows[0][7]], [rows[1][6], rows[1][6]]]), np.array([[7, 7], [6, 6]]))
    np.testing.assert_allclose(got[0, 1], want[0, 1], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[1, 0], want[1, 0], atol=ATOL, rtol=0)
    ids = np.array([[rows[0][8]], [rows[1][7]]])
    np.testing.assert_allclose(
        padded.forward(ids, np.array([[8], [7]])), plain.forward(ids, np.array([[8], [7]])), atol=ATOL, rtol=0
    )


def test_padding_with_no_free_slot_is_rejected(llama):
    pos = np.full((2, CTX + 0), -1)
    pos[0, :] = np.arange(CTX)
    pos[1, :3] = [0, CTX - 1, -1][:3]
    backend = OrtBackend(llama[1])
    with pytest.raises(BackendError, match="no cache slot is free"):
        backend.forward(np.zeros((2, CTX), np.int64), pos)


def test_external_data_for_big_models(llama, tmp_path, monkeypatch):
    import accel.backends.export as export_module

    model, small = llama
    monkeypatch.setattr(export_module, "_EXTERNAL_DATA_BYTES", 0)  # treat the tiny model as "over 2 GB"
    path = export_onnx(model, tmp_path / "big.onnx", ctx_len=CTX, batch_size=2, progress=False)
    assert (tmp_path / "big.onnx.data").stat().st_size > path.stat().st_size
    ids = np.tile(np.arange(5), (2, 1))
    np.testing.assert_array_equal(OrtBackend(path).forward(ids, ids), OrtBackend(small).forward(ids, ids))


def test_chunked_prefill_equals_one_call(llama):
    from accel.backends import prefill

    _, path = llama
    rows = make_tokens(96, (10, 10), seed=13)
    ids = np.stack([r[:10] for r in rows])
    pos = np.tile(np.arange(10), (2, 1))
    pos[0, :3] = -1  # left padding
    whole = OrtBackend(path).forward(ids, pos)[:, -1]
    chunked = prefill(OrtBackend(path, max_seq_len=4), ids, pos)
    np.testing.assert_allclose(chunked, whole, atol=ATOL, rtol=0)


def test_export_refuses_ctx_beyond_sliding_window(tmp_path):
    cfg = ModelConfig.from_hf(
        {
            "model_type": "mistral",
            "vocab_size": 32,
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "sliding_window": 8,
        }
    )
    with pytest.raises(BackendError, match="sliding_window 8"):
        export_onnx(Decoder(cfg), tmp_path / "m.onnx", ctx_len=16, progress=False)
    assert export_onnx(Decoder(cfg), tmp_path / "m.onnx", ctx_len=8, progress=False).is_file()


def test_export_cached_reuses_the_file(tmp_path):
    """Second call: same file, not rewritten; another ctx_len or a changed checkpoint: a new export."""
    import os

    from accel.backends import export_cached
    from accel.models import save_pretrained

    src = save_pretrained(_tiny_llama(), tmp_path / "ckpt")
    lines: list[str] = []
    first = export_cached(src, tmp_path / "onnx", ctx_len=32, say=lines.append)
    stamp = first.stat().st_mtime_ns
    again = export_cached(src, tmp_path / "onnx", ctx_len=32, say=lines.append)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert "exporting" in lines[0] and "exported" in lines[1] and "cached" in lines[-1]
    assert export_cached(src, tmp_path / "onnx", ctx_len=64) != first
    os.utime(src / "model.safetensors", ns=(stamp + 10**9, stamp + 10**9))  # a rewritten checkpoint
    assert export_cached(src, tmp_path / "onnx", ctx_len=32) != first
    OrtBackend(first)  # a valid model file
    with pytest.raises(BackendError, match=r"neither a checkpoint directory nor a \.gguf file"):
        export_cached(tmp_path / "nowhere", tmp_path / "onnx", ctx_len=32)


def test_onnxruntime_fuses_rms_norm(tmp_path):
    """Every RMSNorm is written in the pattern onnxruntime fuses into one SimplifiedLayerNormalization kernel (a
    draft model's call is dominated by per-node overhead; the unfused form cost ~6 nodes per norm)."""
    import onnxruntime as ort

    model = _tiny_llama()
    path = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, progress=False)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    norms = 2 * model.config.num_layers + 1
    assert ops.count("SimplifiedLayerNormalization") == norms
    assert "ReduceMean" not in ops and "Sqrt" not in ops

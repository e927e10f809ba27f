"""Pipeline stages (layer ranges): chained stages == the whole model (torch and onnxruntime, 1e-5), exit logits,
graph interface and metadata, and bad input.

Chained torch stages run the same ops as the whole torch model, so they agree bit for bit; stage graphs and the
whole graph are different onnxruntime sessions (fusions at the cut may differ), compared at ``atol=1e-5`` on O(1)
logits, which still catches a wrong cache slot, a missing layer or a norm applied at the cut (O(0.1)).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from accel.backends import OrtBackend, TorchBackend, export_onnx
from accel.backends.stages import Pipeline, StageSpec, split_layers
from accel.drafts.early_exit import ExitHead
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig, load_checkpoint
from tests.helpers.scenario import make_tokens, run_scenario, tiny_hf_model

PROMPTS = (4, 6)
CTX = 32
ATOL = 1e-5


def _model(layers: int = 4) -> Decoder:
    cfg = ModelConfig(
        vocab_size=96, hidden_size=64, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=80
    )
    return Decoder(cfg).init_weights(3, std=0.1).eval()


def _export_stages(model, specs, tmp, exit_head=None, batch_size=2):
    return [
        OrtBackend(
            export_onnx(
                model,
                tmp / f"stage{s.start}-{s.stop}.onnx",
                ctx_len=CTX,
                batch_size=batch_size,
                progress=False,
                stage=s,
                exit_head=exit_head if s.exit_logits else None,
            ),
            threads=1,
        )
        for s in specs
    ]


@pytest.mark.parametrize("cuts", [(2,), (1, 3), (1, 2, 3)])
def test_torch_stages_chained_equal_the_whole_model(cuts):
    model = _model()
    rows = make_tokens(96, PROMPTS, seed=2)
    whole = run_scenario(TorchBackend(model, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    stages = [TorchBackend(model, ctx_len=CTX, batch_size=2, stage=s) for s in split_layers(4, cuts)]
    chained = run_scenario(Pipeline(stages), rows, PROMPTS)
    for a, b in zip(chained, whole, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cuts", [(2,), (1, 3)])
def test_ort_stage_graphs_chained_equal_the_whole_graph(cuts, tmp_path):
    model = _model()
    rows = make_tokens(96, PROMPTS, seed=4)
    whole_path = export_onnx(model, tmp_path / "whole.onnx", ctx_len=CTX, batch_size=2, progress=False)
    whole = run_scenario(OrtBackend(whole_path, threads=1), rows, PROMPTS)
    chained = run_scenario(Pipeline(_export_stages(model, split_layers(4, cuts), tmp_path)), rows, PROMPTS)
    torch_chained = run_scenario(
        Pipeline([TorchBackend(model, ctx_len=CTX, batch_size=2, stage=s) for s in split_layers(4, cuts)]),
        rows,
        PROMPTS,
    )
    for a, b, t in zip(chained, whole, torch_chained, strict=True):
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
        np.testing.assert_allclose(a, t, atol=ATOL, rtol=0)


def test_gpt2_family_stages(tmp_path):
    """Learned positions (added at embedding only), LayerNorm, plain MLP with biases."""
    model = load_checkpoint(tiny_hf_model("gpt2")).eval()
    rows = make_tokens(model.config.vocab_size, PROMPTS, seed=5)
    specs = split_layers(model.config.num_layers, [1])
    whole = run_scenario(TorchBackend(model, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    chained = run_scenario(Pipeline(_export_stages(model, specs, tmp_path)), rows, PROMPTS)
    for a, b in zip(chained, whole, strict=True):
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("width", [0, 16])
def test_exit_logits_torch_and_ort(width, tmp_path):
    """An exit stage [0, d) returns the exit head's logits of its output: the target's norm + head when width = 0
    (checked against the hidden states), the trained adapter's otherwise; ORT equals torch."""
    model = _model()
    head = ExitHead(model, 2, width)
    if width:  # a non-trivial adapter (the initial down projection is zero)
        with torch.no_grad():
            head.mlp.down_proj.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
            head.norm.weight.mul_(1.5)
    spec = StageSpec(0, 2, 4, exit_logits=True)
    ids = np.array([[5, 9, 2, 7], [1, 3, 3, 8]])
    pos = np.broadcast_to(np.arange(4), ids.shape)
    t_out = TorchBackend(model, ctx_len=CTX, batch_size=2, stage=spec, exit_head=head).forward_stage(pos, input_ids=ids)
    (o_stage,) = _export_stages(model, [spec], tmp_path, exit_head=head)
    o_out = o_stage.forward_stage(pos, input_ids=ids, num_logits=2)
    with torch.no_grad():
        direct = head(torch.from_numpy(t_out.hidden)).numpy()
        lens = model.logits(model.norm(torch.from_numpy(t_out.hidden))).numpy()
    np.testing.assert_array_equal(t_out.logits, direct)
    if not width:
        np.testing.assert_allclose(direct, lens, atol=1e-6, rtol=0)
    else:
        assert np.abs(direct - lens).max() > 0.1  # the adapter changes the logits
    np.testing.assert_allclose(o_out.hidden, t_out.hidden, atol=ATOL, rtol=0)
    np.testing.assert_allclose(o_out.logits, t_out.logits[:, -2:], atol=ATOL, rtol=0)


def test_stage_graph_interface_and_metadata(tmp_path):
    model = _model()
    paths = [
        export_onnx(model, tmp_path / f"{s.start}.onnx", ctx_len=CTX, batch_size=2, progress=False, stage=s)
        for s in split_layers(4, [1, 3], exit_logits=True)
    ]
    protos = [onnx.load(str(p)) for p in paths]
    names = [([i.name for i in p.graph.input][:2], [o.name for o in p.graph.output][:2]) for p in protos]
    assert names[0] == (["input_ids", "position_ids"], ["logits", "hidden_out"])
    assert names[1] == (["hidden_in", "position_ids"], ["logits", "hidden_out"])
    assert names[2] == (["hidden_in", "position_ids"], ["logits", "past_key.0_RetainedState"])
    caches = [sorted(i.name for i in p.graph.input if i.name.startswith("past_key")) for p in protos]
    assert caches == [["past_key.0"], ["past_key.0", "past_key.1"], ["past_key.0"]]
    meta = [{m.key: m.value for m in p.metadata_props} for p in protos]
    assert [m["accel.layers"] for m in meta] == ["0,1,4", "1,3,4", "3,4,4"]
    assert [m["accel.exit_logits"] for m in meta] == ["1", "1", "0"]
    backends = [OrtBackend(p) for p in paths]
    assert [b.stage for b in backends] == split_layers(4, [1, 3], exit_logits=True)
    assert [b.info.num_layers for b in backends] == [1, 2, 1]
    assert all(b.info.hidden_size == 64 for b in backends)
    whole = onnx.load(str(export_onnx(model, tmp_path / "w.onnx", ctx_len=CTX, batch_size=2, progress=False)))
    assert "accel.layers" not in {m.key for m in whole.metadata_props}
    assert [i.name for i in whole.graph.input][:2] == ["input_ids", "position_ids"]


def test_stage_errors(tmp_path):
    model = _model()
    with pytest.raises(BackendError, match="start < stop"):
        StageSpec(2, 2, 4)
    with pytest.raises(BackendError, match="exit_logits"):
        StageSpec(2, 4, 4, exit_logits=True)
    with pytest.raises(BackendError, match="increase strictly"):
        split_layers(4, [2, 2])
    first, last = (TorchBackend(model, ctx_len=CTX, batch_size=1, stage=s) for s in split_layers(4, [2]))
    with pytest.raises(BackendError, match="contiguous"):
        Pipeline([first, TorchBackend(model, ctx_len=CTX, batch_size=1, stage=StageSpec(1, 4, 4))])
    with pytest.raises(BackendError, match="start at layer 0"):
        Pipeline([last])
    with pytest.raises(BackendError, match="forward_stage"):
        first.forward(np.array([[1]]), np.array([[0]]))
    with pytest.raises(BackendError, match="hidden_in"):
        last.forward_stage(np.array([[0]]), input_ids=np.array([[1]]))
    with pytest.raises(BackendError, match="shape"):
        last.forward_stage(np.array([[0]]), hidden_in=np.zeros((1, 2, 64), np.float32))
    with pytest.raises(BackendError, match="finite"):
        last.forward_stage(np.array([[0]]), hidden_in=np.full((1, 1, 64), np.nan, np.float32))
    (ort_first,) = _export_stages(model, split_layers(4, [2])[:1], tmp_path, batch_size=1)
    with pytest.raises(BackendError, match="forward_stage"):
        ort_first.forward(np.array([[1]]), np.array([[0]]))
    with pytest.raises(BackendError, match="input_ids"):
        ort_first.forward_stage(np.array([[0]]), hidden_in=np.zeros((1, 1, 64), np.float32))
    with pytest.raises(BackendError, match="exit_head"):
        export_onnx(model, tmp_path / "x.onnx", ctx_len=CTX, stage=StageSpec(0, 2, 4), exit_head=ExitHead(model, 2))


def test_reset_zeroes_what_a_stage_call_wrote(tmp_path):
    """A stage's cache is written at its calls' positions; reset (which zeroes only up to the highest slot written)
    leaves all of it zero."""
    first = _export_stages(_model(), split_layers(4, [2]), tmp_path)[0]
    ids = np.tile(np.arange(1, 8), (2, 1))
    first.forward_stage(np.tile(np.arange(20, 27), (2, 1)), input_ids=ids)
    assert np.any(np.stack(first.cache())[:, :, :, 26]) and not np.any(np.stack(first.cache())[:, :, :, 27:])
    first.reset()
    assert not np.any(np.stack(first.cache()))

"""Streaming export: external data equals the in-memory export bit for bit, checkpoint paths export without a torch
model, int8 weights equal onnxruntime's quantize_dynamic, and peak memory stays near one tensor (in a subprocess)."""

from __future__ import annotations

import json
import logging
import shutil
import stat
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.backends.export import onnx_file_bytes
from accel.errors import CpuWarning
from accel.models import Decoder, ModelConfig, load_checkpoint
from accel.models.random_checkpoint import write_random_checkpoint

CTX = 32
FORMATS = ("fp32", "fp16", "mx-rounded", "mx-packed", "int8", "mxint8-nbits")


def _config(tied: bool = True, **kw) -> ModelConfig:
    return ModelConfig(
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        tie_word_embeddings=tied,
        **kw,
    )


def _initializers(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def _same_model(a, b) -> None:
    """Same graph (nodes, inputs, outputs), same initializer values bit for bit, same logits bit for bit."""
    pa, pb = onnx.load(str(a), load_external_data=False), onnx.load(str(b), load_external_data=False)
    assert [(n.op_type, list(n.input), list(n.output)) for n in pa.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in pb.graph.node
    ]
    ia, ib = _initializers(a), _initializers(b)
    assert ia.keys() == ib.keys()
    for name in ia:
        assert ia[name].dtype == ib[name].dtype and ia[name].tobytes() == ib[name].tobytes(), name
    ids = np.array([[3, 1, 4, 1, 5, 9]])
    pos = np.arange(6)[None]
    np.testing.assert_array_equal(OrtBackend(a).forward(ids, pos), OrtBackend(b).forward(ids, pos))


@pytest.mark.parametrize("weights", FORMATS)
def test_external_data_equals_in_memory_export(weights, tmp_path):
    model = Decoder(_config(tied=weights != "fp16")).init_weights(1, std=0.1)
    inline = export_onnx(model, tmp_path / "a.onnx", ctx_len=CTX, weights=weights, progress=False)
    external = export_onnx(model, tmp_path / "b.onnx", ctx_len=CTX, weights=weights, progress=False, external_data=True)
    assert not (tmp_path / "a.onnx.data").exists()
    data = tmp_path / "b.onnx.data"
    proto = onnx.load(str(external), load_external_data=False)
    assert max(len(t.raw_data) for t in proto.graph.initializer) < 1024  # every weight is out of the protobuf
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer) >= 10
    assert onnx_file_bytes(external) == external.stat().st_size + data.stat().st_size
    for f in (inline, external, data):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx", "b.onnx.data"]  # no temporaries left
    _same_model(inline, external)


@pytest.mark.parametrize("weights", ("fp32", "mx-packed", "int8", "mxint8-nbits", "mxfp4-nbits"))
@pytest.mark.parametrize("kind", ("safetensors", "gguf"))
def test_checkpoint_path_export_equals_loaded_model_export(kind, weights, tmp_path):
    cfg = _config(tied=kind == "gguf")
    src = write_random_checkpoint(cfg, tmp_path / ("m.gguf" if kind == "gguf" else "ckpt"), kind=kind, std=0.1)
    streamed = export_onnx(src, tmp_path / "s.onnx", ctx_len=CTX, weights=weights, progress=False, external_data=True)
    loaded = export_onnx(load_checkpoint(src), tmp_path / "l.onnx", ctx_len=CTX, weights=weights, progress=False)
    _same_model(streamed, loaded)


def test_qwen2_and_gpt2_directories_stream(tmp_path):
    from tests.helpers.scenario import tiny_hf_model

    for family in ("qwen2", "gpt2"):
        hf = tiny_hf_model(family)
        d = tmp_path / family
        hf.save_pretrained(d)
        streamed = export_onnx(d, tmp_path / f"{family}-s.onnx", ctx_len=CTX, progress=False, external_data=True)
        loaded = export_onnx(load_checkpoint(d), tmp_path / f"{family}-l.onnx", ctx_len=CTX, progress=False)
        _same_model(streamed, loaded)


def test_int8_weights_equal_onnxruntime_quantize_dynamic(tmp_path):
    """The int8 graph accel writes itself equals quantize_dynamic on the float graph: initializers and logits
    (``u8s8``, the tool's own storage); the default ``u8u8`` graph equals the tool's graph with its int8 weights
    stored as uint8 + 128 (``to_u8u8``), bit for bit."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from accel.backends.onnx_int8 import to_u8u8

    model = Decoder(_config(tied=False)).init_weights(2, std=0.1)
    u8s8 = ExportWeights("int8", int8_scheme="u8s8")
    ours = export_onnx(model, tmp_path / "int8.onnx", ctx_len=CTX, weights=u8s8, progress=False)
    default = export_onnx(model, tmp_path / "u8u8.onnx", ctx_len=CTX, weights="int8", progress=False)
    fp32 = export_onnx(model, tmp_path / "fp32.onnx", ctx_len=CTX, progress=False, ort_ops=True)
    proto = onnx.load(str(fp32))
    inits = {t.name for t in proto.graph.initializer}
    keep = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] not in inits]
    ref = tmp_path / "ref.onnx"
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(
            fp32, ref, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
            nodes_to_exclude=keep, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    mine, theirs = _initializers(ours), _initializers(ref)
    quantized = [n for n in mine if n.endswith(("_quantized", "_scale", "_zero_point"))]
    assert len(quantized) == 3 * (5 * 2 + 1)  # qkv, o, gate, up, down per layer; the head
    for name in quantized:
        assert mine[name].dtype == theirs[name].dtype and mine[name].tobytes() == theirs[name].tobytes(), name
    ops = lambda p: sorted(n.op_type for n in onnx.load(str(p)).graph.node)  # noqa: E731
    assert ops(ours) == ops(ref)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    pos = np.arange(8)[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuWarning)  # u8s8 on a CPU without VNNI: both graphs alike
        np.testing.assert_array_equal(OrtBackend(ours).forward(ids, pos), OrtBackend(ref).forward(ids, pos))
    shifted = tmp_path / "ref_u8u8.onnx"
    onnx.save(to_u8u8(onnx.load(str(ref))), shifted)
    mine, theirs = _initializers(default), _initializers(shifted)
    for name in quantized:
        assert mine[name].dtype == theirs[name].dtype and mine[name].tobytes() == theirs[name].tobytes(), name
    np.testing.assert_array_equal(OrtBackend(default).forward(ids, pos), OrtBackend(shifted).forward(ids, pos))


def test_int8_has_no_size_limit_and_keeps_fc_float(tmp_path, monkeypatch):
    import accel.backends.export as export_module

    monkeypatch.setattr(export_module, "_EXTERNAL_DATA_BYTES", 0)  # as a model over the old 1.8 GB limit
    model = Decoder(_config()).init_weights(3, std=0.1)
    path = export_onnx(model, tmp_path / "d.onnx", ctx_len=CTX, weights=ExportWeights("int8"), progress=False)
    assert (tmp_path / "d.onnx.data").is_file()
    ops = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops


# VmHWM, not ru_maxrss: after fork + exec, ru_maxrss still counts the parent's resident memory at the fork
_CHILD = """
import json, sys
from accel.backends.export import export_onnx, onnx_file_bytes
import accel.models.sources  # the baseline includes what an export imports (no torch, no onnxruntime)
kib = lambda key: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) * 1024
base = kib("VmRSS")
path = export_onnx(sys.argv[1], sys.argv[2], ctx_len=64, weights=sys.argv[3], progress=False)
print(json.dumps({"base": base, "peak": kib("VmHWM"), "out": onnx_file_bytes(path)}))
"""


def test_export_peak_memory_is_about_one_tensor(tmp_path):
    """A ~270 MB (BF16) random checkpoint exported to a ~530 MB float32 ONNX: the exporter's resident memory grows by
    well under half the output (about two copies of the largest tensor; a full copy of the weights would be 1x, the
    old exporter held about three), and the whole process stays under 1.5x the output bytes."""
    cfg = ModelConfig.from_hf(
        dict(
            model_type="llama", hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
            intermediate_size=2816, vocab_size=16000, tie_word_embeddings=False,
        )
    )  # fmt: skip
    try:
        src = write_random_checkpoint(cfg, tmp_path / "ckpt")
        run = subprocess.run(
            [sys.executable, "-c", _CHILD, str(src), str(tmp_path / "m.onnx"), "fp32"],
            capture_output=True,
            text=True,
            check=True,
            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        )
        r = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # ~1 GB of files: do not leave them to pytest's retention
    assert r["out"] > 450e6
    assert r["peak"] - r["base"] < 0.5 * r["out"], r
    assert r["peak"] < 1.5 * r["out"], r


@pytest.mark.parametrize(
    "kw",
    (
        dict(tied=True),
        dict(tied=False, qkv_bias=True),
        dict(
            tied=False,
            mlp="plain",
            positions="learned",
            activation="gelu_tanh",
            norm="layer",
            max_position_embeddings=64,
        ),
        dict(tied=False, feature_size=48, embed_size=32),
        dict(tied=False, head_vocab=40),
    ),
)
def test_layout_from_config_equals_decoder_layout(kw):
    """A checkpoint path is exported from a layout derived from its config alone (no torch model): it must name the
    same Linear weights, and so pick the same MX / int8 / nbits weights, as the Decoder it stands for."""
    import torch

    from accel.backends.export_tensors import ExportLayout

    cfg = _config(**kw)
    with torch.device("meta"):
        model = Decoder(cfg)
    from_model, from_config = ExportLayout.of_model(model), ExportLayout.of_config(cfg)
    assert from_config.linear == from_model.linear
    assert from_config.linear_weights() == from_model.linear_weights()
    assert from_config.default_mx_weights() == from_model.default_mx_weights()
    assert ("fc.weight" in from_config.linear) == bool(cfg.feature_size)


def test_checkpoint_export_needs_no_torch(tmp_path):
    """``accel export`` of a checkpoint directory and of a GGUF file, every weight family, with torch blocked: the
    streaming export reads the files itself and imports neither torch nor onnxruntime (a smaller resident baseline)."""
    from tests.test_core_without_torch import BLOCK_TORCH

    cfg = _config(tied=True)
    sources = [
        write_random_checkpoint(cfg, tmp_path / "ckpt", kind="safetensors", std=0.1),
        write_random_checkpoint(cfg, tmp_path / "m.gguf", kind="gguf", std=0.1),
    ]
    code = BLOCK_TORCH + (
        "from accel.cli import main\n"
        "for src in sys.argv[1:3]:\n"
        "    for w in ('fp32', 'int8', 'mx-packed', 'mxint8-nbits'):\n"
        "        assert main(['export', src, '-o', sys.argv[3], '--weights', w, '--ctx-len', '32', '--quiet']) == 0\n"
        "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules, 'imported'\n"
        "print('ok')\n"
    )
    out = tmp_path / "e.onnx"
    run = subprocess.run([sys.executable, "-c", code, *map(str, sources), str(out)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]
    streamed = export_onnx(sources[1], tmp_path / "s.onnx", ctx_len=32, weights="mxint8-nbits", progress=False)
    _same_model(out, streamed)  # the last export of the torch-free run equals one made with torch imported

"""Quark OCP-MX and compressed-tensors MX checkpoints written and read by accel alone: every code and scale survives
bit for bit, the layouts have the documented tensor names, dtypes and shapes, and bad inputs raise FormatError."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from accel.errors import FormatError
from accel.formats import MXTensor, compress_checkpoint, get_format, load_tensors, pack_codes, quantize
from accel.serving import export_mx_checkpoint, load_mx_checkpoint, read_mx_checkpoint
from accel.serving.mx_layouts import from_stored, get_layout, parse_quantization_config, to_stored
from accel.serving.safetensors_plain import PlainFile
from tests.serving.helpers import PAIRS, logits, saved, tiny_llama

Q_PROJ = "model.layers.0.self_attn.q_proj"


def every_code_tensor(fmt_name: str, rows: int = 8) -> MXTensor:
    """An MXTensor holding every element code of ``fmt_name`` in every row, with scales spanning E8M0 codes 0..254."""
    fmt = get_format(fmt_name)
    n = 1 << fmt.bits
    cols = max(n, 64)
    codes = np.tile((np.arange(cols) % n).astype(np.uint8), (rows, 1))
    rng = np.random.default_rng(0)
    for r in range(rows):
        rng.shuffle(codes[r])
    scales = np.linspace(0, 254, rows * cols // 32).astype(np.uint8).reshape(rows, cols // 32)

    return MXTensor(fmt, (rows, cols), 1, 32, pack_codes(codes.reshape(-1), fmt.bits), scales)


@pytest.mark.parametrize(("layout", "fmt"), PAIRS)
def test_every_code_and_scale_round_trips_through_the_layout(layout, fmt):
    lay = get_layout(layout, fmt)
    mx = every_code_tensor(fmt)
    codes, scales = to_stored(mx, lay, "w")
    assert codes.shape == (mx.shape[0], mx.shape[1] * get_format(fmt).bits // 8) and scales.shape == (
        8,
        mx.shape[1] // 32,
    )
    back = from_stored(codes, scales, lay, "w")
    assert back == mx
    np.testing.assert_array_equal(back.dequantize(np.float64), mx.dequantize(np.float64))


@pytest.mark.parametrize(("layout", "fmt"), PAIRS)
def test_export_writes_the_documented_tensors_and_reads_back_bit_exactly(tmp_path, layout, fmt):
    model = tiny_llama()
    src = saved(model, tmp_path / "src")
    summary = export_mx_checkpoint(src, tmp_path / "out", fmt, layout)
    lay = get_layout(layout, fmt)
    f = PlainFile(tmp_path / "out" / "model.safetensors")
    codes_dtype, codes_shape = f.entries[lay.codes_name(Q_PROJ)]
    assert codes_dtype == ("F8_E4M3" if fmt == "mxfp8_e4m3" else "U8")
    assert codes_shape == (64, 64 * get_format(fmt).bits // 8)
    assert f.entries[f"{Q_PROJ}.weight_scale"] == ("U8", (64, 2))
    assert summary.excluded == ["lm_head"] and len(summary.quantized) == 14 and not summary.copied_mx
    config, tensors = read_mx_checkpoint(tmp_path / "out")
    assert config["quantization_config"]["quant_method"] == layout
    for name, p in model.named_parameters():
        hf = name if name == "lm_head.weight" else f"model.{name}"
        w = p.detach().numpy()
        if hf.endswith("proj.weight"):
            assert tensors[hf] == quantize(w, fmt, axis=1, block_size=32), hf
        elif hf in tensors:
            np.testing.assert_array_equal(tensors[hf], w)
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    ours = load_mx_checkpoint(tmp_path / "out")
    ref = tiny_llama()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(torch.from_numpy(quantize(p.numpy(), fmt, axis=1, block_size=32).dequantize()))
    torch.testing.assert_close(logits(ours, tokens), logits(ref, tokens), atol=0, rtol=0)


def test_accel_compressed_weights_are_copied_without_re_encoding(tmp_path):
    src = saved(tiny_llama(tied=False), tmp_path / "src")
    compress_checkpoint(src, tmp_path / "mx", "mxfp4", progress=False)
    summary = export_mx_checkpoint(tmp_path / "mx", tmp_path / "out", "mxfp4", "quark")
    assert len(summary.copied_mx) == 14 and summary.excluded == ["lm_head"]
    _, tensors = read_mx_checkpoint(tmp_path / "out")
    stored = load_tensors(tmp_path / "mx" / "model.safetensors")
    for name in summary.copied_mx:
        assert tensors[f"{name}.weight"] == stored[f"{name}.weight"], name
    np.testing.assert_array_equal(tensors["lm_head.weight"], stored["lm_head.weight"])
    with pytest.raises(FormatError, match="mxfp4_e2m1"):
        export_mx_checkpoint(tmp_path / "mx", tmp_path / "out6", "mxfp6", "quark")
    assert not (tmp_path / "out6").exists() and not list(tmp_path.glob(".out6.*"))


def test_decoder_source_bf16_and_unaligned_layers(tmp_path):
    model = tiny_llama(hidden=64, intermediate=80)  # down_proj has in_features 80: stays float, listed in exclude
    summary = export_mx_checkpoint(model, tmp_path / "out", "mxfp6", "compressed-tensors")
    assert summary.excluded == ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    config, tensors = read_mx_checkpoint(tmp_path / "out")
    assert config["quantization_config"]["ignore"] == summary.excluded
    np.testing.assert_array_equal(
        tensors["model.layers.1.mlp.down_proj.weight"], model.layers[1].mlp.down_proj.weight.detach().numpy()
    )
    bf16 = tiny_llama().to(torch.bfloat16)
    export_mx_checkpoint(saved(bf16, tmp_path / "bf16"), tmp_path / "bf16-out", "mxfp4", "quark")
    _, tensors = read_mx_checkpoint(tmp_path / "bf16-out")
    w = bf16.layers[0].self_attn.q_proj.weight.detach().float().numpy()
    assert tensors[f"{Q_PROJ}.weight"] == quantize(w, "mxfp4", axis=1, block_size=32)


def test_unsupported_formats_and_sources_are_refused(tmp_path):
    with pytest.raises(FormatError, match=r"quark.*no mxfp8_e4m3.*mxfp4_e2m1, mxfp6_e2m3, mxfp6_e3m2"):
        get_layout("quark", "mxfp8")
    with pytest.raises(FormatError, match="no mxfp6_e3m2"):
        get_layout("compressed-tensors", "mxfp6_e3m2")
    with pytest.raises(FormatError, match="unknown serving layout 'gguf'"):
        get_layout("gguf", "mxfp4")
    model = tiny_llama()
    with torch.no_grad():
        model.layers[0].mlp.up_proj.weight[3, 5] = float("nan")
    with pytest.raises(FormatError, match=r"up_proj.weight.*NaN"):
        export_mx_checkpoint(model, tmp_path / "nan", "mxfp4", "quark")
    assert not (tmp_path / "nan").exists() and not list(tmp_path.glob(".nan.*"))
    nan_mx = quantize(np.full((2, 32), np.nan, np.float32), "mxfp4", axis=1)
    with pytest.raises(FormatError, match="NaN blocks"):
        to_stored(nan_mx, get_layout("quark", "mxfp4"), "w")
    with pytest.raises(FormatError, match="blocked along in"):
        to_stored(quantize(np.ones((4, 64), np.float32), "mxfp4", axis=0), get_layout("quark", "mxfp4"), "w")


def test_bad_files_and_configs_raise_format_error(tmp_path):
    out = tmp_path / "out"
    export_mx_checkpoint(tiny_llama(), out, "mxfp6", "quark")
    lay = get_layout("quark", "mxfp6")
    codes = np.zeros((4, 48), np.uint8)
    with pytest.raises(FormatError, match="scales are"):
        from_stored(codes, np.zeros((4, 3), np.uint8), lay, "w")
    with pytest.raises(FormatError, match="0xFF"):
        from_stored(codes, np.full((4, 2), 255, np.uint8), lay, "w")
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    for path, value, match in [
        (("global_quant_config", "weight", "group_size"), 16, "group_size=16"),
        (("global_quant_config", "weight", "scale_format"), "fp8", "scale_format='fp8'"),
        (("global_quant_config", "weight", "dtype"), "fp8_e4m3", "dtype='fp8_e4m3'"),
        (("layer_quant_config",), {"*q_proj": {}}, "layer_quant_config is not empty"),
        (("quant_method",), "awq", "quant_method 'awq'"),
    ]:
        bad = json.loads(json.dumps(qc))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(FormatError, match=match):
            parse_quantization_config(bad, "config.json")
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    weights.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(FormatError, match=r"does not fit|truncated"):
        read_mx_checkpoint(out)
    with pytest.raises(FormatError, match="not empty"):
        export_mx_checkpoint(tiny_llama(), out, "mxfp6", "quark")
    export_mx_checkpoint(tiny_llama(), out, "mxfp4", "quark", overwrite=True)
    assert read_mx_checkpoint(out)[0]["quantization_config"]["global_quant_config"]["weight"]["dtype"] == "fp4"


@pytest.mark.parametrize("layout", ["quark", "compressed-tensors"])
def test_compress_cli_writes_the_serving_layouts(tmp_path, capsys, layout):
    """``accel compress SRC -o OUT --to LAYOUT`` writes what ``export_mx_checkpoint`` writes (read back, code for
    code), and refuses the options of accel's own layout instead of ignoring them."""
    from accel.cli import EXIT_ERROR, main

    src = saved(tiny_llama(), tmp_path / "src")
    out = tmp_path / "cli"
    assert main(["compress", str(src), "-o", str(out), "--to", layout, "--fmt", "mxfp4", "--quiet"]) == 0
    assert f"{layout} mxfp4" in capsys.readouterr().out
    export_mx_checkpoint(src, tmp_path / "api", fmt="mxfp4", layout=layout)
    cfg_cli, tensors_cli = read_mx_checkpoint(out)
    cfg_api, tensors_api = read_mx_checkpoint(tmp_path / "api")
    assert cfg_cli == cfg_api and tensors_cli.keys() == tensors_api.keys()
    for name, value in tensors_cli.items():
        other = tensors_api[name]
        if isinstance(value, MXTensor):
            assert np.array_equal(value.codes, other.codes) and np.array_equal(value.scales, other.scales), name
        else:
            assert np.array_equal(value, other), name
    for flags in (["--block-size", "16"], ["--exclude", "*mlp*"], ["--nonfinite", "keep"]):
        argv = ["compress", str(src), "-o", str(tmp_path / "no"), "--to", layout, *flags]
        assert main(argv) == EXIT_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flags[0]} would be ignored by --to {layout}" in err, err
        assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("layout", ["quark", "compressed-tensors"])
def test_engine_checkpoints_are_named_by_load_checkpoint_and_decoded_by_generate(tmp_path, capsys, layout):
    """``load_checkpoint`` (and an onnxruntime export) names an engine MX checkpoint and the loader that reads it,
    instead of a list of unexpected tensors; ``accel generate --backend torch`` decodes it, token for token as
    ``load_mx_checkpoint`` + greedy AR."""
    from accel.backends import TorchBackend
    from accel.cli import EXIT_ERROR, main
    from accel.errors import ModelError
    from accel.models import load_checkpoint
    from accel.spd import Sampling, generate_ar

    src = saved(tiny_llama(), tmp_path / "src")
    out = tmp_path / layout
    export_mx_checkpoint(src, out, fmt="mxfp4", layout=layout)
    with pytest.raises(ModelError, match=rf"{layout} MX checkpoint .*load_mx_checkpoint"):
        load_checkpoint(out)
    prompt = [5, 17, 2, 9]
    argv = ["generate", "--target", str(out), "--prompt", " ".join(map(str, prompt)), "--greedy"]
    argv += ["--max-new-tokens", "6", "--ctx-len", "32", "--json"]
    assert main([*argv, "--backend", "torch"]) == 0
    got = json.loads(capsys.readouterr().out)["tokens"][0]
    backend = TorchBackend(load_mx_checkpoint(out), ctx_len=32)
    want = generate_ar(backend, [prompt], max_new_tokens=6, sampling=Sampling(greedy=True)).tokens[0]
    assert got == want and len(got) == 6
    assert main([*argv, "--backend", "ort"]) == EXIT_ERROR
    assert "load_mx_checkpoint" in capsys.readouterr().err

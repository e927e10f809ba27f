"""Packed MX weights in the torch backend (``accel.backends.torch_mx``): a compressed checkpoint decodes with its packed
bytes through the fused kernel (and through the numpy fallback), greedy SpD equals greedy AR on it, and its logits
match the float32 model of the same (decoded) weights."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.backends import TorchBackend  # noqa: E402
from accel.backends.torch_mx import PackedLinear, checkpoint_mx_formats, pack_compressed, pack_decoder  # noqa: E402
from accel.cli import main  # noqa: E402
from accel.errors import BackendError, FormatError  # noqa: E402
from accel.formats import compress_checkpoint  # noqa: E402
from accel.formats.mxkernel_build import kernel_status, reset  # noqa: E402
from accel.models import Decoder, ModelConfig, load_checkpoint, save_pretrained  # noqa: E402
from accel.spd import GREEDY, DraftChain, generate, generate_ar  # noqa: E402

# hidden 48 and intermediate 80: in_features that are not multiples of the block (32)
CONFIG = ModelConfig(vocab_size=40, hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=80)
PROMPTS = [[5, 17, 2, 9]]


@pytest.fixture(params=["kernel", "numpy"])
def path(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setenv("ACCEL_MXKERNEL", "numpy")
    else:
        monkeypatch.delenv("ACCEL_MXKERNEL", raising=False)
    reset()
    yield request.param
    monkeypatch.undo()
    reset()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    target = Decoder(CONFIG).init_weights(3, 0.5)
    draft = Decoder(CONFIG).init_weights(3, 0.5)
    with torch.no_grad():
        for p in draft.parameters():
            if p.ndim > 1:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.02 * p.std())
    save_pretrained(target, d / "target")
    save_pretrained(draft, d / "draft")
    out = {"float": d / "target", "draft": d / "draft"}
    for fmt in ("mxfp6", "mxfp4"):
        compress_checkpoint(d / "target", d / fmt, fmt, progress=False)
        out[fmt] = d / fmt
    return out


@pytest.mark.parametrize("fmt", ["mxfp6", "mxfp4"])
def test_packed_model_matches_float_model_of_the_same_weights(checkpoints, fmt, path, capsys):
    reference = load_checkpoint(checkpoints[fmt])  # MX weights decoded to float32 (exact)
    packed = load_checkpoint(checkpoints[fmt])
    assert checkpoint_mx_formats(checkpoints[fmt]) == [(f"{fmt}_e2m3" if fmt == "mxfp6" else "mxfp4_e2m1", 32)]
    report = pack_compressed(packed, checkpoints[fmt])
    line = capsys.readouterr().err
    assert report is not None and report.packed == 7 * CONFIG.num_layers and report.kept == 1  # tied lm_head
    assert "14 linear layers on packed MX weights" in line
    assert ("fused kernel" in line) == (path == "kernel" and kernel_status().available)
    assert packed.layers[0].mlp.down_proj.packed.kernel_path != "numpy" or path == "numpy"
    layer = packed.layers[0].mlp.down_proj
    assert isinstance(layer, PackedLinear) and layer.packed.uses_kernel == (path == "kernel")
    assert not any(n.endswith("down_proj.weight") for n, _ in packed.named_parameters())  # no float copy kept
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]])
    with torch.no_grad():
        ref = reference.causal_forward(ids)
        full = packed.causal_forward(ids)  # 20 rows: the decode + F.linear path
        short = packed.causal_forward(ids[:, :5])  # 5 rows: the fused kernel
    # float32 sums in another order: |error| well under 1e-4 of the logit scale here (measured ~1e-6)
    tol = 1e-4 * float(ref.abs().max())
    assert float((full - ref).abs().max()) <= tol and float((short - ref[:, :5]).abs().max()) <= tol


def test_greedy_spd_equals_ar_on_packed_target(checkpoints, path):
    model = load_checkpoint(checkpoints["mxfp6"])
    pack_compressed(model, checkpoints["mxfp6"], quiet=True)
    float_model = load_checkpoint(checkpoints["mxfp6"])
    draft = TorchBackend(load_checkpoint(checkpoints["draft"]), ctx_len=48)
    ar = generate_ar(TorchBackend(model, ctx_len=48), PROMPTS, max_new_tokens=16, sampling=GREEDY)
    spd = generate(TorchBackend(model, ctx_len=48), DraftChain(draft, k=4), PROMPTS, max_new_tokens=16, sampling=GREEDY)
    assert spd.tokens == ar.tokens and len(ar.tokens[0]) == 16
    assert spd.stats.accepted_drafts > 0
    # the same weights in float32: the same greedy tokens on this model (no near-ties among its logits)
    assert (
        generate_ar(TorchBackend(float_model, ctx_len=48), PROMPTS, max_new_tokens=16, sampling=GREEDY).tokens
        == ar.tokens
    )


def test_packed_layers_stay_on_the_cpu_in_float32(checkpoints):
    """Packed MX layers run the CPU kernel in float32: another dtype (or device) is refused by name; unpacked, the
    same checkpoint takes the dtype (its MX weights decoded once)."""
    from accel.errors import BackendError

    model = load_checkpoint(checkpoints["mxfp6"])
    pack_compressed(model, checkpoints["mxfp6"], quiet=True)
    with pytest.raises(BackendError, match="layers hold packed MX weights"):
        TorchBackend(model, ctx_len=16, dtype="bfloat16")
    assert TorchBackend(load_checkpoint(checkpoints["mxfp6"]), ctx_len=16, dtype="bfloat16").dtype == torch.bfloat16


def test_generate_cli_packs_a_compressed_target(checkpoints, capsys):
    common = [
        "--target",
        str(checkpoints["mxfp6"]),
        "--prompt",
        "5 17 2",
        "--max-new-tokens",
        "12",
        "--greedy",
        "--ctx-len",
        "32",
        "--threads",
        "1",
        "--backend",
        "torch",
        "--json",
    ]
    assert main(["generate", *common, "--draft", str(checkpoints["draft"]), "--k", "3"]) == 0
    out = capsys.readouterr()
    spd = json.loads(out.out)
    assert re.search(r"14 linear layers on packed MX weights .* 1 kept float", out.err)
    assert main(["generate", *common]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert spd["tokens"] == ar["tokens"] and spd["stats"]["mode"] == "spd"
    assert main(["generate", *common[:1], str(checkpoints["float"]), *common[2:]]) == 0
    assert "packed MX" not in capsys.readouterr().err  # a plain checkpoint stays float


def test_pack_errors(checkpoints):
    model = load_checkpoint(checkpoints["float"])
    report = pack_decoder(model, [("mxfp6", 32)])  # float weights are not MX values: nothing is swapped
    assert report.packed == 0 and report.kept == 15
    assert pack_compressed(model, checkpoints["float"]) is None
    requantized = load_checkpoint(checkpoints["mxfp6"])  # the generic route: re-quantize, keep what is exact
    assert pack_decoder(requantized, [("mxfp4", 32), ("mxfp6", 32)]).packed == 14
    assert requantized.layers[1].self_attn.k_proj.packed.weight.fmt.name == "mxfp6_e2m3"
    with pytest.raises(FormatError, match="unknown MX format"):
        pack_decoder(model, [("mxfp5", 32)])
    packed = load_checkpoint(checkpoints["mxfp4"])
    pack_compressed(packed, checkpoints["mxfp4"], quiet=True)
    with pytest.raises(BackendError, match="float32 on CPU"):
        packed.layers[0].mlp.up_proj(torch.ones(1, 48, dtype=torch.float64))
    assert np.isfinite(packed.layers[0].mlp.up_proj(torch.ones(1, 48)).numpy()).all()


def test_generate_cli_mx_weights_choice(checkpoints, capsys):
    """``--mx-weights packed`` off the CPU kernel (bfloat16 here; a GPU the same way) keeps the MX weights packed on
    the device (``DeviceMXLinear``), ``decoded`` decodes them at load; both give the decoded-float tokens. On ort the
    flag is refused by name, and a plain checkpoint cannot be packed."""
    common = ["--prompt", "5 17 2", "--max-new-tokens", "8", "--greedy", "--ctx-len", "32", "--threads", "1", "--json"]
    torch_mx = ["--target", str(checkpoints["mxfp6"]), "--backend", "torch", "--dtype", "float32", *common]
    assert main(["generate", *torch_mx, "--mx-weights", "decoded"]) == 0
    out = capsys.readouterr()
    decoded = json.loads(out.out)
    assert "packed MX" not in out.err
    assert main(["generate", *torch_mx, "--mx-weights", "packed"]) == 0
    out = capsys.readouterr()
    assert "packed MX weights (the fused CPU kernel" not in out.err  # float32 on the CPU: the CPU kernel's line
    assert json.loads(out.out)["tokens"] == decoded["tokens"]
    bf16 = ["--target", str(checkpoints["mxfp6"]), "--backend", "torch", "--dtype", "bfloat16", *common]
    assert main(["generate", *bf16, "--mx-weights", "packed"]) == 0
    assert re.search(r"14 linear layers on packed MX weights on the device", capsys.readouterr().err)
    assert main(["generate", "--target", str(checkpoints["mxfp6"]), *common, "--mx-weights", "packed"]) == 2
    assert "mx_weights packed applies to --backend torch" in capsys.readouterr().err
    plain = ["--target", str(checkpoints["float"]), "--backend", "torch", "--dtype", "bfloat16", *common]
    assert main(["generate", *plain, "--mx-weights", "packed"]) == 2
    assert "holds no MX weights" in capsys.readouterr().err

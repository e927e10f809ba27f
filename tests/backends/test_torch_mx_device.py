"""MX weights kept packed on the torch backend's device (``accel.backends.torch_mx_device``) and the Triton kernels
that decode them inside the matmul on a GPU (``accel.backends.mx_triton``).

Exact claims, tested bit for bit: the field arithmetic gives every finite code's OCP value; the device layout holds
the codes (round trip, padding included); the torch decode equals the numpy reference's dequantization; a layer is
packed only where that decode gives back its weight, before the cast to the backend's dtype. The Triton kernels run
here under Triton's CPU interpreter (``TRITON_INTERPRET=1``): their decode equals the torch decode bit for bit, their
matmul equals float32 math on the same values up to summation order. Decoding: greedy SpD == AR on a packed target.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.backends import TorchBackend  # noqa: E402
from accel.backends.torch_mx_device import (  # noqa: E402
    DeviceMXLinear,
    decode_torch,
    element_values,
    exact_device_mx,
    join_planes,
    padded_width,
    split_planes,
)
from accel.errors import BackendError, FormatError  # noqa: E402
from accel.formats import quantize  # noqa: E402
from accel.formats.elements import FORMATS, get_format  # noqa: E402
from accel.formats.torch_ops import quantize_elements_torch  # noqa: E402
from accel.spd import DraftChain, DraftTree, Sampling, generate, generate_ar  # noqa: E402
from tests.helpers.decoders import random_model  # noqa: E402

PROMPT = [5, 17, 2, 9, 5, 17, 30, 4]


def mx_round(model, fmt: str = "mxfp6"):
    """``model`` with every block Linear weight replaced by its ``fmt`` decode (what accel.compress stores)."""
    with torch.no_grad():
        for name, m in model.named_modules():
            if type(m) is torch.nn.Linear and name.startswith("layers."):
                mx = quantize(m.weight.numpy(), fmt, axis=1)
                m.weight.copy_(torch.from_numpy(mx.dequantize(np.float32)))
    return model


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_field_arithmetic_gives_every_finite_code_value(name):
    fmt = get_format(name)
    table = fmt.code_values()
    got = element_values(torch.arange(1 << fmt.bits), fmt).numpy()
    finite = np.isfinite(table)
    assert finite.sum() >= (1 << fmt.bits) - 8  # E5M2: 2 infinities, 6 NaNs
    np.testing.assert_array_equal(got[finite].view(np.uint32), table[finite].view(np.uint32))  # bit for bit (-0.0)


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("k", [32, 128, 160, 576])
def test_device_layout_round_trips_the_codes(bits, k):
    codes = torch.randint(0, 1 << bits, (5, k), generator=torch.Generator().manual_seed(bits + k))
    lo, hi = split_planes(codes, bits)
    kp = padded_width(k)
    assert kp % 128 == 0 and kp - k < 128
    assert lo.dtype == torch.uint8 and lo.shape == (5, kp * min(bits, 8) // 8 if bits == 8 else kp // 2)
    assert (hi is None) == (bits != 6) and (hi is None or hi.shape == (5, kp // 4))
    back = join_planes(lo, hi, bits)
    assert torch.equal(back[:, :k], codes.to(torch.int32)) and not back[:, k:].any()


@pytest.mark.parametrize("name", ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1", "mxfp8_e4m3", "mxint8"])
def test_layer_decode_equals_the_numpy_dequantization(name):
    w = np.random.default_rng(0).normal(0, 0.05, (24, 160)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block (scale code 0)
    ref = quantize(w, name, axis=1).dequantize(np.float32)
    codes, scales, _ = quantize_elements_torch(torch.from_numpy(w), name, -1, 32)
    layer = DeviceMXLinear(codes, scales, name)
    assert layer.nbytes == layer.lo.numel() + (0 if layer.hi is None else layer.hi.numel()) + layer.scales.numel()
    np.testing.assert_array_equal(layer.weight_float().numpy(), ref)
    found = exact_device_mx(torch.from_numpy(ref), [name])
    assert found is not None and torch.equal(found[1], codes) and torch.equal(found[2], scales)


def test_only_exact_weights_are_packed():
    w = torch.randn(16, 64) * 0.05
    assert exact_device_mx(w, ["mxfp6", "mxfp4"]) is None  # float weights are not MX values
    mx4 = torch.from_numpy(quantize(w.numpy(), "mxfp4", axis=1).dequantize(np.float32))
    found = exact_device_mx(mx4, ["mxfp6", "mxfp4"])
    assert found is not None and found[0].name in ("mxfp6_e2m3", "mxfp4_e2m1")  # FP4 values are FP6 values too
    short = torch.from_numpy(quantize(w[:, :48].numpy(), "mxfp6", axis=1).dequantize(np.float32))
    found = exact_device_mx(short, ["mxfp6"])  # 48 wide: a padded last block
    assert found is not None and found[1].shape == (16, 64)
    layer = DeviceMXLinear(found[1], found[2], "mxfp6", in_features=48)
    assert layer.in_features == 48 and torch.equal(layer.weight_float(), short)
    with pytest.raises(FormatError, match="whole blocks of 32"):
        DeviceMXLinear(torch.zeros(4, 48, dtype=torch.int32), torch.zeros(4, 1, dtype=torch.uint8), "mxfp6")
    with pytest.raises(FormatError, match="covering in_features 20"):
        DeviceMXLinear(found[1], found[2], "mxfp6", in_features=20)


def test_backend_packs_exact_layers_and_gives_the_float_logits():
    model = mx_round(random_model(seed=1))
    float_backend = TorchBackend(mx_round(random_model(seed=1)), ctx_len=64)
    packed = TorchBackend(model, ctx_len=64, mx="mxfp6", graphs=True, fuse=True)
    report = packed.mx_report
    assert report is not None and report.packed == 8 and report.kept == 1  # 2 blocks x (qkv, o, gate_up, down); head
    assert report.packed_bytes < report.float_bytes  # 6.25 bits a weight, in_features 32 padded to a chunk of 128
    assert sum(isinstance(m, DeviceMXLinear) for m in packed.model.modules()) == 8
    ids, pos = np.array([PROMPT]), np.arange(len(PROMPT))[None]
    a, b = float_backend.forward(ids, pos), packed.forward(ids, pos)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # same weight values: float32 summation order only
    a1 = float_backend.forward(np.array([[7]]), np.array([[8]]))
    b1 = packed.forward(np.array([[7]]), np.array([[8]]))
    np.testing.assert_allclose(b1, a1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_greedy_spd_equals_ar_on_a_packed_target(kind):
    greedy = Sampling(greedy=True)

    def target():
        return TorchBackend(mx_round(random_model(seed=1)), ctx_len=64, mx="mxfp6", graphs=True, fuse=True)

    ar = generate_ar(target(), [PROMPT], max_new_tokens=24, sampling=greedy).tokens
    draft = TorchBackend(random_model(seed=1), ctx_len=64)  # the unrounded model: a close, high-acceptance draft
    proposer = DraftChain(draft, k=4) if kind == "chain" else DraftTree(draft, nodes=6, top_k=2)
    res = generate(target(), proposer, [PROMPT], max_new_tokens=24, sampling=greedy)
    assert res.tokens == ar
    assert res.stats.tokens_per_target_call > 1.5


def test_packing_happens_before_the_cast_to_the_dtype():
    """A block too small for float16 (scale 2^-30) stays exact: the layer is packed from float32, then only the
    other parameters are cast."""
    model = random_model(seed=2)
    with torch.no_grad():
        w = model.layers[0].mlp.down_proj.weight
        w.mul_(2.0**-28)
        w.copy_(torch.from_numpy(quantize(w.numpy(), "mxfp6", axis=1).dequantize(np.float32)))
        exact = w.clone()
    assert not torch.equal(exact.half().float(), exact)  # a cast would lose it
    backend = TorchBackend(model, ctx_len=16, dtype="float16", mx="mxfp6")
    layer = backend.model.layers[0].mlp.down_proj
    assert isinstance(layer, DeviceMXLinear) and torch.equal(layer.weight_float(), exact)
    assert backend.model.embed_tokens.weight.dtype == torch.float16


def test_bad_mx_settings_are_named():
    with pytest.raises(BackendError, match="mxfp5"):
        TorchBackend(random_model(seed=1), ctx_len=16, mx="mxfp5")
    backend = TorchBackend(random_model(seed=1), ctx_len=16, mx=["mxfp6", "mxint8"])
    assert backend.mx_report is not None and backend.mx_report.packed == 0  # no MX weights: nothing packed
    with pytest.raises(BackendError, match="max_rows"):
        DeviceMXLinear(
            torch.zeros(4, 32, dtype=torch.int32), torch.zeros(4, 1, dtype=torch.uint8), "mxfp6", max_rows=99
        )


def test_compiled_backend_gives_the_eager_logits():
    ids, pos = np.array([PROMPT]), np.arange(len(PROMPT))[None]
    eager = TorchBackend(mx_round(random_model(seed=4)), ctx_len=32, mx="mxfp6", graphs=True, fuse=True)
    compiled = TorchBackend(
        mx_round(random_model(seed=4)), ctx_len=32, mx="mxfp6", graphs=True, fuse=True, compile=True
    )
    np.testing.assert_allclose(compiled.forward(ids, pos), eager.forward(ids, pos), rtol=1e-5, atol=1e-5)
    one = (np.array([[3]]), np.array([[len(PROMPT)]]))
    np.testing.assert_allclose(compiled.forward(*one), eager.forward(*one), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------- Triton (interpreter)


@pytest.fixture
def kernels():
    """(``accel.backends.mx_triton``, the device its kernels run on): a CUDA GPU where there is one, else the CPU under
    Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` before anything imports triton); skipped where
    triton is not installed."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return importlib.import_module("accel.backends.mx_triton"), torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and TRITON_INTERPRET is not 1 in this process")
    return importlib.import_module("accel.backends.mx_triton"), torch.device("cpu")


@pytest.mark.parametrize("name", ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1", "mxfp8_e5m2", "mxint8"])
def test_triton_decode_equals_the_torch_decode(kernels, name):
    mx_triton, dev = kernels
    fmt = get_format(name)
    codes, scales, _ = quantize_elements_torch(torch.randn(24, 160, device=dev) * 0.05, fmt, -1, 32)
    layer = DeviceMXLinear(codes, scales, fmt)
    ref = decode_torch(layer.lo, layer.hi, layer.scales, fmt, 24, 160)
    got = mx_triton.decode(layer.lo, layer.hi, layer.scales, fmt, 24, 160, torch.float32)
    assert torch.equal(got, ref)
    bf16 = mx_triton.decode(layer.lo, layer.hi, layer.scales, fmt, 24, 160, torch.bfloat16)
    assert torch.equal(bf16, ref.bfloat16())


@pytest.mark.parametrize("rows", [1, 3, 8, 16])
@pytest.mark.parametrize("config", [(8, 4, 1), (8, 2, 16)])  # one program per 8 features; in_features split in two
def test_triton_matmul_equals_float32_math(kernels, rows, config):
    mx_triton, dev = kernels
    fmt = get_format("mxfp6")
    codes, scales, _ = quantize_elements_torch(torch.randn(20, 288, device=dev) * 0.05, fmt, -1, 32)  # a padded chunk
    layer = DeviceMXLinear(codes, scales, fmt)
    x = torch.randn(rows, 288, device=dev)
    ref = (x.double() @ layer.weight_float().double().T).float()
    got = mx_triton.matmul(x, layer.lo, layer.hi, layer.scales, fmt, 20, config)
    assert got.shape == (rows, 20)
    np.testing.assert_allclose(got.cpu().numpy(), ref.cpu().numpy(), rtol=1e-5, atol=1e-5)
    broken = layer.lo.clone()
    broken[0, 0] ^= 0x08  # one code's bit: the kernel reads the planes it is given
    assert not torch.allclose(mx_triton.matmul(x, broken, layer.hi, layer.scales, fmt, 20, config), got)


def test_triton_kernels_are_what_the_layer_calls_where_they_can_run(kernels, monkeypatch):
    """With the kernels available (a GPU, or here the interpreter), a decode step goes through ``mx_matmul``'s
    kernel; on a CPU by default it decodes with torch, to the same values."""
    mx_triton, dev = kernels
    calls = []
    real = mx_triton.matmul
    monkeypatch.setattr(mx_triton, "matmul", lambda *a, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))
    monkeypatch.setattr(mx_triton, "CPU_INTERPRETER", True)
    fmt = get_format("mxfp6")
    codes, scales, _ = quantize_elements_torch(torch.randn(8, 64, device=dev) * 0.05, fmt, -1, 32)
    layer = DeviceMXLinear(codes, scales, fmt)
    x = torch.randn(1, 2, 64, device=dev)
    ref = (x @ layer.weight_float().T).cpu().numpy()
    np.testing.assert_allclose(layer(x).cpu().numpy(), ref, rtol=1e-5, atol=1e-5)
    assert calls == [(2, 64)]
    if dev.type == "cpu":
        monkeypatch.setattr(mx_triton, "CPU_INTERPRETER", False)  # the default on a CPU: torch's decode
        np.testing.assert_allclose(layer(x).numpy(), ref, rtol=1e-5, atol=1e-5)
        assert calls == [(2, 64)]

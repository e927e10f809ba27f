"""The torch path: same bits as numpy, dequantize equality, MXLinear against F.linear."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.errors import FormatError  # noqa: E402
from accel.formats import quantize  # noqa: E402
from accel.formats.torch_ops import MXLinear, dequantize_torch, quantize_torch  # noqa: E402
from tests.helpers.formats import ALL_FORMATS  # noqa: E402


def adversarial(rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal((6, 96)) * np.exp2(rng.integers(-140, 120, (6, 1)))).astype(np.float32)
    x[0, :32] = 0
    x[1, 5] = np.nan
    x[2, 40] = np.inf
    x[3, 70] = -np.inf
    x[4, :32] = np.float32(2.0**-149) * np.arange(32)  # float32 subnormals
    x[5, 32:64] = -0.0
    return x


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("axis", [0, -1])
def test_same_bits_as_numpy(name, axis, rng):
    x = adversarial(rng)
    ref = quantize(x, name, axis=axis)
    got = quantize_torch(torch.from_numpy(x), name, axis=axis)
    assert got == ref
    y = rng.standard_normal((3, 50, 7)).astype(np.float32)
    assert quantize_torch(torch.from_numpy(y), name, axis=1, block_size=16) == quantize(y, name, axis=1, block_size=16)
    z = rng.standard_normal((3, 17)).astype(np.float32)  # odd block size: FP6 groups straddle blocks
    mz = quantize(z, name, block_size=7)
    assert quantize_torch(torch.from_numpy(z), name, block_size=7) == mz
    np.testing.assert_array_equal(dequantize_torch(mz).numpy(), mz.dequantize())
    bf = torch.from_numpy(y).to(torch.bfloat16)
    assert quantize_torch(bf, name) == quantize(bf.float().numpy(), name)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_dequantize_torch_equals_numpy(name, rng):
    x = adversarial(rng)
    for axis in (0, 1):
        mx = quantize(x, name, axis=axis)
        np.testing.assert_array_equal(dequantize_torch(mx).numpy(), mx.dequantize())
        np.testing.assert_array_equal(dequantize_torch(mx, torch.float64).numpy(), mx.dequantize(np.float64))


@pytest.mark.parametrize("name", ["mxfp6", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("bias", [True, False])
def test_mxlinear_forward_equals_f_linear(name, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(80, 24, bias=bias)
    layer = MXLinear.from_linear(linear, name)
    assert layer.codes.dtype == torch.uint8 and layer.scales.dtype == torch.uint8
    w = torch.from_numpy(quantize(linear.weight.detach().numpy(), name, axis=1).dequantize())
    x = torch.randn(5, 3, 80)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, w, linear.bias), rtol=0, atol=0)
    # compute in the input's dtype
    xb = x.to(torch.bfloat16)
    out = layer(xb)
    assert out.dtype == torch.bfloat16
    bias_b = None if linear.bias is None else linear.bias.to(xb.dtype)
    ref = torch.nn.functional.linear(xb, w.to(torch.bfloat16), bias_b)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert layer.mx_weight() == quantize(linear.weight.detach().numpy(), name, axis=1)
    # uint8 buffers survive .half(): only floating tensors are converted
    layer.half()
    assert layer.codes.dtype == torch.uint8


def test_torch_bad_inputs():
    with pytest.raises(FormatError, match=r"'w'.*int64"):
        quantize_torch(torch.ones(4, 32, dtype=torch.int64), "mxfp6", name="w")
    with pytest.raises(FormatError, match="axis"):
        quantize_torch(torch.ones(4, 32), "mxfp6", axis=3)
    with pytest.raises(FormatError, match="known formats"):
        quantize_torch(torch.ones(4, 32), "fp6")


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 70)),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    ),
    name=st.sampled_from(ALL_FORMATS),
)
def test_same_bits_as_numpy_property(x, name):
    ref = quantize(x, name)
    assert quantize_torch(torch.from_numpy(x), name) == ref
    np.testing.assert_array_equal(dequantize_torch(ref).numpy(), ref.dequantize())

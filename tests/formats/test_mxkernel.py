"""The fused MX kernel (``accel.formats.mxkernel``) against the reference decode, compiled and on the numpy fallback.

Every test runs on each path of the compiled kernel (AVX-512 VBMI, AVX2, portable C; ``set_isa``) and with the numpy
path forced (``numpy``). Weights are
checked bit for bit (``decode``, and ``matmul`` by the identity matrix, which returns each weight unchanged); products
against the float64 product of the exact weights with the float32 dot-product bound K * 2^-23 * (|x| @ |W|.T).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats import get_format, quantize
from accel.formats.mx_tensor import MXTensor
from accel.formats.mxkernel import PackedMX, set_isa
from accel.formats.mxkernel_build import kernel_status, reset

FAST = ["mxfp6", "mxfp4", "mxint8"]
PORTABLE = ["mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"]
SHAPES = [(1, 1), (1, 32), (7, 33), (13, 45), (5, 64), (3, 100), (64, 576)]


ISA = {"avx512-vbmi": 2, "avx2": 1, "portable": 0}


@pytest.fixture(params=[*ISA, "numpy"])
def path(request, monkeypatch) -> str:
    """The code under test: one of the kernel's three paths (those the CPU lacks fall back to the next), or numpy."""
    if request.param == "numpy":
        monkeypatch.setenv("ACCEL_MXKERNEL", "numpy")
    else:
        monkeypatch.delenv("ACCEL_MXKERNEL", raising=False)
    reset()
    set_isa(ISA.get(request.param, 3))
    yield request.param
    set_isa(3)
    monkeypatch.undo()
    reset()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.int32)


def _check_matmul(p: PackedMX, ref: np.ndarray, x: np.ndarray) -> np.ndarray:
    y = p.matmul(x)
    assert y.shape == (*x.shape[:-1], ref.shape[0]) and y.dtype == np.float32
    x64, w64 = x.astype(np.float64), ref.astype(np.float64)
    y64 = x64 @ w64.T
    bound = ref.shape[1] * 2.0**-23 * (np.abs(x64) @ np.abs(w64).T)
    finite = np.isfinite(y64)
    assert np.array_equal(np.isnan(y), np.isnan(y64))
    assert np.all(np.abs(y[finite] - y64[finite]) <= bound[finite])
    return y


def _random_mx(rng, fmt: str, n: int, k: int, block: int = 32, scale_lo: int = 100, scale_hi: int = 150) -> MXTensor:
    """Every code equally likely (signed zeros included), random finite scales (hand-built, not from quantize)."""
    f = get_format(fmt)
    nblocks = -(-k // block)
    codes = rng.integers(0, 1 << f.bits, n * nblocks * block).astype(np.uint8)
    if f.special == "ieee":  # E5M2: leave out Inf/NaN codes (a product with them is not a weight test)
        codes[(codes & 0x7C) == 0x7C] &= 0x7B
    if f.special == "fn":
        codes[(codes & 0x7F) == 0x7F] &= 0x7E
    scales = rng.integers(scale_lo, scale_hi, (n, nblocks)).astype(np.uint8)
    from accel.formats.packing import pack_codes

    return MXTensor(fmt, (n, k), 1, block, pack_codes(codes, f.bits), scales)


@pytest.mark.parametrize("fmt", [*FAST, *PORTABLE])
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_and_matmul_match_reference(path, fmt, shape, rng):
    k = shape[1]
    w = quantize(rng.standard_normal(shape).astype(np.float32) * 3, fmt, axis=1)
    p = PackedMX(w)
    assert p.uses_kernel == (path != "numpy" and kernel_status().available)
    if p.uses_kernel:
        assert ISA[p.kernel_path] <= ISA[path] and (fmt in FAST or p.kernel_path == "portable")
    ref = w.dequantize(np.float32)
    assert np.array_equal(_bits(p.decode()), _bits(ref))
    _check_matmul(p, ref, rng.standard_normal((3, k)).astype(np.float32))
    _check_matmul(p, ref, rng.standard_normal(k).astype(np.float32))  # a 1-D activation
    assert np.array_equal(p.matmul(np.eye(k, dtype=np.float32)).T, ref)  # each weight exactly


@pytest.mark.parametrize("fmt", [*FAST, *PORTABLE])
def test_every_code_and_odd_blocks(path, fmt, rng):
    for block, k in [(32, 200), (32, 31), (4, 10), (7, 23), (64, 70)]:
        w = _random_mx(rng, fmt, 9, k, block)
        p = PackedMX(w)
        ref = w.dequantize(np.float32)
        assert np.array_equal(_bits(p.decode()), _bits(ref)), (block, k)
        assert np.array_equal(p.matmul(np.eye(k, dtype=np.float32)).T, ref), (block, k)
        _check_matmul(p, ref, rng.standard_normal((2, k)).astype(np.float32))


@pytest.mark.parametrize("fmt", [*FAST, "mxfp6_e3m2"])
def test_zero_blocks_nan_scale_and_extreme_scales(path, fmt, rng):
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[:, 64:] = 0
    w = quantize(x, fmt, axis=1)  # blocks 2 of every row: all zero (scale code 0, 2^-127)
    assert np.all(w.scales[:, 2] == 0)
    scales = w.scales.copy()
    scales[1, 0] = 0xFF  # a NaN block: row 1 decodes to NaN there
    scales[2, 1] = 1  # a tiny scale: weights 2^-126 * value, subnormal float32 products, still exact
    scales[3, 1] = 140
    w = MXTensor(w.fmt, w.shape, 1, 32, w.codes, scales)
    p = PackedMX(w)
    ref = w.dequantize(np.float32)
    got = p.decode()
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(got[1, :32]).all()
    assert np.array_equal(_bits(got[~np.isnan(ref)]), _bits(ref[~np.isnan(ref)]))
    xs = rng.standard_normal((2, 96)).astype(np.float32)
    y = p.matmul(xs)
    assert np.isnan(y[:, 1]).all() and np.isfinite(np.delete(y, 1, axis=1)).all()
    ok = np.delete(np.arange(6), 1)
    _check_matmul(PackedMX(MXTensor(w.fmt, (5, 96), 1, 32, _rows_codes(w, ok), scales[ok])), ref[ok], xs)
    zero = PackedMX(quantize(np.zeros((4, 40), np.float32), fmt, axis=1))
    assert np.array_equal(zero.matmul(np.ones((1, 40), np.float32)), np.zeros((1, 4), np.float32))


def _rows_codes(w: MXTensor, rows: np.ndarray) -> np.ndarray:
    from accel.formats.packing import pack_codes

    return pack_codes(w.unpacked_codes()[rows].reshape(-1), w.fmt.bits)


@pytest.mark.parametrize("fmt", ["mxfp6", "mxfp4", "mxint8"])
def test_rows_and_threads_do_not_change_a_result(path, fmt, rng):
    """A row's result is the same alone, in any group of rows (the VBMI path decodes a weight row once for up to 8
    activation rows: 19 = 8 + 8 + 3) and on any number of threads."""
    w = quantize(rng.standard_normal((300, 1000)).astype(np.float32), fmt, axis=1)
    p = PackedMX(w)
    x = rng.standard_normal((19, 1000)).astype(np.float32)
    y = p.matmul(x, threads=1)
    assert np.array_equal(p.matmul(x, threads=2), y)
    if p.uses_kernel:  # the numpy path leaves the summation order to BLAS
        for i in range(19):
            assert np.array_equal(p.matmul(x[i : i + 1], threads=3), y[i : i + 1])
        for lo, hi in ((0, 2), (2, 5), (5, 9), (9, 16), (3, 19)):
            assert np.array_equal(p.matmul(x[lo:hi], threads=2), y[lo:hi]), (lo, hi)


def test_bad_input(path, rng):
    w = quantize(rng.standard_normal((4, 40)).astype(np.float32), "mxfp6", axis=1)
    p = PackedMX(w)
    with pytest.raises(FormatError, match="float32 activations"):
        p.matmul(np.ones((2, 40)))  # float64
    with pytest.raises(FormatError, match=r"\[\.\.\., 40\]"):
        p.matmul(np.ones((2, 41), np.float32))
    with pytest.raises(FormatError, match="threads"):
        p.matmul(np.ones(40, np.float32), threads=0)
    with pytest.raises(FormatError, match="MXTensor"):
        PackedMX(np.ones((4, 40), np.float32))
    with pytest.raises(FormatError, match="blocked along axis 1"):
        PackedMX(quantize(np.ones((4, 40), np.float32), "mxfp6", axis=0))
    with pytest.raises(FormatError, match="2-D"):
        PackedMX(quantize(np.ones((2, 4, 40), np.float32), "mxfp6", axis=-1))


def test_kernel_builds_here_and_fallback_says_why(monkeypatch, tmp_path, capsys, rng):
    """Where a C compiler exists the kernel must build and load; a failing compiler gives the numpy path, same weights,
    and one line on stderr."""
    monkeypatch.delenv("ACCEL_MXKERNEL", raising=False)
    reset()
    if shutil.which("cc") or shutil.which("gcc"):
        assert kernel_status().available, kernel_status().reason
    w = quantize(rng.standard_normal((8, 70)).astype(np.float32), "mxfp4", axis=1)
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    reset()
    capsys.readouterr()
    p = PackedMX(w)
    err = capsys.readouterr().err
    assert not p.uses_kernel and not kernel_status().available
    assert err.count("\n") == 1 and "fused MX kernel unavailable" in err and "numpy path" in err
    assert np.array_equal(_bits(p.decode()), _bits(w.dequantize(np.float32)))
    assert not list(tmp_path.glob("mxkernel/*.so"))  # no half-written library left behind
    monkeypatch.undo()
    reset()


def test_empty_shapes(path):
    for n, k in [(0, 40), (3, 0)]:
        p = PackedMX(quantize(np.ones((n, k), np.float32), "mxfp6", axis=1))
        assert np.array_equal(p.matmul(np.ones((2, k), np.float32)), np.zeros((2, n), np.float32))
        assert p.matmul(np.ones((0, k), np.float32)).shape == (0, n) and p.decode().shape == (n, k)

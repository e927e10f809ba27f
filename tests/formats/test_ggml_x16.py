"""GGUF blocks of every kernel layout interleaved 16 rows at a time, times int8 activations
(``accel.formats.ggml_x16``, accel/formats/mxkernel_gx16.c, ``GGMLKernel.matmul_q8_x16``).

Every kernel path (portable C, AVX2 with and without AVX-VNNI, AVX-512 VNNI: ``PATH_SETTINGS``) equals the numpy
statement (``reference_q8_x16``) bit for bit: row counts across the 4-row tiles, output counts across groups of 16 and
the AVX2 halves of 8 (5, 9, 24, 37, 40 rows), special scales (subnormal, zero, infinite, NaN), an all-zero activation
block, 1 and 3 threads. The planes hold the stored bytes rearranged as documented (checked byte by byte); the reference
is checked against mutated weights (offset dropped, nibbles swapped, Q8_0 read as unsigned, I8_F32's halves' scales
swapped, the fifth bits dropped) and against the float64 product within the activation rounding bound; the onnxruntime
node with ``interleave`` 16 runs the same numbers and gives NaN for a node accel would not write. The AVX2 path on an
AVX2-only CPU: tests/backends/test_isa_emulated.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats.ggml import GGML_TYPES, GGMLTensor
from accel.formats.ggml_kernel import GGMLKernel
from accel.formats.ggml_x16 import interleave16, reference_q8_x16, x16_plane_bytes
from accel.formats.mxkernel import set_isa
from accel.formats.mxkernel_build import load_kernel
from accel.formats.mxkernel_q8 import quantize_q8
from tests.formats.test_ggml_kernel import _run_node, _same
from tests.formats.test_ggml_kernel_q8 import _activations, _every_path_equals, _tensor

pytestmark = [
    pytest.mark.skipif(load_kernel() is None, reason="the fused kernel cannot be built"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

# outputs 37 (two groups and 5), 5 (one AVX2 half, partly), 16, 3, 9 (a half and one), 24, 40; blocks 18, 3, 48, 1, 9,
# 7, 2; x rows 1..9 (tiles of 4 and the rest)
LAYOUTS = tuple(GGML_TYPES)  # every kernel layout runs interleaved
SHAPES = [(37, 576, 1), (5, 96, 3), (16, 1536, 2), (3, 32, 4), (9, 288, 6), (24, 224, 5), (40, 64, 9)]


@pytest.fixture(autouse=True)
def _best_isa():
    yield
    set_isa(3)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize(("n", "k", "rows"), SHAPES)
def test_every_path_equals_the_reference_bit_for_bit(name, n, k, rows, rng):
    t = _tensor(rng, name, n, k, special=n == 5)
    x = _activations(rng, rows, k)
    ref = reference_q8_x16(t, x)
    _every_path_equals(GGMLKernel(t).matmul_q8_x16, x, ref)
    assert ref.shape == (rows, n) and np.isfinite(ref).any()


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_row_does_not_depend_on_the_rows_beside_it(name, rng):
    t = _tensor(rng, name, 40, 352)
    x = rng.standard_normal((9, 352)).astype(np.float32)
    g = GGMLKernel(t)
    together = g.matmul_q8_x16(x)
    assert all(_same(g.matmul_q8_x16(x[i : i + 1])[0], together[i]) for i in range(9))
    assert _same(g.matmul_q8_x16(x.reshape(3, 3, 352)), together.reshape(3, 3, 40))


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_planes_are_the_stored_bytes_rearranged(name, rng):
    """Codes: group g, block b, chunk j, row i, byte e = the stored code byte 4j + e of row 16g + i, block b (Q4: a
    code and the one 16 places later, as stored); the 5-bit types' masks: bit 4i + e of mask r = the fifth bit of code
    4r + e of row i; scales: one row of 16 lanes per scale value (halves or floats); padded rows are zero."""
    t = _tensor(rng, name, 21, 96)
    codes, scales = interleave16(t)
    cb, sb = t.qtype.code_bytes, t.qtype.scale_bytes
    assert (codes.size, scales.size) == x16_plane_bytes(t) == (32 * 3 * cb, 32 * 3 * sb)
    chunk = 8 if cb == 32 else 4  # 4-byte chunks of codes (of the nibble bytes for the 5-bit types)
    c = codes.reshape(2, 3, cb * 16)[..., : chunk * 64].reshape(2, 3, chunk, 16, 4)
    unit = 4 if sb % 8 == 0 else 2
    s = scales.reshape(2, 3, sb // unit, 16, unit)
    for row, block, j, e in ((0, 0, 0, 0), (5, 2, chunk - 1, 3), (20, 1, 1, 2), (16, 2, 0, 1)):
        g, i = divmod(row, 16)
        assert c[g, block, j, i, e] == t.codes[row, block, 4 * j + e]
        assert bytes(s[g, block, :, i].reshape(-1)) == bytes(t.scales[row, block])
        if t.qtype.bits == 5:
            masks = codes.reshape(2, 3, cb * 16)[..., 256:].copy().view("<u8")  # [2, 3, 8]
            word = int.from_bytes(bytes(t.codes[row, block, 16:20]), "little")
            for r in range(8):
                assert (int(masks[g, block, r]) >> (4 * i + e)) & 1 == (word >> (4 * r + e)) & 1
    assert not c[1, :, :, 5:].any() and not s[1, :, :, 5:].any()  # rows 21..31: padding


def test_other_weights_and_bad_activations_are_refused(rng):
    with pytest.raises(FormatError, match="interleaved layout holds GGUF block weights; got ndarray"):
        interleave16(np.zeros((16, 64), np.float32))  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="got ndarray"):
        reference_q8_x16(np.zeros((16, 64), np.float32), np.zeros((1, 64), np.float32))  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="float32 activations"):
        GGMLKernel(_tensor(rng, "Q4_1", 4, 64)).matmul_q8_x16(np.zeros((1, 63), np.float32))


def test_the_reference_sees_the_offset_the_nibbles_and_the_sign(rng):
    """Mutated weights give other numbers through the kernel: Q4_1 without its offset, Q4_0 with its nibbles swapped,
    Q8_0 read as unsigned (each code + 128)."""
    x = rng.standard_normal((2, 128)).astype(np.float32)
    q41 = _tensor(rng, "Q4_1", 24, 128)
    no_m = q41.scales.copy()
    no_m[..., 2:] = 0
    assert not _same(
        GGMLKernel(q41).matmul_q8_x16(x), reference_q8_x16(GGMLTensor(q41.qtype, q41.shape, q41.codes, no_m), x)
    )
    q40 = _tensor(rng, "Q4_0", 24, 128)
    swapped = ((q40.codes >> 4) | (q40.codes << 4)).astype(np.uint8)
    assert not _same(
        GGMLKernel(q40).matmul_q8_x16(x), reference_q8_x16(GGMLTensor(q40.qtype, q40.shape, swapped, q40.scales), x)
    )
    q80 = _tensor(rng, "Q8_0", 24, 128)
    unsigned = GGMLTensor(q80.qtype, q80.shape, q80.codes ^ np.uint8(0x80), q80.scales)
    assert not _same(GGMLKernel(q80).matmul_q8_x16(x), reference_q8_x16(unsigned, x))
    i8 = _tensor(rng, "I8_F32", 24, 128)  # the two halves' (d, m) swapped
    halves = i8.scales.view("<f4").reshape(24, 4, 2, 2)[:, :, ::-1].copy().view(np.uint8).reshape(i8.scales.shape)
    assert not _same(
        GGMLKernel(i8).matmul_q8_x16(x), reference_q8_x16(GGMLTensor(i8.qtype, i8.shape, i8.codes, halves), x)
    )
    q5 = _tensor(rng, "Q5S_F32", 24, 128)  # the fifth bits dropped
    no_fifth = q5.codes.copy()
    no_fifth[..., 16:] = 0
    assert not _same(
        GGMLKernel(q5).matmul_q8_x16(x), reference_q8_x16(GGMLTensor(q5.qtype, q5.shape, no_fifth, q5.scales), x)
    )


@pytest.mark.parametrize("name", LAYOUTS)
def test_activation_rounding_stays_within_its_bound(name, rng):
    """|x16 - exact| <= sum over blocks of (dx_b / 2) * sum |d w + m|, plus float32 slack; the stored layout's int8
    path computes the same quantized products in another float32 order (close, not equal in general)."""
    t = _tensor(rng, name, 64, 576)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    w = t.dequantize(np.float32).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    _, dx = quantize_q8(x, t.nblocks)
    bound = (dx.astype(np.float64) / 2) @ np.abs(w).reshape(64, t.nblocks, 32).sum(axis=2).T
    slack = 576 * 2.0**-22 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    got = GGMLKernel(t).matmul_q8_x16(x)
    assert np.all(np.abs(got - exact) <= bound + 2 * slack)
    stored = GGMLKernel(t).matmul_q8(x)
    assert np.all(np.abs(got - stored) <= 2 * slack)


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_onnxruntime_node_runs_the_same_numbers(name, rng):
    for n, k in ((5, 64), (700, 544)):  # 700 * 544 weights: two kernel threads
        t = _tensor(rng, name, n, k, special=n == 5)
        x = rng.standard_normal((2, 3, k)).astype(np.float32)
        got = _run_node(t, x, interleave16(t), act_bits=8, interleave=16)
        assert got.shape == (2, 3, n)
        assert _same(got, GGMLKernel(t).matmul_q8_x16(x)), (n, k)


def test_the_onnxruntime_node_refuses_what_accel_does_not_write(rng):
    """interleave other than 16, interleaved planes with float activations, stored planes (N = 5 is not a whole group)
    under interleave 16, an interleaved node of a format code that is not a GGUF layout: NaN outputs."""
    t = _tensor(rng, "Q4_1", 5, 64)
    x = np.ones((2, 64), np.float32)
    planes = interleave16(t)
    assert not np.isnan(_run_node(t, x, planes, act_bits=8, interleave=16)).any()
    assert np.isnan(_run_node(t, x, planes, act_bits=8, interleave=8)).all()
    assert np.isnan(_run_node(t, x, planes, interleave=16)).all()
    assert np.isnan(_run_node(t, x, None, act_bits=8, interleave=16)).all()
    assert np.isnan(_run_node(t, x, planes, act_bits=8, interleave=16, fast=2)).all()

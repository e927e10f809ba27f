"""GGUF K-quants (``Q2_K`` .. ``Q6_K``), ``IQ4_XS``, ``IQ4_NL`` and ``Q5_0`` / ``Q5_1`` repacked exactly for
the fused kernel (``accel.formats.ggml_repack``; layouts ``Q4_F32``, ``I8_F32``, ``Q5S_F32`` and ``Q5_F32``, format
codes 7 to 10 of ``accel/formats/mxkernel*.c``).

The reference is the ``gguf`` package's own dequantization of the file's bytes: ``GGMLTensor.dequantize`` and the
kernel's ``decode`` on each of its paths equal it bit for bit (NaN where it is NaN) on random super-blocks whose float16
scales are normal, subnormal, zero, negative, infinite and NaN; ``matmul`` stays within the float32 dot-product bound
of the float64 product of those weights, each row's result independent of the rows beside it and of the threads; the
onnxruntime operator with fast 7 to 10 equals ``matmul`` bit for bit. A decode that reads the sub-scales without their
high bits (a plausible slip in the 6-bit packing) is shown to give other weights, so the reference catches it.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats.ggml import GGML_TYPES, GGUF_KERNEL_TYPES, GGMLTensor
from accel.formats.ggml_kernel import GGMLKernel
from accel.formats.ggml_repack import REPACKED
from accel.formats.mxkernel_build import load_kernel
from tests.formats.test_ggml_kernel import (  # noqa: F401  (path: the kernel-path fixture)
    _check_decode,
    _check_matmul,
    _halves,
    _run_node,
    _same,
    gq,
    path,
)

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

TYPES = list(REPACKED)
#: per type: byte offsets of its float16 fields in a file block
HALVES = {
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "IQ4_XS": (0,),
    "IQ4_NL": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
}
#: (N, K) shapes: K-quants need K a multiple of 256
SHAPES = {256: [(1, 256), (3, 512), (9, 768)], 32: [(1, 32), (5, 96), (13, 544)]}


def _raw(rng: np.random.Generator, name: str, n: int, k: int, special: bool = False, small: bool = False):
    """GGUF bytes of an [n, k] weight of type ``name``: random codes and sub-scales, float16 fields from ``_halves``
    (``small``: normal halves below 2^-4, for products that stay finite)."""
    r = REPACKED[name]
    nb = k // r.weights
    raw = rng.integers(0, 256, (n, nb, r.block_bytes)).astype(np.uint8)
    for at in HALVES[name]:
        h = _halves(rng, (n, nb), special)
        if small:
            h = np.where((h & 0x7C00) > 0x2C00, (h & 0x83FF) | 0x2800, h).astype(np.uint16)
        raw[..., at : at + 2] = h.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(-1)


def _ref(raw: np.ndarray, name: str, n: int) -> np.ndarray:
    return gq.dequantize(raw.reshape(n, -1), getattr(gq.GGMLQuantizationType, name))


def _shapes(name: str) -> list[tuple[int, int]]:
    return SHAPES[REPACKED[name].weights]


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("special", [False, True])
def test_dequantize_equals_gguf_package(name, special, rng):
    for n, k in _shapes(name):
        raw = _raw(rng, name, n, k, special)
        t = GGMLTensor.from_blocks(raw, name, (n, k))
        assert t.qtype.name == REPACKED[name].layout and t.source == name
        ref = _ref(raw, name, n)
        assert _same(t.dequantize(), ref), (name, n, k)
        if not special:
            assert not np.isnan(ref).any()
        layout = GGML_TYPES[REPACKED[name].layout]
        assert t.nbytes == n * k // 32 * layout.block_bytes


@pytest.mark.parametrize("name", TYPES)
def test_decode_bit_exact_on_every_path(path, name, rng):  # noqa: F811
    for n, k in _shapes(name):
        _check_decode(GGMLTensor.from_blocks(_raw(rng, name, n, k, special=True), name, (n, k)), path)


@pytest.mark.parametrize("name", TYPES)
def test_matmul_within_float32_bound(path, name, rng):  # noqa: F811
    for n, k in _shapes(name):
        t = GGMLTensor.from_blocks(_raw(rng, name, n, k, small=True), name, (n, k))
        g = GGMLKernel(t)
        ref = t.dequantize()
        _check_matmul(g, ref, rng.standard_normal((3, k)).astype(np.float32))
        _check_matmul(g, ref, rng.standard_normal(k).astype(np.float32))
        _check_matmul(g, ref, rng.standard_normal((9, k)).astype(np.float32))  # past the 8 rows of one AVX-512 pass
        assert np.array_equal(g.matmul(np.eye(k, dtype=np.float32)).T, ref)  # each weight, exactly


@pytest.mark.parametrize("name", TYPES)
def test_rows_and_threads_do_not_change_a_result(path, name, rng):  # noqa: F811
    k = 1024 if REPACKED[name].weights == 256 else 544
    t = GGMLTensor.from_blocks(_raw(rng, name, 300, k, small=True), name, (300, k))
    g = GGMLKernel(t)
    x = rng.standard_normal((11, k)).astype(np.float32)
    y = g.matmul(x, threads=1)
    assert np.array_equal(g.matmul(x, threads=2), y)
    if g.uses_kernel:
        for lo, hi in ((0, 1), (3, 8), (2, 11), (10, 11)):
            assert np.array_equal(g.matmul(x[lo:hi], threads=3), y[lo:hi]), (lo, hi)


@pytest.mark.parametrize("name", TYPES)
def test_special_scales_reach_the_outputs(path, name, rng):  # noqa: F811
    """A NaN or infinite float16 scale makes its row's outputs NaN or infinite on every path, as the float64 product
    of the reference weights does."""
    n, k = 4, REPACKED[name].weights * 2
    raw = _raw(rng, name, n, k, small=True).reshape(n, 2, -1)
    at = HALVES[name][0]
    raw[1, 0, at : at + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    raw[2, 1, at : at + 2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    t = GGMLTensor.from_blocks(raw.reshape(-1), name, (n, k))
    ref = _ref(raw.reshape(-1), name, n)
    x = np.abs(rng.standard_normal((2, k)).astype(np.float32)) + 0.5
    y = GGMLKernel(t).matmul(x)
    y64 = x.astype(np.float64) @ ref.astype(np.float64).T
    assert np.isnan(y[:, 1]).all() and np.array_equal(np.isnan(y), np.isnan(y64))
    assert np.array_equal(np.isfinite(y), np.isfinite(y64))


def test_sub_scale_high_bits_matter(rng):
    """Q4_K's sub-blocks 4..7 take the top two bits of their 6-bit scale and min from bytes 0..7: a decode that drops
    them gives other weights (so the bit-exact tests above would catch it), and a hand-built block decodes as the
    format says."""
    raw = _raw(rng, "Q4_K", 64, 256, small=True)
    t = GGMLTensor.from_blocks(raw, "Q4_K", (64, 256))
    blocks = raw.reshape(64, 144)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)
    low_only = (blocks[:, 12:16] & 0x0F).astype(np.float32)  # the sub-scales of blocks 4..7 without the high bits
    f = t.scales.view("<f4")  # [64, 8, 2]: d, m per sub-block
    assert np.mean(f[:, 4:, 0] != d * low_only) > 0.5
    # a hand-built block: d = 1, dmin = 0.5, sub-block j has scale j + 1 (+ 32 for j >= 4) and min 2, codes j
    block = np.zeros(144, np.uint8)
    block[0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    block[2:4] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    sc = [1, 2, 3, 4, 37, 38, 39, 40]
    for j in range(4):
        block[4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6)  # low scale, high bits of scale j + 4
        block[8 + j] = 2 | ((2 >> 4) << 6)  # min 2
        block[12 + j] = (sc[j + 4] & 0x0F) | ((2 & 0x0F) << 4)
    for c in range(4):  # 32 bytes per chunk: low nibbles block 2c, high nibbles block 2c + 1
        block[16 + 32 * c : 48 + 32 * c] = (2 * c) | ((2 * c + 1) << 4)
    w = GGMLTensor.from_blocks(block, "Q4_K", (1, 256)).dequantize().reshape(8, 32)
    want = np.array([sc[j] * j - 0.5 * 2 for j in range(8)], np.float32)
    np.testing.assert_array_equal(w, np.repeat(want[:, None], 32, axis=1))
    np.testing.assert_array_equal(_ref(block, "Q4_K", 1).reshape(8, 32), w)


def test_q3_k_hand_built_block():
    """A hand-built ``Q3_K`` super-block decodes as the format says: scale i's high bits from byte 8 + i % 4, the
    offset 4 applied where the weight's hmask bit is clear (and the gguf package agrees)."""
    block = np.zeros(110, np.uint8)
    block[108:110] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    scales = np.arange(16) * 4 + 2  # 2, 6, .., 62: every scale uses its high bits from 16 on
    for i, v in enumerate(scales):
        lo, hi = v & 0x0F, v >> 4
        block[96 + i % 8] |= lo << (4 * (i // 8))
        block[104 + i % 4] |= hi << (2 * (i // 4))
    block[32:96] = 0b11100100  # codes 0, 1, 2, 3 at shifts 0, 2, 4, 6 (weights 32j + l take code j)
    block[0:32] = 0b10101010  # hmask: bits 1, 3, 5, 7 set (weights of j odd in each half: no offset)
    w = GGMLTensor.from_blocks(block, "Q3_K", (1, 256)).dequantize().reshape(16, 16)
    want = np.array([0.5 * (scales[g] - 32) * ((g // 2) % 4 - (0 if (g // 2) % 2 else 4)) for g in range(16)])
    np.testing.assert_array_equal(w, np.repeat(want.astype(np.float32)[:, None], 16, axis=1))
    np.testing.assert_array_equal(_ref(block, "Q3_K", 1).reshape(16, 16), w)


def test_refusals(rng):
    raw = _raw(rng, "Q4_K", 2, 256)
    with pytest.raises(FormatError, match=r"Q4_K weight \(2, 256\): need 288 bytes of blocks, got uint8 x 287"):
        GGMLTensor.from_blocks(raw[:-1], "Q4_K", (2, 256))
    with pytest.raises(FormatError, match=r"Q4_K weight \(2, 288\): K must be a multiple of 256"):
        GGMLTensor.from_blocks(raw, "Q4_K", (2, 288))
    with pytest.raises(FormatError, match=r"Q5_0 weight \(1, 40\): K must be a multiple of 32"):
        GGMLTensor.from_blocks(np.zeros(22, np.uint8), "Q5_0", (1, 40))
    with pytest.raises(
        FormatError, match="supported: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS, IQ4_NL, Q5_0"
    ):
        GGMLTensor.from_blocks(raw, "IQ2_XS", (2, 256))
    assert GGUF_KERNEL_TYPES == ("Q8_0", "Q4_0", "Q4_1", *TYPES)
    t = GGMLTensor.from_blocks(raw, "q4_k", (2, 256))  # type names in any case
    assert t.source == "Q4_K"
    with pytest.raises(FormatError, match="different types"):  # Q4_F32 and I8_F32 layouts do not join
        GGMLTensor.concat([t, GGMLTensor.from_blocks(_raw(rng, "Q5_K", 1, 256), "Q5_K", (1, 256))])
    q5 = GGMLTensor.from_blocks(_raw(rng, "Q5_1", 1, 256), "Q5_1", (1, 256))
    both = GGMLTensor.concat([GGMLTensor.from_blocks(_raw(rng, "Q5_K", 2, 256), "Q5_K", (2, 256)), q5])
    assert both.qtype.name == "Q5_F32" and both.source == "Q5_K+Q5_1"
    assert both.take_rows(np.array([2])).shape == (1, 256)


@pytest.mark.parametrize("name", TYPES)
def test_ort_node_equals_matmul_bit_for_bit(name, rng):
    if load_kernel() is None:
        pytest.skip("the fused kernel cannot be built here")
    k = REPACKED[name].weights * 2
    for n in (5, 700):  # 700 rows: the node uses 2 kernel threads
        t = GGMLTensor.from_blocks(_raw(rng, name, n, k, special=(n == 5)), name, (n, k))
        g = GGMLKernel(t)
        for shape in ((1, k), (6, k)):
            x = rng.standard_normal(shape).astype(np.float32)
            assert _same(_run_node(t, x), g.matmul(x)), (n, shape)
    t = GGMLTensor.from_blocks(_raw(rng, name, 5, k, small=True), name, (5, k))
    x = np.ones((2, k), np.float32)
    assert not np.isnan(_run_node(t, x)).any()
    other = "Q4_1" if t.qtype.name != "Q4_1" else "Q8_0"  # another layout: its scales plane has another size
    assert np.isnan(_run_node(t, x, fast=GGML_TYPES[other].fast, bits=GGML_TYPES[other].bits)).all()
    if t.qtype.bits == 5:  # Q5S_F32 and Q5_F32 share their sizes: the other code is read, with other weights
        swap = GGML_TYPES["Q5_F32" if t.qtype.name == "Q5S_F32" else "Q5S_F32"].fast
        assert not np.array_equal(_run_node(t, x, fast=swap), _run_node(t, x))

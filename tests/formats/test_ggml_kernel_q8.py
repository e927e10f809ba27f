"""llama.cpp's blocks times int8 activations (``GGMLKernel.matmul_q8``, accel/formats/mxkernel_gq8.c).

Every kernel path (portable C, AVX2 with and without AVX-VNNI, AVX-512 VNNI; ``PATH_SETTINGS``, AVX-512 CPUs running the
AVX2 code) equals the numpy statement of the arithmetic (``reference_q8_ggml``) bit for bit for every block layout
(``Q8_0``, ``Q4_0``, ``Q4_1`` as stored; ``Q4_F32``, ``I8_F32``, ``Q5S_F32``, ``Q5_F32`` holding the repacked K-quant
and Q5 types): row counts across the 4-row tiles, block counts across the 8-block scale groups and the 2-block
registers, special scales (subnormal, zero, infinite, NaN), a code of -128, an all-zero activation block, 1 and 3
threads. The reference itself is checked against a mutated one (offset dropped, nibbles swapped) and the activation
rounding against its bound; the onnxruntime node with ``act_bits=8`` runs the same numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats.ggml import GGML_TYPES, GGMLTensor
from accel.formats.ggml_kernel import GGMLKernel
from accel.formats.mxkernel import set_isa
from accel.formats.mxkernel_build import load_kernel
from accel.formats.mxkernel_q8 import quantize_q8, reference_q8_ggml
from tests.formats.test_ggml_kernel import _raw_blocks, _run_node, _same

pytestmark = [
    pytest.mark.skipif(load_kernel() is None, reason="the fused kernel cannot be built"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]
STORED = ("Q8_0", "Q4_0", "Q4_1")
LAYOUTS = tuple(GGML_TYPES)  # every block layout the kernel runs


@pytest.fixture(autouse=True)
def _best_isa():
    yield
    set_isa(3)


def _tensor(rng: np.random.Generator, name: str, n: int, k: int, special: bool = False) -> GGMLTensor:
    """Random blocks of a stored type (``_raw_blocks``: random codes, random float16 scales), or of a repacked layout:
    random code bytes and float32 scales (``special``: some zero, subnormal, infinite and NaN)."""
    if name in STORED:
        return GGMLTensor.from_blocks(_raw_blocks(rng, name, n, k, special=special, small=not special), name, (n, k))
    t = GGML_TYPES[name]
    codes = rng.integers(0, 256, (n, k // 32, t.code_bytes)).astype(np.uint8)
    f = (rng.standard_normal((n, k // 32, t.scale_bytes // 4)) * 2.0 ** rng.integers(-8, 2, (n, 1, 1))).astype(
        np.float32
    )
    if special:
        flat = f.reshape(-1)
        pick = rng.choice(flat.size, 5, replace=False)
        flat[pick] = [0.0, -0.0, 1e-40, np.inf, np.nan]
    return GGMLTensor(t, (n, k), codes, f.view(np.uint8))


# blocks a row 18, 3, 48, 1, 9, 7, 13, 4, 14: every size (1..8) of a row's last group of 8 blocks
SHAPES = [
    (37, 576, 1),
    (5, 96, 3),
    (16, 1536, 2),
    (3, 32, 4),
    (9, 288, 6),
    (4, 224, 2),
    (6, 416, 1),
    (2, 128, 1),
    (3, 448, 2),
]


def _activations(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """``[rows, k]`` float32 activations whose first block of row 0 is all zero (scale 0, codes 0)."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :32] = 0.0
    return x


#: every int8-activation path as ``set_isa`` arguments: portable, AVX2 (vpmaddubsw), AVX2 with AVX-VNNI where the CPU
#: has it, AVX-512 VNNI, AVX-512 VNNI + VBMI (each capped by what the CPU has)
PATH_SETTINGS = ((0, True), (1, False), (1, True), (2, True), (3, True))


def _every_path_equals(matmul, x: np.ndarray, ref: np.ndarray) -> None:
    """``matmul(x, threads=...)`` equals ``ref`` bit for bit on every kernel path (``PATH_SETTINGS``), 1 and 3
    threads."""
    for isa, avx_vnni in PATH_SETTINGS:
        set_isa(isa, avx_vnni=avx_vnni)
        for threads in (1, 3):
            assert _same(matmul(x, threads=threads), ref), (isa, avx_vnni, threads)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize(("n", "k", "rows"), SHAPES)
def test_every_path_equals_the_reference_bit_for_bit(name, n, k, rows, rng):
    t = _tensor(rng, name, n, k, special=n == 5)
    x = _activations(rng, rows, k)
    ref = reference_q8_ggml(t, x)
    _every_path_equals(GGMLKernel(t).matmul_q8, x, ref)
    assert np.isfinite(ref).any()


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_row_does_not_depend_on_the_rows_beside_it(name, rng):
    t = _tensor(rng, name, 24, 352, special=False)  # 11 blocks: a group of 8, a pair, a single block
    x = rng.standard_normal((9, 352)).astype(np.float32)
    g = GGMLKernel(t)
    together = g.matmul_q8(x)
    assert all(_same(g.matmul_q8(x[i : i + 1])[0], together[i]) for i in range(9))
    assert _same(g.matmul_q8(x.reshape(3, 3, 352)), together.reshape(3, 3, 24))


def test_the_reference_sees_the_offset_and_the_nibble_order(rng):
    """Mutations of the arithmetic give other numbers: Q4_1 without its offset term, Q4_0 with its nibbles swapped
    (weight i read from the high nibble), Q8_0 read as unsigned."""
    x = rng.standard_normal((2, 128)).astype(np.float32)
    q41 = _tensor(rng, "Q4_1", 8, 128)
    no_offset = GGMLTensor.from_blocks(_with_zero_m(q41), "Q4_1", (8, 128))
    assert not _same(GGMLKernel(q41).matmul_q8(x), reference_q8_ggml(no_offset, x))
    q40 = _tensor(rng, "Q4_0", 8, 128)
    swapped = ((q40.codes >> 4) | (q40.codes << 4)).astype(np.uint8)
    swapped_t = GGMLTensor(q40.qtype, q40.shape, swapped, q40.scales)
    assert not _same(GGMLKernel(q40).matmul_q8(x), reference_q8_ggml(swapped_t, x))
    q80 = _tensor(rng, "Q8_0", 8, 128)
    unsigned = GGMLTensor(q80.qtype, q80.shape, q80.codes ^ np.uint8(0x80), q80.scales)  # code + 128 (mod 256)
    assert not _same(GGMLKernel(q80).matmul_q8(x), reference_q8_ggml(unsigned, x))
    i8 = _tensor(rng, "I8_F32", 8, 128)  # the two halves' (d, m) swapped
    halves = i8.scales.view("<f4").reshape(8, 4, 2, 2)[:, :, ::-1].copy().view(np.uint8).reshape(i8.scales.shape)
    assert not _same(
        GGMLKernel(i8).matmul_q8(x), reference_q8_ggml(GGMLTensor(i8.qtype, i8.shape, i8.codes, halves), x)
    )
    q5 = _tensor(rng, "Q5S_F32", 8, 128)  # the fifth bits dropped
    no_fifth = q5.codes.copy()
    no_fifth[..., 16:] = 0
    assert not _same(
        GGMLKernel(q5).matmul_q8(x), reference_q8_ggml(GGMLTensor(q5.qtype, q5.shape, no_fifth, q5.scales), x)
    )


def _with_zero_m(t: GGMLTensor) -> np.ndarray:
    scales = t.scales.copy()
    scales[..., 2:] = 0  # m = +0.0
    return np.concatenate([scales, t.codes], axis=-1).reshape(-1)


@pytest.mark.parametrize("name", LAYOUTS)
def test_activation_rounding_stays_within_its_bound(name, rng):
    """|q8 - exact| <= sum over blocks of (dx_b / 2) * sum |d w| + the offset's share, plus float32 slack; and it is
    an approximation (not equal to the float-activation path)."""
    t = _tensor(rng, name, 64, 576)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    w = t.dequantize(np.float32).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    _, dx = quantize_q8(x, t.nblocks)
    absw = np.abs(w).reshape(64, t.nblocks, 32).sum(axis=2)  # [N, B]: |d w + m| summed
    bound = (dx.astype(np.float64) / 2) @ absw.T
    slack = 576 * 2.0**-22 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    got = GGMLKernel(t).matmul_q8(x)
    err = np.abs(got - exact)
    assert np.all(err <= bound + 2 * slack), float(np.max(err - bound))
    assert np.max(np.abs(got - GGMLKernel(t).matmul(x))) > 0


def test_bad_input_is_refused(rng):
    g = GGMLKernel(_tensor(rng, "Q4_1", 4, 64))
    with pytest.raises(FormatError, match="float32 activations"):
        g.matmul_q8(np.zeros((1, 63), np.float32))
    with pytest.raises(FormatError, match="float32 activations"):
        g.matmul_q8(np.zeros((1, 64), np.float64))


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_onnxruntime_node_runs_the_same_numbers(name, rng):
    for n, k in ((5, 64), (700, 544)):  # 700 * 544 weights: two kernel threads
        t = _tensor(rng, name, n, k, special=n == 5)
        x = rng.standard_normal((2, 3, k)).astype(np.float32)
        assert _same(_run_node(t, x, act_bits=8), GGMLKernel(t).matmul_q8(x)), (n, k)

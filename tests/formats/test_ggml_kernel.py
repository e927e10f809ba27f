"""llama.cpp's GGUF blocks (``Q8_0``, ``Q4_0``, ``Q4_1``) as stored (``accel.formats.ggml``) and on the fused kernel
(``accel.formats.ggml_kernel.GGMLKernel``, format codes 4, 5, 6 of ``accel/formats/mxkernel*.c``).

``GGMLTensor.dequantize`` is checked bit for bit against the ``gguf`` package on random blocks (random codes, float16
scales and offsets that are normal, subnormal, zero, negative, infinite and NaN) and against hand-computed blocks (the
nibble order). The kernel runs on each of its paths (``set_isa``: default, AVX-512F, AVX2, portable C) and on the
numpy path: ``decode`` bit-exact to ``dequantize`` (NaN where it is NaN), ``matmul`` within the float32 dot-product
bound ``K * 2^-23 * (|x| @ |W|.T)`` of the float64 product of the exact weights, each row's result the same whatever the
rows beside it and the threads. The onnxruntime operator ``ai.accel::MXLinear`` with fast 4, 5, 6 equals
``GGMLKernel.matmul`` bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats.ggml import GGML_TYPES, GGMLTensor
from accel.formats.ggml_kernel import GGMLKernel
from accel.formats.mxkernel import set_isa
from accel.formats.mxkernel_build import kernel_status, load_kernel, reset

gq = pytest.importorskip("gguf.quants")
# NaN and infinite halves are part of the data: numpy's warnings about them are expected
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

TYPES = ["Q8_0", "Q4_0", "Q4_1"]  # the types read as stored (the repacked ones: test_ggml_repack.py)
ISA = {"default": 3, "avx512": 2, "avx2": 1, "portable": 0}
#: the kernel path each set_isa level may give (a CPU without AVX-512F or AVX2 falls back to the next path down)
PATHS = {
    "default": {"avx512", "avx2", "portable"},
    "avx512": {"avx512", "avx2", "portable"},
    "avx2": {"avx2", "portable"},
    "portable": {"portable"},
}
SHAPES = [(1, 32), (3, 64), (7, 96), (13, 160), (64, 576)]


@pytest.fixture(params=[*ISA, "numpy"])
def path(request, monkeypatch) -> str:
    """The code under test: a kernel path (``set_isa`` level; the CPU's best below it) or the numpy path."""
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


def _u32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _same(got: np.ndarray, ref: np.ndarray) -> bool:
    """Bit for bit where ``ref`` is not NaN (signed zeros included), NaN exactly where ``ref`` is NaN."""
    nan = np.isnan(ref)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(_u32(got[~nan]), _u32(ref[~nan])))


def _halves(rng: np.random.Generator, shape: tuple[int, ...], special: bool) -> np.ndarray:
    """float16 bit patterns: mostly normal values of either sign across the exponent range, and some subnormal
    halves, (signed) zeros, the largest half; ``special``: also infinities and NaN (quiet and signalling)."""
    size = int(np.prod(shape))
    h = (rng.integers(1, 0x7C00, size) | (rng.integers(0, 2, size) << 15)).astype(np.uint16)  # finite, nonzero
    pick = rng.random(size)
    h[pick < 0.15] = rng.integers(1, 0x400, int((pick < 0.15).sum())).astype(np.uint16)  # subnormal
    h[(pick >= 0.15) & (pick < 0.2)] |= 0x8000  # ... and their negatives among the rest
    h[(pick >= 0.2) & (pick < 0.24)] = 0x0000
    h[(pick >= 0.24) & (pick < 0.27)] = 0x8000
    h[(pick >= 0.27) & (pick < 0.29)] = 0x7BFF  # 65504
    h[(pick >= 0.29) & (pick < 0.3)] = 0x8001  # -2^-24
    if special:
        h[(pick >= 0.3) & (pick < 0.33)] = 0x7C00
        h[(pick >= 0.33) & (pick < 0.36)] = 0xFC00
        h[(pick >= 0.36) & (pick < 0.38)] = 0x7E00
        h[(pick >= 0.38) & (pick < 0.4)] = 0xFC01  # a signalling NaN
    return h.reshape(shape)


def _raw_blocks(
    rng: np.random.Generator, name: str, n: int, k: int, special: bool = False, small: bool = False
) -> np.ndarray:
    """GGUF bytes of an [n, k] weight: random codes, random halves (``_halves``); ``small``: every half in a modest
    range (normal values below 2^4, for products that stay finite)."""
    t = GGML_TYPES[name]
    nb = k // 32
    raw = rng.integers(0, 256, (n, nb, t.block_bytes)).astype(np.uint8)
    h = _halves(rng, (n, nb, t.scale_bytes // 2), special)
    if small:
        h = np.where((h & 0x7C00) > 0x4C00, (h & 0x83FF) | 0x3800, h).astype(np.uint16)
    raw[..., : t.scale_bytes] = h.view(np.uint8).reshape(n, nb, t.scale_bytes)
    return raw.reshape(-1)


def _gguf_ref(raw: np.ndarray, name: str, n: int) -> np.ndarray:
    return gq.dequantize(raw.reshape(n, -1), getattr(gq.GGMLQuantizationType, name))


# ------------------------------------------------------------------------------------------------ the container


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("special", [False, True])
def test_dequantize_equals_gguf_package(name, special, rng):
    for n, k in SHAPES:
        raw = _raw_blocks(rng, name, n, k, special)
        t = GGMLTensor.from_blocks(raw, name, (n, k))
        got = t.dequantize()
        ref = _gguf_ref(raw, name, n)
        assert got.dtype == np.float32 and got.shape == (n, k) == ref.shape
        assert _same(got, ref), (name, n, k)
        if not special:
            assert not np.isnan(ref).any()  # only the special halves make NaN
        assert t.nbytes == raw.size and t.nblocks == k // 32


def test_hand_computed_blocks():
    """The layout spelled out: byte j of a Q4 block holds weight j low and weight j + 16 high; Q8_0 codes are int8;
    Q4_0 subtracts 8; Q4_1 adds m; d and m are little-endian halves."""
    nib = np.arange(16, dtype=np.uint8) | ((15 - np.arange(16, dtype=np.uint8)) << 4)
    q = np.concatenate([np.arange(16), 15 - np.arange(16)]).astype(np.float32)  # weight j's code
    d, m = np.float16(0.5).tobytes(), np.float16(-3.0).tobytes()
    assert d == b"\x00\x38"  # little-endian
    cases = {
        "Q8_0": (d + np.arange(-16, 16, dtype=np.int8).tobytes(), 0.5 * np.arange(-16, 16)),
        "Q4_0": (d + nib.tobytes(), 0.5 * (q - 8)),
        "Q4_1": (d + m + nib.tobytes(), 0.5 * q - 3.0),
    }
    for name, (block, want) in cases.items():
        raw = np.frombuffer(block * 2, np.uint8)  # two rows of one block
        t = GGMLTensor.from_blocks(raw, name, (2, 32))
        np.testing.assert_array_equal(t.dequantize(), np.tile(want.astype(np.float32), (2, 1)))
        np.testing.assert_array_equal(_gguf_ref(raw, name, 2), t.dequantize())


def _wrong_q4_order(t: GGMLTensor) -> np.ndarray:
    """A Q4 decode with MX FP4's nibble order (byte j: weights 2j low, 2j + 1 high): the layout ggml does not use."""
    q = np.stack([t.codes & 15, t.codes >> 4], axis=-1).reshape(*t.codes.shape[:2], 32).astype(np.float32)
    halves = t.scales.view(np.dtype("<f2")).astype(np.float32)
    w = halves[..., :1] * q + (halves[..., 1:2] if t.qtype.name == "Q4_1" else -8 * halves[..., :1])
    return w.reshape(t.shape)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
def test_nibble_order_matters(path, name, rng):
    """A decode with the other nibble order gives other weights, so the bit-exact tests would catch a layout error
    (the kernel's and numpy's decode equal the gguf package's, not the interleaved order's)."""
    raw = _raw_blocks(rng, name, 4, 64, small=True)
    t = GGMLTensor.from_blocks(raw, name, (4, 64))
    wrong, ref = _wrong_q4_order(t), _gguf_ref(raw, name, 4)
    got = GGMLKernel(t).decode()
    assert _same(got, ref) and _same(t.dequantize(), ref)
    assert np.mean(wrong != ref) > 0.5  # most weights move
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y, y_wrong = GGMLKernel(t).matmul(x), x @ wrong.T
    assert not np.allclose(y, y_wrong, rtol=1e-3, atol=1e-3)


def test_from_blocks_and_constructor_errors(rng):
    raw = _raw_blocks(rng, "Q4_1", 2, 64)
    with pytest.raises(FormatError, match=r"Q4_1 weight \(2, 64\): need 80 bytes of blocks, got uint8 x 79"):
        GGMLTensor.from_blocks(raw[:-1], "Q4_1", (2, 64))
    with pytest.raises(FormatError, match=r"need 80 bytes of blocks, got int8 x 80"):
        GGMLTensor.from_blocks(raw.view(np.int8), "Q4_1", (2, 64))
    with pytest.raises(FormatError, match=r"\(2, 48\): need N >= 1 and K a multiple of 32"):
        GGMLTensor.from_blocks(raw, "Q4_1", (2, 48))
    with pytest.raises(FormatError, match="K a multiple of 32"):
        GGMLTensor.from_blocks(raw[:0], "Q4_1", (0, 64))
    with pytest.raises(FormatError, match="not run by accel's kernel; supported: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K"):
        GGMLTensor.from_blocks(raw, "IQ2_XS", (2, 64))
    t = GGMLTensor.from_blocks(raw, "q4_1", (2, 64))  # type names in any case
    assert t.qtype.name == "Q4_1"
    with pytest.raises(FormatError, match=r"scales must be uint8 \(2, 2, 4\), got uint8 \(2, 2, 2\)"):
        GGMLTensor(t.qtype, (2, 64), t.codes, t.scales[..., :2].copy())
    with pytest.raises(FormatError, match="GGMLTensor"):
        GGMLKernel(np.zeros((2, 64), np.float32))  # type: ignore[arg-type]


def test_take_rows_and_concat(rng):
    for name in TYPES:
        a = GGMLTensor.from_blocks(_raw_blocks(rng, name, 5, 96), name, (5, 96))
        b = GGMLTensor.from_blocks(_raw_blocks(rng, name, 3, 96), name, (3, 96))
        rows = np.array([4, 0, 2, 2])
        sub = a.take_rows(rows)
        assert sub.shape == (4, 96) and _same(sub.dequantize(), a.dequantize()[rows])
        ab = GGMLTensor.concat([a, b])
        assert ab.shape == (8, 96) and _same(ab.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))
        assert _same(GGMLKernel(ab).decode(), ab.dequantize())
    q8 = GGMLTensor.from_blocks(_raw_blocks(rng, "Q8_0", 2, 64), "Q8_0", (2, 64))
    q4 = GGMLTensor.from_blocks(_raw_blocks(rng, "Q4_0", 2, 64), "Q4_0", (2, 64))
    with pytest.raises(FormatError, match="different types or input features"):
        GGMLTensor.concat([q8, q4])
    with pytest.raises(FormatError, match="different types or input features"):
        GGMLTensor.concat([q8, GGMLTensor.from_blocks(_raw_blocks(rng, "Q8_0", 2, 32), "Q8_0", (2, 32))])
    with pytest.raises(FormatError, match="different types or input features"):
        GGMLTensor.concat([])


# ------------------------------------------------------------------------------------------------ the kernel


def _check_matmul(g: GGMLKernel, ref: np.ndarray, x: np.ndarray) -> np.ndarray:
    y = g.matmul(x)
    assert y.shape == (*x.shape[:-1], ref.shape[0]) and y.dtype == np.float32
    x64, w64 = x.astype(np.float64), ref.astype(np.float64)
    y64 = x64 @ w64.T
    bound = ref.shape[1] * 2.0**-23 * (np.abs(x64) @ np.abs(w64).T)
    assert np.isfinite(y64).all()
    assert np.all(np.abs(y - y64) <= bound)
    return y


def _check_path(g: GGMLKernel, path: str) -> None:
    assert g.uses_kernel == (path != "numpy" and kernel_status().available)
    if g.uses_kernel:
        assert g.kernel_path in PATHS[path]
    else:
        assert g.kernel_path == "numpy"


def _check_decode(t: GGMLTensor, path: str) -> None:
    """The kernel's decode of ``t`` on ``path`` (1 and 3 threads) equals ``t.dequantize()`` bit for bit."""
    g = GGMLKernel(t)
    _check_path(g, path)
    ref = t.dequantize()
    assert _same(g.decode(), ref), t.shape
    assert _same(g.decode(threads=3), ref), t.shape


@pytest.mark.parametrize("name", TYPES)
def test_decode_bit_exact_with_special_halves(path, name, rng):
    for n, k in SHAPES:
        _check_decode(GGMLTensor.from_blocks(_raw_blocks(rng, name, n, k, special=True), name, (n, k)), path)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_within_float32_bound(path, name, shape, rng):
    n, k = shape
    t = GGMLTensor.from_blocks(_raw_blocks(rng, name, n, k, small=True), name, shape)
    g = GGMLKernel(t)
    _check_path(g, path)
    ref = t.dequantize()
    _check_matmul(g, ref, rng.standard_normal((3, k)).astype(np.float32))
    _check_matmul(g, ref, rng.standard_normal(k).astype(np.float32))  # a 1-D activation
    _check_matmul(g, ref, rng.standard_normal((2, 2, k)).astype(np.float32))
    _check_matmul(g, ref, np.asfortranarray(rng.standard_normal((4, k)).astype(np.float32)))  # not C-contiguous
    assert np.array_equal(g.matmul(np.eye(k, dtype=np.float32)).T, ref)  # each weight, exactly (up to zeros' sign)
    assert g.matmul(np.ones((0, k), np.float32)).shape == (0, n)


@pytest.mark.parametrize("name", TYPES)
def test_special_halves_reach_the_outputs(path, name, rng):
    """A NaN or infinite scale makes its row's outputs NaN or infinite, on every path, as the float64 product does."""
    raw = _raw_blocks(rng, name, 6, 64, small=True).reshape(6, 2, -1)
    raw[1, 0, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    raw[2, 1, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    if name == "Q4_1":
        raw[3, 0, 2:4] = np.frombuffer(np.float16(-np.inf).tobytes(), np.uint8)
    t = GGMLTensor.from_blocks(raw.reshape(-1), name, (6, 64))
    ref = t.dequantize()
    x = np.abs(rng.standard_normal((2, 64)).astype(np.float32)) + 0.5
    y = GGMLKernel(t).matmul(x)
    y64 = x.astype(np.float64) @ ref.astype(np.float64).T
    assert np.array_equal(np.isnan(y), np.isnan(y64)) and np.isnan(y[:, 1]).all()
    fin = np.isfinite(y64)
    assert np.array_equal(y[~fin & ~np.isnan(y64)], y64[~fin & ~np.isnan(y64)])  # the infinities
    assert np.array_equal(fin, np.isfinite(y))


@pytest.mark.parametrize("name", TYPES)
def test_rows_and_threads_do_not_change_a_result(path, name, rng):
    """A row's result is the same alone (S = 1), in a call of 5 rows or 19, and on 1, 2 or 3 threads (bitwise)."""
    t = GGMLTensor.from_blocks(_raw_blocks(rng, name, 300, 1024, small=True), name, (300, 1024))
    g = GGMLKernel(t)
    x = rng.standard_normal((19, 1024)).astype(np.float32)
    y = g.matmul(x, threads=1)
    assert np.array_equal(g.matmul(x, threads=2), y)
    if g.uses_kernel:  # the numpy path leaves the summation order to BLAS
        for i in range(19):
            assert np.array_equal(g.matmul(x[i], threads=1), y[i])
            assert np.array_equal(g.matmul(x[i : i + 1], threads=3), y[i : i + 1])
        for lo, hi in ((0, 5), (5, 10), (3, 8), (14, 19), (0, 2)):
            assert np.array_equal(g.matmul(x[lo:hi], threads=2), y[lo:hi]), (lo, hi)
            assert np.array_equal(g.matmul(x[lo:hi], threads=1), y[lo:hi]), (lo, hi)


def test_bad_input(path, rng):
    g = GGMLKernel(GGMLTensor.from_blocks(_raw_blocks(rng, "Q4_0", 4, 64), "Q4_0", (4, 64)))
    with pytest.raises(FormatError, match="float32 activations"):
        g.matmul(np.ones((2, 64)))  # float64
    with pytest.raises(FormatError, match=r"\[\.\.\., 64\]"):
        g.matmul(np.ones((2, 65), np.float32))
    with pytest.raises(FormatError, match="threads"):
        g.matmul(np.ones(64, np.float32), threads=0)
    assert g.nbytes == 4 * 2 * 18 and g.auto_threads == 1


def test_kernel_refuses_gguf_arguments_that_do_not_fit(rng):
    """``mxk_linear`` with fast 4, 5, 6 checks bits, block and K (-1: nothing written); unknown format codes too;
    ``mxk_linear_q8`` (int8 activations) refuses the MXINT8 and unknown format codes; ``mxk_decode_ggml`` takes only
    GGUF blocks."""
    lib = load_kernel()
    if lib is None:
        pytest.skip("the fused kernel cannot be built here")
    t = GGMLTensor.from_blocks(_raw_blocks(rng, "Q4_1", 2, 64), "Q4_1", (2, 64))
    x = np.ones((1, 64), np.float32)
    y = np.full((1, 2), 7.0, np.float32)
    c, s = t.codes.ctypes.data, t.scales.ctypes.data
    args = (2, 64, 2, x.ctypes.data, 1, 64, y.ctypes.data, 1)
    assert lib.mxk_linear(c, s, None, 8, 32, 6, *args) == -1  # Q4_1 with 8 bits
    assert lib.mxk_linear(c, s, None, 4, 16, 6, *args) == -1  # block 16
    assert lib.mxk_linear(c, s, None, 4, 32, 6, 2, 63, 2, *args[3:]) == -1  # K != nblocks * 32
    assert lib.mxk_linear(c, s, None, 4, 32, 11, *args) == -1  # no format 11
    assert np.array_equal(y, np.full((1, 2), 7.0, np.float32))
    for fast in (0, 3, 11):
        assert lib.mxk_linear_q8(c, s, fast, 2, 2, x.ctypes.data, 1, 64, y.ctypes.data, 1) == -1
    assert np.array_equal(y, np.full((1, 2), 7.0, np.float32))
    out = np.empty((2, 64), np.float32)
    assert lib.mxk_decode_ggml(c, s, 2, 2, 2, out.ctypes.data, 1) == -1
    assert lib.mxk_linear(c, s, None, 4, 32, 6, *args) == 0
    assert np.array_equal(y, GGMLKernel(t).matmul(x))


def test_numpy_fallback_when_forced(monkeypatch, rng):
    monkeypatch.setenv("ACCEL_MXKERNEL", "numpy")
    reset()
    try:
        t = GGMLTensor.from_blocks(_raw_blocks(rng, "Q8_0", 3, 64, small=True), "Q8_0", (3, 64))
        g = GGMLKernel(t)
        assert not g.uses_kernel and g.kernel_path == "numpy"
        assert _same(g.decode(), t.dequantize())
        x = rng.standard_normal((2, 64)).astype(np.float32)
        np.testing.assert_array_equal(g.matmul(x), x @ t.dequantize().T)
        assert not GGMLKernel(t, use_kernel=False).uses_kernel
    finally:
        monkeypatch.undo()
        reset()


# ------------------------------------------------------------------------------------------------ onnxruntime


def _run_node(
    t: GGMLTensor, x: np.ndarray, planes: tuple[np.ndarray, np.ndarray] | None = None, **attrs: int
) -> np.ndarray:
    """``x @ W^T`` by one ``ai.accel::MXLinear`` node (fast 4, 5, 6) in a real onnxruntime session; ``planes``: the
    code and scale planes to give it (default: ``t``'s as stored); ``attrs`` override the node's attributes (a graph
    accel would not write)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from accel.backends.onnx_mxlinear import DOMAIN, register_mx_kernel

    n, k = t.shape
    codes, scales = planes if planes is not None else (t.codes, t.scales)
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(codes).reshape(-1), "codes"),
        numpy_helper.from_array(np.ascontiguousarray(scales).reshape(-1), "scales"),
        numpy_helper.from_array(np.zeros(256, np.float32), "lut"),
    ]
    node_attrs = {"N": n, "K": k, "bits": t.qtype.bits, "block": 32, "fast": t.qtype.fast, **attrs}
    node = helper.make_node("MXLinear", ["x", "codes", "scales", "lut"], ["y"], domain=DOMAIN, **node_attrs)
    lead = [f"d{i}" for i in range(x.ndim - 1)]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    register_mx_kernel(opts, 2)
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("name", TYPES)
def test_ort_node_equals_matmul_bit_for_bit(name, rng):
    if load_kernel() is None:
        pytest.skip("the fused kernel cannot be built here")
    for n, k in ((5, 32), (40, 96), (700, 544)):  # 700 * 544 weights: the node uses 2 kernel threads
        t = GGMLTensor.from_blocks(_raw_blocks(rng, name, n, k, special=(n == 5)), name, (n, k))
        g = GGMLKernel(t)
        for shape in ((1, k), (6, k), (2, 3, k)):
            x = rng.standard_normal(shape).astype(np.float32)
            got, ref = _run_node(t, x), g.matmul(x)
            assert got.shape == (*shape[:-1], n)
            assert _same(got, ref), (n, k, shape)
    t = GGMLTensor.from_blocks(_raw_blocks(rng, name, 5, 64, small=True), name, (5, 64))
    assert not np.isnan(_run_node(t, np.ones((2, 64), np.float32))).any()


@pytest.mark.parametrize("name", TYPES)
def test_ort_node_refuses_graphs_accel_does_not_write(name, rng):
    """activations of another width than 8 or 32 bits, bits that do not match the type, another block size, a format
    code past 10: NaN outputs (int8 activations: test_ggml_kernel_q8.py)."""
    if load_kernel() is None:
        pytest.skip("the fused kernel cannot be built here")
    t = GGMLTensor.from_blocks(_raw_blocks(rng, name, 5, 64, small=True), name, (5, 64))
    x = np.ones((2, 64), np.float32)
    wrong_bits = 4 if t.qtype.bits == 8 else 8
    for attrs in ({"act_bits": 16}, {"bits": wrong_bits}, {"block": 16}, {"fast": 11}):
        assert np.isnan(_run_node(t, x, **attrs)).all(), attrs
    if name == "Q4_1":  # Q4_1's scales read as Q4_0's: the scales plane is twice the size expected
        assert np.isnan(_run_node(t, x, fast=5)).all()
    else:
        q41 = GGMLTensor.from_blocks(_raw_blocks(rng, "Q4_1", 5, 64, small=True), "Q4_1", (5, 64))
        assert np.isnan(_run_node(q41, x, fast=t.qtype.fast, bits=t.qtype.bits)).all()

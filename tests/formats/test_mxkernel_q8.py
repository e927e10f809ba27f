"""MX weights times int8 activations (``accel.formats.mxkernel_q8``): every kernel path (portable C, AVX2 with and
without AVX-VNNI, AVX-512 VNNI where the CPU has them) equals the numpy statement of the arithmetic bit for bit,
whatever the rows per call and the threads; the AVX2 path uses AVX-VNNI exactly where the CPU has it; the activation
rounding stays within its bound of the float32-activation path; the onnxruntime operator with ``act_bits=8`` and a
``*-kernel-q8`` export run the same numbers, and greedy SpD on such a target is its own greedy AR."""

from __future__ import annotations

import numpy as np
import pytest

from accel.backends import OrtBackend, export_onnx
from accel.backends.cpu import cpu_flags
from accel.errors import BackendError, FormatError
from accel.formats import mxkernel_build, quantize
from accel.formats.mxkernel import PackedMX, set_isa
from accel.formats.mxkernel_q8 import matmul_q8, q8_kernel_path, q8_path, quantize_q8, reference_q8
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar
from tests.backends.test_onnx_mx_kernel import _model, _run_node
from tests.formats.test_ggml_kernel_q8 import PATH_SETTINGS
from tests.helpers.scenario import make_tokens

pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="the fused MX kernel cannot be built")
FORMATS = ["mxfp6_e2m3", "mxfp4_e2m1"]


@pytest.fixture(autouse=True)
def _best_isa():
    yield
    set_isa(3)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, NaN where the other is NaN."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.int32), b[~nan].view(np.int32)))


def _weight(fmt: str, n: int, k: int, seed: int = 0, nan_block: bool = False):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * np.exp2(rng.integers(-6, 6, (n, 1))).astype(np.float32)
    if nan_block:
        w[1, 3] = np.nan  # its block gets the NaN scale
    return quantize(w, fmt, axis=1, block_size=32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("n", "k", "rows"), [(37, 576, 1), (5, 100, 3), (16, 1536, 2), (3, 32, 4), (7, 96, 7), (9, 160, 9)]
)
def test_every_path_equals_the_reference_bit_for_bit(fmt, n, k, rows):
    w = _weight(fmt, n, k, seed=n + k, nan_block=n > 3)
    x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block: scale 0, codes 0
    ref = reference_q8(w, x)
    packed = PackedMX(w)
    seen = set()
    for isa, avx_vnni in PATH_SETTINGS:
        set_isa(isa, avx_vnni=avx_vnni)
        seen.add(q8_kernel_path(packed))
        for threads in (1, 3):
            assert _same(matmul_q8(packed, x, threads=threads), ref), (isa, avx_vnni, threads)
    assert {"portable", "avx2"} <= seen or q8_kernel_path(packed) == "portable"
    if n > 3:
        assert np.isnan(ref[:, 1]).all() and not np.isnan(ref[:, 0]).any()


@pytest.mark.skipif("avx2" not in cpu_flags(), reason="needs an x86-64 CPU with AVX2 (Linux /proc/cpuinfo)")
def test_the_avx2_path_uses_avx_vnni_exactly_where_the_cpu_has_it():
    """The kernel's own CPUID check (leaf 7, sub-leaf 1) against the kernel's /proc/cpuinfo flag ``avx_vnni``: the AVX2
    path (``set_isa(1)``) runs AVX-VNNI where the CPU has it, vpmaddubsw where it has not (the emulated AVX2-only CPU
    of tests/backends/test_isa_emulated.py: "avx2") or where ``avx_vnni=False`` asks so."""
    lib = mxkernel_build.load_kernel()
    set_isa(1)
    assert q8_path(lib) == ("avx-vnni" if "avx_vnni" in cpu_flags() else "avx2")
    set_isa(1, avx_vnni=False)
    assert q8_path(lib) == "avx2"
    set_isa(0)
    assert q8_path(lib) == "portable"
    assert q8_path(None) == "numpy"


def _kernel_quantize(x: np.ndarray, nblocks: int, xstride: int) -> tuple[np.ndarray, np.ndarray]:
    """mxk_quantize_q8 on rows xstride floats apart (the kernel's own call, on the path set_isa allows)."""
    xs = np.zeros((x.shape[0], xstride), np.float32)
    xs[:, : x.shape[1]] = x
    q = np.full((x.shape[0], nblocks, 32), 99, np.int8)
    d = np.full((x.shape[0], nblocks), 99.0, np.float32)
    lib = mxkernel_build.load_kernel()
    lib.mxk_quantize_q8(xs.ctypes.data, x.shape[0], xstride, nblocks, q.ctypes.data, d.ctypes.data)
    return q, d


def test_every_activation_quantizer_path_equals_the_numpy_statement():
    """Ties (x * 127 / amax exactly k + 1/2: to even), zero, NaN and infinite blocks, subnormals, float32's extremes."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 320)) * np.exp2(rng.integers(-20, 20, (3, 320)))).astype(np.float32)
    x[0, :32] = 0.0
    x[0, 32:64] = np.arange(-16, 16, dtype=np.float32) + 0.5  # amax 16.5: not ties; the next block is
    x[0, 64:96] = np.concatenate([[127.0], np.arange(-15, 16, dtype=np.float32) + 0.5]).astype(np.float32)
    x[1, 5], x[1, 40], x[1, 70] = np.nan, np.inf, -np.inf
    x[1, 96:128] = np.float32(1e-45) * np.arange(32, dtype=np.float32)  # subnormal activations
    x[2, 128:160] = np.float32(3.4e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[2, 300] = -np.float32(3.4028235e38)
    ref_q, ref_d = quantize_q8(x, 10)
    assert np.array_equal(ref_q[0, 2, 1:], np.rint(np.arange(-15, 16) + 0.5).astype(np.int8))  # ties to even
    for isa in (0, 1):
        set_isa(isa)
        q, d = _kernel_quantize(x, 10, 328)
        assert np.array_equal(q, ref_q), isa
        assert _same(d, ref_d), isa
    assert np.isnan(ref_d[1, :3]).all() and not np.isnan(ref_d[1, 3:]).any()


def test_a_row_does_not_depend_on_the_other_rows():
    w = _weight("mxfp6_e2m3", 24, 192)
    x = np.random.default_rng(2).standard_normal((5, 192)).astype(np.float32)
    packed = PackedMX(w)
    together = matmul_q8(packed, x)
    assert all(_same(matmul_q8(packed, x[i : i + 1])[0], together[i]) for i in range(5))


@pytest.mark.parametrize("fmt", FORMATS)
def test_activation_rounding_stays_within_its_bound(fmt):
    """|q8 - float path| <= sum over blocks of (d_b / 2) * sum |w| (each activation moves by at most half a step),
    plus float32 summation slack."""
    w = _weight(fmt, 64, 576, seed=3)
    x = np.random.default_rng(4).standard_normal((3, 576)).astype(np.float32)
    packed = PackedMX(w)
    exact = x.astype(np.float64) @ w.dequantize(np.float32).astype(np.float64).T
    _, d = quantize_q8(x, w.nblocks)
    absw = np.abs(w.dequantize(np.float32)).astype(np.float64).reshape(64, w.nblocks, 32).sum(axis=2)  # [N, B]
    bound = (d.astype(np.float64) / 2) @ absw.T  # [S, N]
    slack = 576 * 2.0**-23 * (np.abs(x).astype(np.float64) @ np.abs(w.dequantize(np.float32)).T)
    err = np.abs(matmul_q8(packed, x) - exact)
    assert np.all(err <= bound + 2 * slack), float(np.max(err - bound))
    assert np.max(err) > 0  # it is an approximation: the activations were rounded


def test_bad_inputs_are_refused():
    packed = PackedMX(_weight("mxfp6_e2m3", 4, 64))
    with pytest.raises(FormatError, match="float32 activations"):
        matmul_q8(packed, np.zeros((1, 63), np.float32))
    for fmt, block in (("mxint8", 32), ("mxfp6_e2m3", 16)):
        w = quantize(np.ones((4, 64), np.float32), fmt, axis=1, block_size=block)
        with pytest.raises(FormatError, match="E2M3 or MXFP4 E2M1 weight in blocks of 32"):
            matmul_q8(PackedMX(w), np.zeros((1, 64), np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_onnxruntime_node_runs_the_same_numbers(fmt):
    from accel.backends.onnx_builder import GraphBuilder
    from accel.backends.onnx_mxlinear import mx_linear

    w = _weight(fmt, 40, 96, seed=5)
    x = np.random.default_rng(6).standard_normal((2, 3, 96)).astype(np.float32)
    y = _run_node([w], x, act_bits=8)
    assert _same(y, reference_q8(w, x.reshape(-1, 96)).reshape(2, 3, 40))
    with pytest.raises(BackendError, match="int8 activations need MXFP6"):
        mx_linear(GraphBuilder(), "x", ["w"], [quantize(np.ones((4, 64), np.float32), "mxint8", axis=1)], "y", 8)


def test_greedy_spd_on_a_q8_kernel_target_equals_its_ar_and_trees_are_refused(tmp_path):
    """Chains: greedy SpD is the q8 target's own greedy AR. Trees: refused by the backend, naming the int8
    activations (a tree call's float rounding moves their codes: docs/spd.md), while a float-activation export of
    the same weights scores them."""
    from accel.errors import SpdError

    target = _model(tied=True, inter=128, seed=1)
    draft = _model(tied=True, inter=128, seed=2)
    kw = {"ctx_len": 64, "batch_size": 1, "progress": False, "tree": True}
    tb = OrtBackend(export_onnx(target, tmp_path / "t.onnx", weights="mxfp6-kernel-q8", **kw), threads=2)
    fb = OrtBackend(export_onnx(target, tmp_path / "f.onnx", weights="mxfp6-kernel", **kw), threads=2)
    db = OrtBackend(export_onnx(draft, tmp_path / "d.onnx", **kw))
    prompts = make_tokens(96, (7,), seed=1)
    ar = generate_ar(tb, prompts, max_new_tokens=20, sampling=GREEDY).tokens
    for k in (1, 3):
        assert generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar
    assert "tree" not in tb.info.capabilities and "tree" in fb.info.capabilities
    with pytest.raises(SpdError, match="its Linear activations are int8 \\(mxfp6-kernel-q8\\)"):
        generate(tb, DraftTree(db, nodes=6), prompts, max_new_tokens=20, sampling=GREEDY)
    ids = np.asarray([prompts[0]], np.int64)
    pos = np.arange(ids.shape[1], dtype=np.int64)[None]
    q8, f32 = tb.forward(ids, pos, num_logits=ids.shape[1]), fb.forward(ids, pos, num_logits=ids.shape[1])
    spread = float(np.ptp(f32))
    assert 0 < float(np.max(np.abs(q8 - f32))) < 0.05 * spread  # int8 activations: close to, not equal to, float

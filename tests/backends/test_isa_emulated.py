"""accel's instruction-set-dependent paths on an emulated AVX2-only x86 CPU (``qemu-x86_64 -cpu Haswell``: AVX2 and
FMA, no AVX-512, no VNNI) against this CPU, whatever it is (docs/backends.md, "Which code runs on which CPU").

The graphs are exported here; ``isa_runner.py`` runs them here and under the emulator, which reports its own CPUID to
onnxruntime and to the fused kernel, so both pick their AVX2 code. Skipped where ``qemu-x86_64`` is missing (``.ci/run``
installs Debian's ``qemu-user``) or the machine is not x86-64.

- int8 (``u8u8``, ``u8s7``): the same logits on both CPUs, bit for bit; the full-range ``u8s8`` export (accel's
  export before the fix) loses accuracy on the emulated CPU, which is what the emulator must show to count as a CPU
  without VNNI.
- ``*-nbits`` (MatMulNBits, int8 activations per block): the same integer arithmetic on both (per node, to float
  rounding); over a whole graph a float rounding difference can flip an activation's int8 code, so logits may differ
  by ~1% of their range, with the same error against fp32.
- ``*-kernel`` (accel's fused MX kernel): the emulated CPU runs its AVX2 path, with the same results; with int8
  activations (``*-kernel-q8``) the kernel's results are the same bit for bit.
- GGUF blocks on the kernel (``Q8_0``, ``Q4_0``, ``Q4_1`` as stored; ``Q4_K``, ``Q6_K``, ``Q5_0`` repacked): the
  AVX2 path's weights are the ``gguf`` package's values bit for bit, its products this CPU's to float32 summation
  order; with int8 activations on the blocks interleaved 16 rows at a time, the same bits.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from accel.backends import ExportWeights, export_onnx
from accel.models import Decoder, ModelConfig
from tests.backends import isa_runner
from tests.formats.test_ggml_kernel import _raw_blocks as _stored_blocks
from tests.formats.test_ggml_repack import _raw as _repacked_blocks

gq = pytest.importorskip("gguf.quants")

QEMU = shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(
    QEMU is None or platform.machine() != "x86_64", reason="needs qemu-x86_64 (Debian qemu-user) on x86-64"
)
GRAPHS = {
    "int8_u8u8": ExportWeights("int8"),
    "int8_u8s7": ExportWeights("int8", int8_scheme="u8s7"),
    "int8_u8s8": ExportWeights("int8", int8_scheme="u8s8"),
    "fp32": ExportWeights("fp32"),
    "nbits8": ExportWeights("mxint8-nbits"),
    "nbits6": ExportWeights("mxfp6-nbits"),
    "nbits4": ExportWeights("mxfp4-nbits"),
    "kernel6": ExportWeights("mxfp6-kernel"),
    "kernel6q8": ExportWeights("mxfp6-kernel-q8"),
}


#: GGUF block types run by the kernel's AVX2 path on the emulated CPU (as stored, and the two repacked layouts)
GGUF_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q5_0")


def _raw_blocks(rng: np.random.Generator, name: str, n: int, k: int, small: bool) -> np.ndarray:
    make = _stored_blocks if name in ("Q8_0", "Q4_0", "Q4_1") else _repacked_blocks
    return make(rng, name, n, k, small=small)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(native outputs, emulated outputs) of every graph and of the fused kernel."""
    d = tmp_path_factory.mktemp("isa")
    cfg = ModelConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
    model = Decoder(cfg).init_weights(0, std=0.1)
    paths = [str(export_onnx(model, d / f"{n}.onnx", ctx_len=32, weights=w, progress=False)) for n, w in GRAPHS.items()]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 256)), rng.standard_normal((48, 256))
    ids = rng.integers(0, 96, (1, 12))
    blocks = {f"gguf_{t}": _raw_blocks(rng, t, 48, 256, small=True) for t in GGUF_TYPES}
    np.savez(d / "in.npz", ids=ids, pos=np.arange(12)[None], mx_x=x.astype(np.float32), mx_w=w.astype(np.float32),
             **blocks)  # fmt: skip
    isa_runner.main([str(d / "in.npz"), str(d / "native.npz"), *paths])
    cmd = [QEMU, "-cpu", "Haswell", sys.executable, isa_runner.__file__, str(d / "in.npz"), str(d / "emu.npz"), *paths]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    if done.returncode != 0:
        pytest.fail(f"the emulated run failed ({done.returncode}): {done.stderr[-2000:]}")
    native = {**np.load(d / "native.npz"), **{f"in_{k}": v for k, v in blocks.items()}}  # + the GGUF bytes
    return native, np.load(d / "emu.npz")


def test_emulator_is_a_cpu_without_vnni(runs):
    """The emulated CPU clips a uint8 x int8 pair at 32,767 (no VNNI) and runs the kernel's AVX2 path."""
    _, emu = runs
    assert int(emu["u8s8"]) == 32767, "qemu's Haswell did not run onnxruntime's non-VNNI int8 kernel"
    assert str(emu["mx_path"]) == "avx2" and str(emu["mx_q8_path"]) == "avx2"


@pytest.mark.parametrize("name", ["int8_u8u8", "int8_u8s7", "fp32"])
def test_exact_paths_agree(runs, name):
    native, emu = runs
    spread = np.ptp(native["fp32"])
    err = np.abs(native[name] - emu[name]).max()
    assert err <= 1e-5 * spread, f"{name}: an AVX2-only CPU computes logits {err:.3g} away from this CPU's"


def test_full_range_int8_loses_accuracy_without_vnni(runs):
    """What the fix is for: the ``u8s8`` export is ~10x further from fp32 on the emulated CPU than ``u8u8``."""
    _, emu = runs
    ref = emu["fp32"]
    u8s8, u8u8 = np.abs(emu["int8_u8s8"] - ref).max(), np.abs(emu["int8_u8u8"] - ref).max()
    assert u8s8 > 3 * u8u8, f"u8s8 {u8s8:.3f} vs u8u8 {u8u8:.3f}: the emulator did not clip"


MX_TOLERANCES = [("nbits8", 0.02), ("nbits6", 0.02), ("nbits4", 0.02), ("kernel6", 1e-4), ("kernel6q8", 0.02)]


@pytest.mark.parametrize(("name", "tol"), MX_TOLERANCES)
def test_mx_paths_agree(runs, name, tol):
    """MatMulNBits (int8 activations) and the fused kernel: the same results and the same accuracy on both CPUs."""
    native, emu = runs
    ref, spread = native["fp32"], np.ptp(native["fp32"])
    err = np.abs(native[name] - emu[name]).max()
    assert err <= tol * spread, f"{name}: {err:.3g} between this CPU and an AVX2-only one"
    acc_native, acc_emu = np.abs(native[name] - ref).max(), np.abs(emu[name] - ref).max()
    assert abs(acc_emu - acc_native) <= 0.2 * acc_native + 1e-6, f"{name}: error vs fp32 {acc_emu} vs {acc_native}"


def test_kernel_avx2_path_equals_native(runs):
    native, emu = runs
    np.testing.assert_allclose(emu["mx_y"], native["mx_y"], rtol=1e-5, atol=1e-5 * np.abs(native["mx_y"]).max())


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_gguf_blocks_on_the_avx2_path(runs, name):
    """GGUF blocks (stored and repacked): the emulated CPU runs the AVX2 path, every weight it multiplies is the gguf
    package's value bit for bit (x @ I), and its products equal this CPU's to float32 summation order."""
    native, emu = runs
    key = f"gguf_{name}"
    assert str(emu[f"{key}_path"]) == "avx2"
    ref = gq.dequantize(native[f"in_{key}"].reshape(48, -1), getattr(gq.GGMLQuantizationType, name))
    assert np.array_equal(emu[f"{key}_eye"].T, ref) and np.array_equal(native[f"{key}_eye"].T, ref)
    y, y_emu = native[f"{key}_y"], emu[f"{key}_y"]
    np.testing.assert_allclose(y_emu, y, rtol=1e-5, atol=1e-5 * np.abs(y).max())


def test_kernel_q8_path_equals_native_bit_for_bit(runs):
    """int8 activations: integer block sums and a fixed float32 sequence, so AVX2 (emulated) and this CPU's best path
    (VNNI where it has it) give the same bits."""
    native, emu = runs
    assert np.array_equal(emu["mx_q8_y"].view(np.int32), native["mx_q8_y"].view(np.int32))


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_interleaved_gguf_q8_path_equals_native_bit_for_bit(runs, name):
    """GGUF blocks interleaved 16 rows at a time, int8 activations: the AVX2 path (8 rows a register, vpmaddubsw)
    and this CPU's best (VNNI where it has it) give the same bits."""
    native, emu = runs
    key = f"gguf_{name}_x16_y"
    assert np.array_equal(emu[key].view(np.int32), native[key].view(np.int32))
    assert np.isfinite(native[key]).all()

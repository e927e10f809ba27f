"""What this machine's CPU offers the instruction-set-dependent paths (docs/backends.md, "Which code runs on which
CPU"): onnxruntime's int8 kernels (``accel.backends.onnx_int8``) and accel's fused MX kernel
(``accel.formats.mxkernel``) choose their code from it.

onnxruntime multiplies uint8 activations by int8 weights with a saturating int16 pair sum (``vpmaddubsw``) on x86
CPUs without VNNI and in int32 (``vpdpbusd``, AMX) on CPUs with it; accel's int8 exports use uint8 weights, exact on
both, and ``int8_warning`` names the graphs that are not.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = [
    "INT8_DOT_FLAGS",
    "cpu_flags",
    "int8_dot_product",
    "int8_warning",
    "is_x86",
    "onnxruntime_u8s8_pair",
    "onnxruntime_u8s8_saturates",
]

#: /proc/cpuinfo flags of x86 CPUs whose int8 dot products accumulate in int32 without an int16 stage
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags (the ``flags`` / ``Features`` line of /proc/cpuinfo); empty where the file is
    missing (not Linux)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def is_x86() -> bool:
    """Whether this is an x86-64 machine (where onnxruntime's int8 kernels depend on VNNI)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def int8_dot_product(flags: frozenset[str] | None = None) -> bool:
    """Whether an x86 CPU with ``flags`` (default: this one's) accumulates uint8 x int8 products in int32 (VNNI or
    AMX, ``INT8_DOT_FLAGS``); False for an x86 CPU without them (AVX2-only, AVX-512 without VNNI)."""
    return bool((cpu_flags() if flags is None else flags) & set(INT8_DOT_FLAGS))


@functools.lru_cache(maxsize=1)
def onnxruntime_u8s8_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 ``MatMulInteger`` clips a pair sum at 32,767 on this CPU: asked of
    onnxruntime itself (``onnxruntime_u8s8_pair``, once per process), since the kernel it picks follows CPUID, which
    an emulator or a VM may report differently from /proc/cpuinfo."""
    return onnxruntime_u8s8_pair() != 2 * 255 * 127


def onnxruntime_u8s8_pair() -> int:
    """What onnxruntime's uint8 x int8 ``MatMulInteger`` gives on this CPU for one pair 255 * 127 + 255 * 127:
    64,770 (exact: VNNI, AMX) or 32,767 (clipped: AVX2, AVX-512 without VNNI). A few milliseconds."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
        "u8s8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(np.full((2, 1), 127, np.int8), "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(sess.run(None, {"a": np.full((1, 2), 255, np.uint8)})[0][0, 0])


def int8_warning(scheme: str | None, flags: frozenset[str] | None = None, x86: bool | None = None) -> str | None:
    """The one-line warning for an int8 graph whose weights are stored as ``scheme`` (``accel.int8`` metadata; None:
    exported before the metadata existed, i.e. ``u8s8``) on this CPU (asked of onnxruntime:
    ``onnxruntime_u8s8_saturates``) or on an x86 CPU with ``flags``; None when the CPU computes it as exactly as a
    VNNI CPU does."""
    if scheme not in (None, "u8s8") or not (is_x86() if x86 is None else x86):
        return None
    if (not onnxruntime_u8s8_saturates()) if flags is None else int8_dot_product(flags):
        return None
    return (
        "this int8 graph has full-range int8 weights (u8s8), which x86 CPUs without VNNI compute with a saturating "
        "int16 sum: its outputs lose accuracy here (e.g. a draft's acceptance drops). Export it again "
        "(int8_scheme 'u8u8', the default) for the same accuracy on every CPU"
    )

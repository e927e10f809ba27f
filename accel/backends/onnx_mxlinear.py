"""MX weights on accel's fused kernel inside onnxruntime: the ``ai.accel::MXLinear`` node and its registration.

``weights="mxfp6-kernel"`` (and ``mxfp4-kernel``, ``mxint8-kernel``) exports every Linear weight and the head as one
``MXLinear`` node each (q+k+v and gate+up joined along their outputs): inputs ``x`` float32 ``[..., K]``, the packed
codes (uint8, 1-D: the ``MXTensor.codes`` of ``W [N, K]``), the E8M0 scales (uint8 ``[N, K / 32]``) and the element
format's 256-entry value table (float32, read by the kernel's portable path only); attributes ``N``, ``K``, ``bits``,
``block`` (32) and ``fast`` (1 E2M3, 2 E2M1, 3 INT8: the SIMD paths' format code). onnxruntime runs it through
``accel/formats/mxkernel_ort.c``, which calls the same ``mxk_linear`` as ``PackedMX.matmul``: the weights are the MX
values exactly, the activations stay float32, and each output is a float32 sum in a fixed order whatever the number
of rows in the call or the threads (docs/formats.md, "The fused MX kernel").

Sessions: a graph with ``ai.accel`` nodes needs the kernel library registered in its session options
(``register_mx_kernel``); ``accel.backends.ort_session`` does that when onnxruntime reports the domain missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accel.backends.onnx_builder import GraphBuilder
from accel.errors import BackendError
from accel.formats.mxkernel import code_table, fast_code

__all__ = ["DOMAIN", "mx_linear", "register_mx_kernel", "uses_mx_kernel_error"]

DOMAIN = "ai.accel"


def _packed(name: str, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """The packed codes and scales of the MX weight ``t`` ``[N, K]`` (blocks of 32 along K, K a multiple of 32)."""
    if not fast_code(t.fmt) or len(t.shape) != 2 or t.axis != 1 or t.block_size != 32 or t.shape[1] % 32:
        raise BackendError(
            f"MXLinear weight {name!r}: need a 2-D MXINT8, MXFP6 (E2M3) or MXFP4 (E2M1) [out, in] tensor in blocks of "
            f"32 along in, in a multiple of 32; got {t.fmt.name} {t.shape} axis {t.axis} blocks of {t.block_size}"
        )
    return np.asarray(t.codes, np.uint8).reshape(-1), np.asarray(t.scales, np.uint8).reshape(t.shape[0], -1)


def mx_linear(
    g: GraphBuilder, xin: str, names: Sequence[str], ts: Sequence[Any], out: str | None, act_bits: int = 32
) -> str:
    """``xin @ W^T`` for the MX weights ``ts`` (named ``names``) joined along their outputs, as one ``MXLinear``
    node; returns its output name. ``act_bits`` 8: the activations quantized to int8 per block of 32 (attribute
    ``act_bits``; MXFP6 E2M3 and MXFP4 E2M1 only, ``accel.formats.mxkernel_q8``); 32: float32 (no attribute)."""
    if len({t.shape[1] for t in ts}) != 1 or len({t.fmt.name for t in ts}) != 1:
        raise BackendError(f"weights {tuple(names)} differ in input features or format; they cannot share an MXLinear")
    codes, scales = zip(*(_packed(n, t) for n, t in zip(names, ts, strict=True)), strict=True)
    fmt = ts[0].fmt
    if act_bits == 8 and fast_code(fmt) not in (1, 2):
        raise BackendError(f"int8 activations need MXFP6 (E2M3) or MXFP4 (E2M1) weights; {names[0]!r} is {fmt.name}")
    key = "+".join(names)
    g.init(f"{key}.mx_codes", np.concatenate(codes))  # each row is whole bytes (32 codes a block), so rows join
    g.init(f"{key}.mx_scales", np.concatenate(scales))
    g.opsets.add(DOMAIN)
    return g.op(
        "MXLinear",
        xin,
        f"{key}.mx_codes",
        f"{key}.mx_scales",
        g.const(code_table(fmt), np.float32),
        name=out,
        domain=DOMAIN,
        N=sum(int(t.shape[0]) for t in ts),
        K=int(ts[0].shape[1]),
        bits=int(fmt.bits),
        block=32,
        fast=fast_code(fmt),
        **({"act_bits": 8} if act_bits == 8 else {}),
    )


def uses_mx_kernel_error(exc: BaseException) -> bool:
    """Whether onnxruntime refused a graph because the ``ai.accel`` operators are not registered."""
    return DOMAIN in str(exc)


def register_mx_kernel(opts: Any, threads: int | None) -> None:
    """Register accel's kernel library (``MXLinear``) in the onnxruntime ``SessionOptions`` ``opts``, its calls on up
    to ``threads`` kernel threads (None: ``accel.formats.mxkernel.default_threads()``; one setting for the process:
    the last session registered sets it). BackendError, naming why, when the kernel cannot be built or loaded here
    (no C compiler, ``ACCEL_MXKERNEL=numpy``)."""
    from accel.formats.mxkernel import default_threads
    from accel.formats.mxkernel_build import kernel_status, load_kernel

    lib = load_kernel()
    status = kernel_status()
    if lib is None or status.library is None:
        raise BackendError(
            f"this graph runs its weights on accel's fused MX kernel (ai.accel::MXLinear), which is unavailable here "
            f"({status.reason}); export it with weights='mxfp6-nbits' (or mxint8-/mxfp4-nbits) instead"
        )
    lib.mxk_set_ort_threads(max(1, threads or default_threads()))
    opts.register_custom_ops_library(status.library)

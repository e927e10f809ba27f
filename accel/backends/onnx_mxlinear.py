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
from pathlib import Path
from typing import Any

import numpy as np

from accel.backends.onnx_builder import GraphBuilder
from accel.errors import BackendError
from accel.formats.elements import MXFP4_E2M1, MXFP6_E2M3, MXINT8
from accel.formats.ggml import GGML_TYPES, GGMLTensor
from accel.formats.ggml_x16 import GROUP, interleave16
from accel.formats.mxkernel import code_table, default_threads, fast_code
from accel.formats.mxkernel_build import kernel_status, load_kernel

__all__ = [
    "DOMAIN",
    "DOMAIN_VERSIONS",
    "check_mx_kernel_graph",
    "mx_linear",
    "register_mx_kernel",
    "uses_mx_kernel_error",
]

DOMAIN = "ai.accel"
#: the ``ai.accel`` opset versions this accel writes and runs (``accel.backends.onnx_graph`` declares version 1)
DOMAIN_VERSIONS = (1,)
_REQUIRED_ATTRS = {"N", "K", "bits", "block", "fast"}
_FORMAT_OF_FAST = {1: MXFP6_E2M3, 2: MXFP4_E2M1, 3: MXINT8}  # the kernel's format codes (accel.formats.mxkernel)
_GGML_OF_FAST = {t.fast: t for t in GGML_TYPES.values()}  # 4..10: GGUF blocks (accel.formats.ggml)


def _packed(name: str, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """The packed codes and scales of the MX weight ``t`` ``[N, K]`` (blocks of 32 along K, K a multiple of 32)."""
    if not fast_code(t.fmt) or len(t.shape) != 2 or t.axis != 1 or t.block_size != 32 or t.shape[1] % 32:
        raise BackendError(
            f"MXLinear weight {name!r}: need a 2-D MXINT8, MXFP6 (E2M3) or MXFP4 (E2M1) [out, in] tensor in blocks of "
            f"32 along in, in a multiple of 32; got {t.fmt.name} {t.shape} axis {t.axis} blocks of {t.block_size}"
        )
    return np.asarray(t.codes, np.uint8).reshape(-1), np.asarray(t.scales, np.uint8).reshape(t.shape[0], -1)


def mx_linear(
    g: GraphBuilder,
    xin: str,
    names: Sequence[str],
    ts: Sequence[Any],
    out: str | None,
    act_bits: int = 32,
    glu: bool = False,
) -> str:
    """``xin @ W^T`` for the MX weights ``ts`` (named ``names``) joined along their outputs, as one ``MXLinear``
    node; returns its output name. ``act_bits`` 8: the activations quantized to int8 per block of 32 (attribute
    ``act_bits``; MXFP6 E2M3, MXFP4 E2M1 and every GGUF layout, BackendError for other MX formats;
    ``accel.formats.mxkernel_q8``); 32: float32 (no attribute). ``glu``: ``ts`` are a gate and an up projection of
    the same shape, and the node outputs ``silu(x @ gate^T) * (x @ up^T)`` (attribute ``glu`` 1)."""
    kinds = {t.qtype.name if isinstance(t, GGMLTensor) else t.fmt.name for t in ts}
    if len({t.shape[1] for t in ts}) != 1 or len(kinds) != 1:
        raise BackendError(f"weights {tuple(names)} differ in input features or format; they cannot share an MXLinear")
    if glu and (len(ts) != 2 or ts[0].shape != ts[1].shape):
        raise BackendError(f"a gated MXLinear needs a gate and an up weight of one shape; got {tuple(names)}")
    interleave = 0
    if isinstance(ts[0], GGMLTensor):
        joined = GGMLTensor.concat(ts)
        if act_bits == 8:  # int8 activations: 16 rows interleaved (accel.formats.ggml_x16)
            c16, s16 = interleave16(joined)
            codes, scales, interleave = [c16], [s16], GROUP
        else:
            codes, scales = [joined.codes.reshape(-1)], [joined.scales.reshape(joined.shape[0], -1)]
        bits, fast, table = joined.qtype.bits, joined.qtype.fast, np.zeros(256, np.float32)
    else:
        codes, scales = zip(*(_packed(n, t) for n, t in zip(names, ts, strict=True)), strict=True)
        fmt = ts[0].fmt
        if act_bits == 8 and fast_code(fmt) not in (1, 2):
            raise BackendError(
                f"int8 activations need MXFP6 (E2M3) or MXFP4 (E2M1) weights; {names[0]!r} is {fmt.name}"
            )
        bits, fast, table = int(fmt.bits), fast_code(fmt), code_table(fmt)
    key = "+".join(names)
    g.init(f"{key}.mx_codes", np.concatenate(codes))  # each row is whole bytes (32 codes a block), so rows join
    g.init(f"{key}.mx_scales", np.concatenate(scales))
    g.opsets.add(DOMAIN)
    return g.op(
        "MXLinear",
        xin,
        f"{key}.mx_codes",
        f"{key}.mx_scales",
        g.const(table, np.float32),
        name=out,
        domain=DOMAIN,
        N=sum(int(t.shape[0]) for t in ts),
        K=int(ts[0].shape[1]),
        bits=int(bits),
        block=32,
        fast=int(fast),
        **({"act_bits": 8} if act_bits == 8 else {}),
        **({"glu": 1} if glu else {}),
        **({"interleave": interleave} if interleave else {}),
    )


def uses_mx_kernel_error(exc: BaseException) -> bool:
    """Whether onnxruntime refused a graph because the ``ai.accel`` operators are not registered."""
    return DOMAIN in str(exc)


def register_mx_kernel(opts: Any, threads: int | None) -> None:
    """Register accel's kernel library (``MXLinear``) in the onnxruntime ``SessionOptions`` ``opts``, its calls on up
    to ``threads`` kernel threads (None: ``accel.formats.mxkernel.default_threads()``; one setting for the process:
    the last session registered sets it), on the session's own intra-op pool when ``opts`` lets idle threads spin
    (onnxruntime's default; set the entry before registering) and on the library's pool when they sleep
    (docs/backends.md). BackendError, naming why, when the kernel cannot be built or loaded here (no C compiler,
    ``ACCEL_MXKERNEL=numpy``)."""
    lib = load_kernel()
    status = kernel_status()
    if lib is None or status.library is None:
        raise BackendError(
            f"this graph runs accel's kernel library (ai.accel::MXLinear or CacheAttention), which is unavailable here "
            f"({status.reason}); export it without accel_attention and with weights='mxfp6-nbits' (or mxint8-/"
            "mxfp4-nbits; fp32 for a .gguf file) instead"
        )
    lib.mxk_set_ort_threads(max(1, threads or default_threads()))
    opts.register_custom_ops_library(status.library)


def check_mx_kernel_graph(path: str | Path) -> None:
    """BackendError, naming the file and node, unless every ``ai.accel`` node of the graph at ``path`` is an
    ``MXLinear`` as ``mx_linear`` writes it or a ``CacheAttention`` as ``DecoderGraph.cache_attention`` writes it, in
    an ``ai.accel`` opset version this accel knows (``DOMAIN_VERSIONS``).

    Checked for MXLinear: the attributes (``fast`` 1/2/3 with ``bits`` 6/4/8, or 4..10 = GGUF Q8_0/Q4_0/Q4_1/
    Q4_F32/I8_F32/Q5S_F32/Q5_F32 with ``bits`` 8/4/4/4/8/5/5; ``block`` 32, ``K`` a multiple of 32, ``act_bits``
    absent, 32 or 8 with E2M3/E2M1 and the GGUF layouts, ``glu`` absent, 0 or 1 with ``N`` even, ``interleave``
    absent, 0 or 16 with ``act_bits`` 8 and a GGUF layout), the codes and scales initializers (uint8,
    ``N*K*bits/8`` and ``N*K/32`` elements, GGUF: times the block's 2 to 16 scale bytes; interleaved: ``N`` rounded
    up to a multiple of 16) and the value table (the format's
    ``code_table`` bit for bit; GGUF blocks: all zero). For CacheAttention: 8 inputs, 3 outputs, ``num_heads`` a
    multiple of ``num_kv_heads``. The kernel itself computes NaN for sizes it does not expect, but a ``fast`` code
    that disagrees with ``bits`` or a foreign value table gives other numbers without a word (fast 2 on MXFP6 codes:
    logits off by ~8 on a test decoder)."""
    import onnx

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError: a corrupt or unreadable file
        raise BackendError(f"{path} is not a readable ONNX file: {type(exc).__name__}: {exc}") from exc
    for opset in model.opset_import:
        if opset.domain == DOMAIN and opset.version not in DOMAIN_VERSIONS:
            raise BackendError(
                f"{path} uses the {DOMAIN} operators of opset version {opset.version}; this accel runs version(s) "
                f"{list(DOMAIN_VERSIONS)} (a graph written by another accel version: export it again)"
            )
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.domain == DOMAIN:
            _check_node(node, initializers, Path(path))


def _check_node(node: Any, initializers: dict[str, Any], path: Path) -> None:
    """``check_mx_kernel_graph`` for one ``ai.accel`` node."""
    from onnx import AttributeProto, TensorProto, numpy_helper

    where = f"{path}: {DOMAIN}::{node.op_type} node {node.name or node.output[0]!r}"
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "CacheAttention":
        _check_attention(node, attrs, where)
        return
    if node.op_type != "MXLinear" or len(node.input) != 4 or len(node.output) != 1:
        raise BackendError(
            f"{where}: accel's kernel domain has two operators, MXLinear (4 inputs, 1 output) and CacheAttention "
            "(8 inputs, 3 outputs)"
        )
    if not _REQUIRED_ATTRS <= set(attrs) <= {*_REQUIRED_ATTRS, "act_bits", "glu", "interleave"} or any(
        a.type != AttributeProto.INT for a in attrs.values()
    ):
        raise BackendError(f"{where}: attributes {sorted(attrs)}; MXLinear has the ints {sorted(_REQUIRED_ATTRS)}")
    a = {name: int(attr.i) for name, attr in attrs.items()}
    fmt = _FORMAT_OF_FAST.get(a["fast"])
    ggml = _GGML_OF_FAST.get(a["fast"])
    act_bits = a.get("act_bits", 32)
    if (
        (fmt is None and ggml is None)
        or a["bits"] != (fmt.bits if fmt is not None else ggml.bits)  # type: ignore[union-attr]
        or a["block"] != 32
        or a["N"] < 1
        or a["K"] < 32
        or a["K"] % 32
        or act_bits not in (8, 32)
        or (act_bits == 8 and a["fast"] == 3)
        or a.get("glu", 0) not in (0, 1)
        or (a.get("glu", 0) == 1 and a["N"] % 2)
        or a.get("interleave", 0) not in (0, GROUP)
        or (a.get("interleave", 0) and (act_bits != 8 or ggml is None))
    ):
        raise BackendError(
            f"{where}: attributes {a} are not an MXLinear accel writes (fast 1/2/3 = E2M3/E2M1/INT8 with bits 6/4/8, "
            "4..10 = GGUF Q8_0/Q4_0/Q4_1/Q4_F32/I8_F32/Q5S_F32/Q5_F32 with bits 8/4/4/4/8/5/5, block 32, K a multiple "
            "of 32, act_bits 8 only with E2M3/E2M1 and the GGUF layouts, glu 0 or 1 with N even, interleave 0, or 16 "
            "with act_bits 8 and a GGUF layout)"
        )
    scale_bytes = ggml.scale_bytes if ggml is not None else 1
    rows = -(-a["N"] // GROUP) * GROUP if a.get("interleave", 0) else a["N"]  # interleaved: whole groups of 16
    want = {
        node.input[1]: (TensorProto.UINT8, rows * a["K"] * a["bits"] // 8, "codes"),
        node.input[2]: (TensorProto.UINT8, rows * a["K"] // 32 * scale_bytes, "scales"),
        node.input[3]: (TensorProto.FLOAT, 256, "value table"),
    }
    for name, (dtype, count, what) in want.items():
        t = initializers.get(name)
        if t is None or t.data_type != dtype or int(np.prod(t.dims)) != count:
            kind = TensorProto.DataType.Name(dtype)
            got = "not an initializer" if t is None else f"{TensorProto.DataType.Name(t.data_type)} x {np.prod(t.dims)}"
            raise BackendError(f"{where}: its {what} {name!r} is {got}; N={a['N']} K={a['K']} need {kind} x {count}")
    table = numpy_helper.to_array(initializers[node.input[3]], base_dir=str(path.parent))
    expected = code_table(fmt) if fmt is not None else np.zeros(256, np.float32)  # GGUF blocks: no table (zeros)
    if not np.array_equal(np.asarray(table, np.float32).view(np.uint32), expected.view(np.uint32)):
        kind = fmt.name if fmt is not None else "GGUF block (all zero)"
        raise BackendError(f"{where}: its value table is not the {kind} code values the kernel's formats use")


def _check_attention(node: Any, attrs: dict[str, Any], where: str) -> None:
    """``check_mx_kernel_graph`` for an ``ai.accel::CacheAttention`` node (``accel.backends.onnx_layers``): 8 inputs,
    3 outputs, the int attributes ``num_heads`` and ``num_kv_heads`` (a multiple of it). Shapes are the operator's to
    check at run time (NaN attention for any it does not expect)."""
    from onnx import AttributeProto

    if len(node.input) != 8 or len(node.output) != 3:
        raise BackendError(
            f"{where}: CacheAttention has 8 inputs and 3 outputs; got {len(node.input)}, {len(node.output)}"
        )
    if set(attrs) != {"num_heads", "num_kv_heads"} or any(a.type != AttributeProto.INT for a in attrs.values()):
        raise BackendError(f"{where}: attributes {sorted(attrs)}; CacheAttention has the ints num_heads, num_kv_heads")
    h, hkv = int(attrs["num_heads"].i), int(attrs["num_kv_heads"].i)
    if hkv < 1 or h < hkv or h % hkv:
        raise BackendError(f"{where}: num_heads {h} must be a multiple of num_kv_heads {hkv} (>= 1)")

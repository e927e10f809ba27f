"""The MX checkpoint layouts of the serving engines: AMD Quark's OCP-MX export and compressed-tensors' MX formats.

Both store a Linear weight ``[out, in]`` quantized along ``in`` (blocks of 32, E8M0 scales) as two tensors beside the
module name, with the OCP MX v1.0 element codes and bit packing that accel uses (``accel.formats.packing``): FP6 as a
little-endian stream of 4 codes in 3 bytes, FP4 two codes per byte (first in the low nibble), FP8 one per byte
(docs/serving.md, "MX checkpoints", has the sources):

| layout | element | codes tensor | codes dtype, shape |
|---|---|---|---|
| quark | fp4 / fp6_e2m3 / fp6_e3m2 | ``<module>.weight`` | U8 ``[out, in * bits / 8]`` |
| compressed-tensors | mxfp4 / mxfp6 (E2M3) | ``<module>.weight_packed`` | U8 ``[out, in * bits / 8]`` |
| compressed-tensors | mxfp8 (E4M3) | ``<module>.weight`` | F8_E4M3 ``[out, in]`` |

and in every case the scales ``<module>.weight_scale``, U8 ``[out, in / 32]`` (E8M0 codes).

So an accel ``MXTensor`` blocked along axis 1 with block 32 and ``in % 32 == 0`` *is* the pair (its packed codes
reshaped to rows, its scales as they are): conversion is a copy, bit-exact both ways. The E8M0 NaN code 0xFF has no
meaning in either engine (both compute 2^(code - 127), which is 2^128 = inf), so it is refused both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accel.errors import FormatError
from accel.formats.constants import E8M0_NAN
from accel.formats.elements import ElementFormat, get_format
from accel.formats.mx_tensor import MXTensor

#: the block size both engines use (OCP MX v1.0 §5.1; Quark ``group_size``, compressed-tensors ``group_size``)
BLOCK = 32
LAYOUTS = ("quark", "compressed-tensors")
SCALES_SUFFIX = "weight_scale"
#: accel element format -> Quark ``dtype`` (Quark 0.13 real-quantizes and dequantizes these per_group with e8m0)
QUARK_DTYPES = {"mxfp4_e2m1": "fp4", "mxfp6_e2m3": "fp6_e2m3", "mxfp6_e3m2": "fp6_e3m2"}
#: accel element format -> compressed-tensors ``format`` (compressed-tensors 0.20; its MXFP6 is E2M3 only)
CT_FORMATS = {
    "mxfp4_e2m1": "mxfp4-pack-quantized",
    "mxfp6_e2m3": "mxfp6-pack-quantized",
    "mxfp8_e4m3": "mxfp8-quantized",
}
#: the Quark version whose export ``quantization_config`` is mirrored by ``quantization_config``
QUARK_VERSION = "0.13"
CT_VERSION = "0.20.0"


@dataclass(frozen=True)
class MXLayout:
    """One engine layout for one element format: where the codes go and in which dtype."""

    name: str
    fmt: ElementFormat
    codes_suffix: str
    codes_dtype: str

    def codes_name(self, module: str) -> str:
        return f"{module}.{self.codes_suffix}"

    def scales_name(self, module: str) -> str:
        return f"{module}.{SCALES_SUFFIX}"

    def packed_cols(self, in_features: int) -> int:
        return in_features * self.fmt.bits // 8


def get_layout(name: str, fmt: ElementFormat | str) -> MXLayout:
    """The layout ``name`` (``quark`` or ``compressed-tensors``) for element format ``fmt``; FormatError naming the
    combinations that exist when the engine has no such format (Quark 0.13 cannot export MXFP8; compressed-tensors
    has no E3M2 or E5M2)."""
    fmt = get_format(fmt)
    if name == "quark" and fmt.name in QUARK_DTYPES:
        return MXLayout("quark", fmt, "weight", "U8")
    if name == "compressed-tensors" and fmt.name in CT_FORMATS:
        return MXLayout(name, fmt, "weight" if fmt.bits == 8 else "weight_packed", "F8_E4M3" if fmt.bits == 8 else "U8")
    allowed = {"quark": sorted(QUARK_DTYPES), "compressed-tensors": sorted(CT_FORMATS)}
    if name not in allowed:
        raise FormatError(f"unknown serving layout {name!r}; known: {', '.join(LAYOUTS)}")
    raise FormatError(f"layout {name!r} has no {fmt.name} weights; it stores: {', '.join(allowed[name])}")


def check_convertible(mx: MXTensor, layout: MXLayout, name: str) -> None:
    """FormatError unless ``mx`` has exactly the layout's geometry: 2-D, blocked along axis 1 in blocks of 32, whole
    blocks, the layout's element format and no NaN-scale block."""
    if mx.fmt != layout.fmt:
        raise FormatError(f"tensor {name!r} is {mx.fmt.name}; this {layout.name} checkpoint holds {layout.fmt.name}")
    if len(mx.shape) != 2 or mx.axis != 1 or mx.block_size != BLOCK or mx.shape[1] % BLOCK:
        raise FormatError(
            f"tensor {name!r}: {layout.name} stores [out, in] weights blocked along in (axis 1) in blocks of {BLOCK} "
            f"with in % {BLOCK} == 0; got shape {mx.shape}, axis {mx.axis}, block {mx.block_size}"
        )
    if mx.scales.size and int(mx.scales.max()) == E8M0_NAN:
        raise FormatError(
            f"tensor {name!r} has NaN blocks (E8M0 code 0xFF), which {layout.name} cannot represent "
            "(its engines read 0xFF as 2^128); fix the NaN/Inf weights first"
        )


def to_stored(mx: MXTensor, layout: MXLayout, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) as the layout stores them for weight ``name``: a reshape of ``mx``'s bytes, no re-encoding."""
    check_convertible(mx, layout, name)
    out = mx.shape[0]
    return mx.codes.reshape(out, layout.packed_cols(mx.shape[1])), mx.scales.reshape(out, -1)


def from_stored(codes: np.ndarray, scales: np.ndarray, layout: MXLayout, name: str) -> MXTensor:
    """The ``MXTensor`` of a stored (codes, scales) pair, validated against the layout (FormatError naming ``name``)."""
    if codes.ndim != 2 or scales.ndim != 2 or codes.dtype.itemsize != 1 or scales.dtype != np.uint8:
        raise FormatError(
            f"tensor {name!r}: expected 2-D uint8 codes and scales, got {codes.dtype} {codes.shape} and "
            f"{scales.dtype} {scales.shape}"
        )
    rows, cols = codes.shape
    if (cols * 8) % layout.fmt.bits:
        raise FormatError(f"tensor {name!r}: {cols} packed bytes per row do not hold whole {layout.fmt.bits}-bit codes")
    in_features = cols * 8 // layout.fmt.bits
    if in_features % BLOCK or scales.shape != (rows, in_features // BLOCK):
        raise FormatError(
            f"tensor {name!r}: codes {codes.shape} imply [{rows}, {in_features}] weights, whose {layout.name} "
            f"scales are [{rows}, {in_features // BLOCK}] with in % {BLOCK} == 0; got scales {scales.shape}"
        )
    if scales.size and int(scales.max()) == E8M0_NAN:
        raise FormatError(f"tensor {name!r}: scale code 0xFF (2^128 = inf in {layout.name}) is not a finite scale")
    flat = np.ascontiguousarray(codes).view(np.uint8).reshape(-1)
    return MXTensor(layout.fmt, (rows, in_features), 1, BLOCK, flat.copy(), np.array(scales), name=name)


# --------------------------------------------------------------------------------------------- quantization_config


def quantization_config(layout: MXLayout, excluded: list[str]) -> dict[str, Any]:
    """The ``config.json`` ``quantization_config`` of a weight-only checkpoint in ``layout``; ``excluded`` lists the
    Linear modules kept in float (Quark ``exclude``, compressed-tensors ``ignore``)."""
    if layout.name == "quark":
        return _quark_config(layout, excluded)
    return _ct_config(layout, excluded)


def _quark_config(layout: MXLayout, excluded: list[str]) -> dict[str, Any]:
    """Quark's ``quantization_config`` for a weight-only checkpoint in ``layout``."""
    weight = {
        "dtype": QUARK_DTYPES[layout.fmt.name],
        "qscheme": "per_group",
        "group_size": BLOCK,
        "ch_axis": -1,
        "scale_format": "e8m0",
        "scale_type": "float",
        "scale_calculation_mode": "floor",  # accel's rule (OCP MX v1.0 §6.3); Quark's own default is "even"
        "round_method": "half_even",
        "is_dynamic": False,
        "observer_cls": "PerBlockMXObserver",
        "symmetric": None,
        "mx_element_dtype": None,
        "is_scale_quant": False,
        "block_size": None,
        "enable_buffer_reuse": False,
        "max_input_numel": 4194304,
        "zero_point_type": "int32",
    }
    return {
        "quant_method": "quark",
        "version": QUARK_VERSION,
        "quant_mode": "eager_mode",
        "global_quant_config": {
            "weight": weight,
            "input_tensors": None,
            "output_tensors": None,
            "bias": None,
            "target_device": None,
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "kv_cache_quant_config": {},
        "kv_cache_post_rope": False,
        "softmax_quant_spec": None,
        "algo_config": None,
        "exclude": list(excluded),
        "export": {
            "kv_cache_group": [],
            "min_kv_scale": 0.0,
            "pack_method": "reorder",
            "weight_format": "real_quantized",
            "weight_merge_groups": None,
        },
    }


def _ct_config(layout: MXLayout, excluded: list[str]) -> dict[str, Any]:
    """compressed-tensors' ``quantization_config`` for a weight-only checkpoint in ``layout``."""
    fmt_name = CT_FORMATS[layout.fmt.name]
    weights = {
        "num_bits": layout.fmt.bits,
        "type": "float",
        "strategy": "group",
        "group_size": BLOCK,
        "symmetric": True,
        "dynamic": False,
        "scale_dtype": "torch.uint8",
    }
    group = {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": None,
        "output_activations": None,
        "format": fmt_name,
    }
    return {
        "quant_method": "compressed-tensors",
        "version": CT_VERSION,
        "format": fmt_name,
        "quantization_status": "compressed",
        "config_groups": {"group_0": group},
        "ignore": list(excluded),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def parse_quantization_config(qc: Any, where: str) -> MXLayout:
    """The layout a ``quantization_config`` describes; FormatError naming ``where`` and the field for anything else
    (per-layer Quark configs, several compressed-tensors groups, non-MX schemes)."""
    if not isinstance(qc, dict):
        raise FormatError(f"{where}: quantization_config must be an object, got {type(qc).__name__}")
    method = qc.get("quant_method")
    if method == "quark":
        return _parse_quark(qc, where)
    if method == "compressed-tensors":
        return _parse_ct(qc, where)
    raise FormatError(f"{where}: quant_method {method!r} is not an MX layout accel reads; known: {', '.join(LAYOUTS)}")


def _expect(cfg: dict[str, Any], key: str, allowed: tuple[Any, ...], where: str) -> Any:
    value = cfg.get(key)
    if value not in allowed:
        raise FormatError(f"{where}: {key}={value!r}; accel reads {' or '.join(repr(a) for a in allowed)}")
    return value


def _parse_quark(qc: dict[str, Any], where: str) -> MXLayout:
    for key in ("layer_quant_config", "layer_type_quant_config"):
        if qc.get(key):
            raise FormatError(f"{where}: Quark {key} is not empty; accel reads one global weight config only")
    export = qc.get("export") or {}
    _expect(export, "weight_format", ("real_quantized",), f"{where} export")
    glob = qc.get("global_quant_config")
    weight = glob.get("weight") if isinstance(glob, dict) else None
    if not isinstance(weight, dict):
        raise FormatError(f"{where}: Quark global_quant_config.weight must be one object (an OCP-MX weight spec)")
    w = f"{where} global_quant_config.weight"
    dtype = _expect(weight, "dtype", tuple(QUARK_DTYPES.values()), w)
    _expect(weight, "qscheme", ("per_group",), w)
    _expect(weight, "group_size", (BLOCK,), w)
    _expect(weight, "scale_format", ("e8m0",), w)
    if weight.get("ch_axis", -1) not in (-1, 1):
        raise FormatError(f"{w}: ch_axis={weight.get('ch_axis')!r}; accel reads blocks along in_features (-1 or 1)")
    fmt = {v: k for k, v in QUARK_DTYPES.items()}[dtype]
    return get_layout("quark", fmt)


def _parse_ct(qc: dict[str, Any], where: str) -> MXLayout:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise FormatError(f"{where}: compressed-tensors config_groups must hold exactly one group for accel to read it")
    (group,) = groups.values()
    fmt_name = group.get("format") or qc.get("format")
    formats = {v: k for k, v in CT_FORMATS.items()}
    if fmt_name not in formats:
        raise FormatError(f"{where}: compressed-tensors format {fmt_name!r}; accel reads {', '.join(sorted(formats))}")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise FormatError(f"{where}: compressed-tensors group has no weights spec")
    w = f"{where} weights"
    layout = get_layout("compressed-tensors", formats[fmt_name])
    _expect(weights, "num_bits", (layout.fmt.bits,), w)
    _expect(weights, "type", ("float",), w)
    _expect(weights, "group_size", (BLOCK,), w)
    _expect(weights, "scale_dtype", ("torch.uint8", "uint8"), w)
    _expect(qc, "quantization_status", ("compressed",), where)
    return layout

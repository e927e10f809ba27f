"""OCP Microscaling (MX) formats: element codecs, block scaling, bit packing, MXTensor, checkpoint files.

``import accel.formats`` needs no torch: ``accel.formats.torch_ops`` (MXLinear, torch quantize/dequantize) and
``accel.formats.compress`` (``accel.compress``, ``accel.save_compressed``, ``accel.load_compressed``) import torch and
load on demand.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.formats.codec import decode_elements, encode_elements
from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import ALIASES, FORMATS, ElementFormat, get_format, known_format_names
from accel.formats.mx_tensor import MXTensor, dequantize, quantize
from accel.formats.packing import pack_codes, packed_nbytes, unpack_codes
from accel.formats.scaling import block_scale_codes, scale_codes_from_amax

_LAZY = {
    "save_tensors": "accel.formats.writer",
    "load_tensors": "accel.formats.file",
    "compress_checkpoint": "accel.formats.stream",
    "CompressSettings": "accel.formats.stream",
    "CompressionReport": "accel.formats.report",
    "LayerReport": "accel.formats.report",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "ALIASES",
    "DEFAULT_BLOCK_SIZE",
    "FORMATS",
    "CompressSettings",
    "CompressionReport",
    "ElementFormat",
    "LayerReport",
    "MXTensor",
    "block_scale_codes",
    "compress_checkpoint",
    "decode_elements",
    "dequantize",
    "encode_elements",
    "get_format",
    "known_format_names",
    "load_tensors",
    "pack_codes",
    "packed_nbytes",
    "quantize",
    "save_tensors",
    "scale_codes_from_amax",
    "unpack_codes",
]

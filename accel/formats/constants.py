"""Plain named numbers of the OCP Microscaling (MX) v1.0 spec and of accel's file formats.

Sources: OCP MX v1.0 §5 (block of k = 32 elements, E8M0 scale), docs/reference.md §1.
"""

from __future__ import annotations

#: default block size k of every MX format (OCP MX v1.0 §5.1)
DEFAULT_BLOCK_SIZE = 32

#: largest block size accepted (the spec's k is 32; larger blocks are allowed for experiments)
MAX_BLOCK_SIZE = 1 << 16
#: padding a tensor to whole blocks may add at most this many elements beyond doubling it (else: FormatError)
MAX_PADDING_SLACK = 1 << 20

#: E8M0 scale: unsigned 8-bit exponent, bias 127, 0xFF = NaN, no zero, no Inf (OCP MX v1.0 §5.4.1)
E8M0_BIAS = 127
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
E8M0_NAN = 0xFF

#: magic and version of ``MXTensor.to_bytes``
MX_BYTES_MAGIC = b"ACMX"
MX_BYTES_VERSION = 1

#: suffixes of the two uint8 tensors that hold one MXTensor in a safetensors file
CODES_SUFFIX = ".mx_codes"
SCALES_SUFFIX = ".mx_scales"

#: key of accel's per-tensor metadata in a safetensors ``__metadata__`` header, and its format tag
FILE_FORMAT_KEY = "accel.format"
FILE_FORMAT_TAG = "accel-mx/1"
FILE_TENSORS_KEY = "accel.tensors"
FILE_TIED_KEY = "accel.tied"

#: bytes per element of a dense weight in the two reference precisions
BYTES_FP32 = 4
BYTES_FP16 = 2

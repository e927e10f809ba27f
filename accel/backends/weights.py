"""How ``export_onnx`` stores a decoder's weights: ``WeightFormat`` and the full ``ExportWeights`` spec (no torch).

- ``fp32`` / ``fp16``: every weight as float32 / float16 (fp16 is cast to float32 in the graph; compute stays fp32).
- ``mx-rounded``: Linear weights quantized to the MX element format and dequantized back to float32 -- the values an
  MX compiler (``qaic-exec -mxfp6-matmul``) reproduces; same file size as fp32.
- ``mx-packed``: Linear weights as packed MX codes + E8M0 scales (uint8) decoded in the graph with standard ops.
- ``int8``: for drafts; onnxruntime's dynamic int8 quantization of the float graph's weight MatMuls (approximate),
  stored so that every x86 CPU computes the same integers (``ExportWeights.int8_scheme``).
- ``mxint8-nbits``, ``mxfp6-nbits``, ``mxfp4-nbits``: every Linear (and the head) in MXINT8 / MXFP6 (E2M3) / MXFP4
  (E2M1) as onnxruntime's 8-bit ``MatMulNBits``: an MX block of these three element types is exactly an 8-bit
  integer block with a power-of-two scale, so the weights are exact; the activations are quantized to int8 per block
  (``accuracy_level=4``) or kept float32 (``accuracy_level=1``, slow); onnxruntime only.
- ``mxint8-kernel``, ``mxfp6-kernel``, ``mxfp4-kernel``: the same exact MX weights (and head), stored packed (8 / 6 /
  4 bits a weight + one E8M0 byte a block) and run by accel's fused kernel as the onnxruntime custom operator
  ``ai.accel::MXLinear`` (``accel/formats/mxkernel_ort.c``): float32 activations, weights decoded in registers;
  onnxruntime only, with the kernel built on this machine (a C compiler).
- ``mxfp6-kernel-q8``, ``mxfp4-kernel-q8``: the same packed weights with the activations quantized to int8 per block
  of 32 (llama.cpp's Q8_0 scheme) and integer dot products per block (``accel.formats.mxkernel_q8``): exact weights,
  approximate activations; bit-identical results on every x86 path (portable, AVX2, AVX-512 VNNI).
- ``gguf-kernel``: a ``.gguf`` file's Linear weights (and head) as the file stores them: its ``Q8_0``, ``Q4_0`` and
  ``Q4_1`` blocks (and ``Q2_K`` to ``Q6_K``, ``Q5_0``, ``Q5_1`` repacked exactly) run by the same fused kernel
  (``accel.formats.ggml``: llama.cpp's exact values, float32 activations); tensors of other types dequantized to
  float32. Exports from a ``.gguf`` path only.
- ``gguf-kernel-q8``: the same blocks with the activations quantized to int8 per block of 32 and integer dot products
  per block, as llama.cpp multiplies them (``GGMLKernel.matmul_q8``), every block type ``gguf-kernel`` runs. Exports
  from a ``.gguf`` path only.

docs/backends.md describes each in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from accel.errors import BackendError

__all__ = ["INT8_SCHEMES", "NBITS_ACCURACY_LEVELS", "WEIGHT_MODES", "ExportWeights", "Int8Scheme", "WeightFormat"]


class WeightFormat(str, Enum):
    """The weight storage of an exported graph (the value is the CLI's ``--weights`` name)."""

    FP32 = "fp32"
    FP16 = "fp16"
    MX_ROUNDED = "mx-rounded"
    MX_PACKED = "mx-packed"
    INT8 = "int8"
    MXINT8_NBITS = "mxint8-nbits"
    MXFP6_NBITS = "mxfp6-nbits"
    MXFP4_NBITS = "mxfp4-nbits"
    MXINT8_KERNEL = "mxint8-kernel"
    MXFP6_KERNEL = "mxfp6-kernel"
    MXFP4_KERNEL = "mxfp4-kernel"
    MXFP6_KERNEL_Q8 = "mxfp6-kernel-q8"
    MXFP4_KERNEL_Q8 = "mxfp4-kernel-q8"
    GGUF_KERNEL = "gguf-kernel"
    GGUF_KERNEL_Q8 = "gguf-kernel-q8"

    @property
    def uses_mx_format(self) -> bool:
        """Whether ``ExportWeights.mx_format`` chooses the element format (the MX modes that take any format)."""
        return self in (WeightFormat.MX_ROUNDED, WeightFormat.MX_PACKED)

    @property
    def is_nbits(self) -> bool:
        """Whether the graph runs its Linear weights as onnxruntime ``MatMulNBits`` (the ``*-nbits`` formats)."""
        return self.value.endswith("-nbits")

    @property
    def is_kernel(self) -> bool:
        """Whether the graph runs its Linear weights on accel's fused kernel (``ai.accel::MXLinear``, ``*-kernel``)."""
        return self.value.endswith(("-kernel", "-kernel-q8"))

    @property
    def int8_activations(self) -> bool:
        """Whether the Linear activations are quantized to int8 per block (``*-nbits`` at their default accuracy
        level 4, ``*-kernel-q8``): a float difference of one ulp can move a code, so a call's logits must not depend
        on the call's layout (``accel.decode`` refuses token trees on such targets)."""
        return self.is_nbits or self.value.endswith("-q8")

    @property
    def is_gguf(self) -> bool:
        """Whether the graph runs a ``.gguf`` file's own blocks (``gguf-kernel``, ``gguf-kernel-q8``)."""
        return self.value.startswith("gguf-")

    @property
    def kernel_act_bits(self) -> int:
        """The fused kernel's activations: 0 (not a ``*-kernel`` format), 32 (float32) or 8 (``*-kernel-q8``: int8
        per block of 32, integer dot products; ``accel.formats.mxkernel_q8``)."""
        return 8 if self.value.endswith("-q8") else 32 if self.is_kernel else 0

    @property
    def runs_codes(self) -> bool:
        """Whether every Linear weight and the head run from their exact MX codes (``*-nbits`` and ``*-kernel``)."""
        return self.is_nbits or self.is_kernel

    @property
    def element_format(self) -> str | None:
        """The MX element format a ``*-nbits`` or ``*-kernel`` format fixes (``mxint8``, ``mxfp6_e2m3``,
        ``mxfp4_e2m1``); None for the others (``gguf-kernel``: the file's own block types)."""
        if not self.runs_codes or self.is_gguf:
            return None
        return {"mxint8": "mxint8", "mxfp6": "mxfp6_e2m3", "mxfp4": "mxfp4_e2m1"}[self.value.split("-")[0]]


WEIGHT_MODES: tuple[str, ...] = tuple(f.value for f in WeightFormat)
FloatStorage = Literal["fp32", "fp16"]
#: onnxruntime ``MatMulNBits`` activation modes accel supports: 4 = int8 activations quantized per block (fast,
#: approximate), 1 = float32 activations (the weights dequantized on every call: exact, slow)
NBITS_ACCURACY_LEVELS = (1, 4)
#: how ``int8`` weights are stored (``accel.backends.onnx_int8``): ``u8u8`` (exact on every x86 CPU, default),
#: ``u8s7`` (7-bit int8 codes: exact everywhere, int8 kernels), ``u8s8`` (full-range int8: exact on VNNI CPUs only)
Int8Scheme = Literal["u8u8", "u8s7", "u8s8"]
INT8_SCHEMES: tuple[str, ...] = ("u8u8", "u8s7", "u8s8")


@dataclass(frozen=True)
class ExportWeights:
    """Weight storage of one export.

    Attributes:
        format: the ``WeightFormat``.
        mx_format: element format (``mxfp6``, ``mxfp4``, ...) for ``mx-rounded`` / ``mx-packed`` when the model is
            not already compressed (a compressed model keeps its own formats).
        float_storage: storage of the tensors that stay float in ``mx-rounded`` / ``mx-packed`` (embeddings, norms,
            biases, ``lm_head``): ``fp32`` (logits equal the ``accel.compress``-ed torch model's) or ``fp16``.
        accuracy_level: ``MatMulNBits``' activation mode for the ``*-nbits`` formats: 4 (int8 activations quantized
            per block of 32, default) or 1 (float32 activations).
        int8_scheme: how ``int8`` weights are stored: ``u8u8`` (default: uint8 codes + 128, the same integers on
            every x86 CPU), ``u8s7`` (7-bit int8 codes) or ``u8s8`` (full-range int8 codes, which CPUs without VNNI
            compute with a saturating int16 sum: for comparisons only); see ``accel.backends.onnx_int8``.
    """

    format: WeightFormat = WeightFormat.FP32
    mx_format: str = "mxfp6"
    float_storage: FloatStorage = "fp32"
    accuracy_level: int = 4
    int8_scheme: Int8Scheme = "u8u8"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "format", WeightFormat(self.format))
        except ValueError:
            raise BackendError(
                f"weights={self.format!r} is not supported; supported: {', '.join(WEIGHT_MODES)}"
            ) from None
        if self.float_storage not in ("fp32", "fp16"):
            raise BackendError(f"float_storage={self.float_storage!r} is not supported; supported: fp32, fp16")
        if self.float_storage != "fp32" and not self.format.uses_mx_format:
            raise BackendError(
                f"float_storage applies to mx-rounded / mx-packed only; for {self.format.value} use "
                f"weights={self.float_storage!r} or keep float_storage='fp32'"
            )
        if isinstance(self.accuracy_level, bool) or self.accuracy_level not in NBITS_ACCURACY_LEVELS:
            raise BackendError(
                f"accuracy_level={self.accuracy_level!r} is not supported; supported: {NBITS_ACCURACY_LEVELS} "
                "(4: int8 activations, 1: float32 activations)"
            )
        if self.accuracy_level != 4 and not self.format.is_nbits:
            raise BackendError(f"accuracy_level applies to the *-nbits formats only, not {self.format.value}")
        if self.int8_scheme not in INT8_SCHEMES:
            raise BackendError(
                f"int8_scheme={self.int8_scheme!r} is not supported; supported: {', '.join(INT8_SCHEMES)}"
            )
        if self.int8_scheme != "u8u8" and self.format != WeightFormat.INT8:
            raise BackendError(f"int8_scheme applies to weights='int8' only, not {self.format.value}")

    @classmethod
    def of(cls, weights: ExportWeights | WeightFormat | str) -> ExportWeights:
        """``weights`` as an ``ExportWeights`` (a format or its name gets the default MX format and fp32 floats)."""
        if isinstance(weights, ExportWeights):
            return weights
        if not isinstance(weights, (str, WeightFormat)):
            raise BackendError(f"weights must be an ExportWeights, a WeightFormat or one of {', '.join(WEIGHT_MODES)}")
        return cls(format=WeightFormat(weights) if weights in WEIGHT_MODES else weights)  # type: ignore[arg-type]

    @property
    def float_dtype(self) -> FloatStorage:
        """Storage of every float tensor in the graph."""
        return "fp16" if WeightFormat.FP16 == self.format or self.float_storage == "fp16" else "fp32"

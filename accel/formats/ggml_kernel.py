"""llama.cpp's GGUF blocks on the fused kernel: ``GGMLKernel`` multiplies activations by a ``GGMLTensor`` as stored.

``GGMLKernel(t).matmul(x)`` computes ``x @ W.T`` for a weight W ``[N, K]`` in ``Q8_0``, ``Q4_0`` or ``Q4_1`` blocks
(``accel.formats.ggml``), reading only the code and scale planes (8.5, 4.5 or 5 bits a weight): the C kernel of
``accel.formats.mxkernel`` (format codes 4, 5, 6) decodes each block in registers and never writes the weights out.

What is exact: every weight the kernel multiplies equals ``t.dequantize()`` bit for bit (the float16 scales converted
exactly, subnormal halves, infinities and NaN included; ``Q4_1``'s ``d * q + m`` rounded once, as numpy and the
``gguf`` package do); ``GGMLKernel.decode()`` returns them. The products with the float32 activations are summed in
float32 in a fixed order (8-lane partial sums on the AVX2 path, one running sum on the portable path), so ``matmul``
matches the float64 product of the exact weights to float32 rounding: ``|y - y64| <= K * 2^-23 * (|x| @ |W|.T)``.
Each output row is computed by the same operation sequence whatever the number of activation rows and threads.

Where the kernel cannot be built (or ``ACCEL_MXKERNEL=numpy``) the numpy path gives the same weights
(``t.dequantize()``) with a numpy float32 matmul (BLAS's summation order).

With int8 activations (as llama.cpp multiplies its types): ``matmul_q8`` on the stored blocks
(``accel.formats.mxkernel_q8.reference_q8_ggml``) and ``matmul_q8_x16`` on the blocks interleaved 16 rows at a time
(``accel.formats.ggml_x16``; what ``gguf-kernel-q8`` graphs run), each bit for bit equal to its numpy reference.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError
from accel.formats.ggml import BLOCK, GGMLTensor
from accel.formats.ggml_x16 import interleave16, reference_q8_x16
from accel.formats.mxkernel import MIN_WEIGHTS_PER_THREAD, KernelWeight, default_threads
from accel.formats.mxkernel_build import load_kernel
from accel.formats.mxkernel_q8 import linear_q8_call, reference_q8_ggml

__all__ = ["GGMLKernel"]


class GGMLKernel(KernelWeight):
    """A GGUF-block weight ``[N, K]`` kept as stored, for ``matmul`` by the fused kernel (or the numpy path).

    Args:
        t: the ``GGMLTensor`` (``Q8_0``, ``Q4_0`` or ``Q4_1``); its planes are referenced (copied only if not
            C-contiguous).
        use_kernel: False forces the numpy path (default: the kernel when it loads).
    """

    def __init__(self, t: GGMLTensor, use_kernel: bool = True) -> None:
        if not isinstance(t, GGMLTensor):
            raise FormatError(f"GGMLKernel needs a GGMLTensor, got {type(t).__name__}")
        self.tensor = t
        self.out_features, self.in_features = t.shape
        self._codes = np.ascontiguousarray(t.codes)
        self._scales = np.ascontiguousarray(t.scales)
        self._lib = load_kernel() if use_kernel else None
        self._dense: np.ndarray | None = None
        self._x16: tuple[np.ndarray, np.ndarray] | None = None  # the interleaved planes, made on first use
        # the weight's pointers, taken once (numpy's .ctypes attribute costs microseconds a call)
        self._ptrs = (self._codes.ctypes.data, self._scales.ctypes.data)
        self._auto_threads = max(
            1, min(default_threads(), self.out_features * self.in_features // MIN_WEIGHTS_PER_THREAD)
        )

    @property
    def kernel_path(self) -> str:
        """Which code runs ``matmul``: ``"avx512"`` (AVX-512F), ``"avx2"``, ``"portable"`` (C loop) or ``"numpy"``."""
        if self._lib is None:
            return "numpy"
        return ("portable", "avx2", "avx512")[self._lib.mxk_fast_path(self.tensor.qtype.fast, BLOCK)]

    @property
    def nbytes(self) -> int:
        """Bytes the kernel streams per call: codes + scales (the GGUF blocks' own size)."""
        return self.tensor.nbytes

    def _dequantize(self) -> np.ndarray:
        return self.tensor.dequantize(np.float32)

    def decode(self, threads: int | None = None) -> np.ndarray:
        """Every weight, float32 ``[N, K]``, bit-exact to ``tensor.dequantize()`` (NaN where a scale is NaN or an
        infinite ``d`` meets a zero code)."""
        nthreads = self._threads(threads)
        if self._lib is None:
            return self.tensor.dequantize(np.float32)
        out = np.empty((self.out_features, self.in_features), np.float32)
        rc = self._lib.mxk_decode_ggml(
            *self._ptrs,
            self.tensor.qtype.fast,
            self.out_features,
            self.tensor.nblocks,
            out.ctypes.data,
            nthreads,
        )
        if rc != 0:
            raise FormatError(f"the kernel refused to decode {self.tensor.qtype.name} blocks (code {rc})")
        return out

    def matmul(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """``x @ W.T``: float32 activations ``[..., K]`` (``[S, K]`` or ``[K]``) -> float32 ``[..., N]`` (the module
        docstring: exact weights, float32 sums in a fixed order). ``threads``: kernel threads (default: 1 for small
        weights, else ``default_threads``)."""
        x, lead, rows = self._activations(x)
        nthreads = self._threads(threads)
        if self._lib is None:
            return self._numpy_matmul(x, lead, rows)
        x2 = np.ascontiguousarray(x.reshape(rows, self.in_features))
        y = np.empty((rows, self.out_features), np.float32)
        q = self.tensor.qtype
        rc = self._lib.mxk_linear(
            *self._ptrs,
            None,  # no value table: the blocks carry their float16 scales
            q.bits,
            BLOCK,
            q.fast,
            self.out_features,
            self.in_features,
            self.tensor.nblocks,
            x2.ctypes.data,
            rows,
            self.in_features,
            y.ctypes.data,
            nthreads,
        )
        if rc != 0:
            raise FormatError(f"the kernel refused {q.name} blocks of shape {self.tensor.shape} (code {rc})")
        return y.reshape(*lead, self.out_features)

    def matmul_q8(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """``x @ W.T`` with ``x`` quantized per block of 32 to int8 and integer dot products per block, as llama.cpp
        multiplies its quantized types (``accel.formats.mxkernel_q8``): float32 ``[..., K]`` -> float32 ``[..., N]``,
        equal bit for bit to ``reference_q8_ggml`` (the numpy reference itself where the kernel is not built), for
        every block layout."""
        q = self.tensor.qtype
        x, lead, rows = self._activations(x)
        if self._lib is None:
            return reference_q8_ggml(self.tensor, x.reshape(rows, self.in_features)).reshape(*lead, self.out_features)
        x2 = np.ascontiguousarray(x.reshape(rows, self.in_features))
        y = linear_q8_call(
            self._lib, self._ptrs, q.fast, self.out_features, self.tensor.nblocks, x2, self._threads(threads)
        )
        return y.reshape(*lead, self.out_features)

    def matmul_q8_x16(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """``matmul_q8`` on the weight's blocks interleaved 16 rows at a time (``accel.formats.ggml_x16``, every
        layout; what ``gguf-kernel-q8`` graphs run): float32 ``[..., K]`` -> float32 ``[..., N]``, equal bit for bit
        to ``reference_q8_x16`` (the numpy reference itself where the kernel is not built), and to ``matmul_q8`` to
        float32 rounding. The interleaved planes (the blocks' own bytes, rearranged; as large as the stored ones) are
        made on the first call and kept."""
        x, lead, rows = self._activations(x)
        x2 = np.ascontiguousarray(x.reshape(rows, self.in_features))
        if self._lib is None:
            return reference_q8_x16(self.tensor, x2).reshape(*lead, self.out_features)
        if self._x16 is None:
            self._x16 = interleave16(self.tensor)
        planes = (self._x16[0].ctypes.data, self._x16[1].ctypes.data)
        fast, nblocks = self.tensor.qtype.fast, self.tensor.nblocks
        threads_n = self._threads(threads)
        y = linear_q8_call(self._lib, planes, fast, self.out_features, nblocks, x2, threads_n, interleaved=True)
        return y.reshape(*lead, self.out_features)

"""The fused MX kernel from Python: ``PackedMX`` keeps an MX weight packed and multiplies activations by it.

``PackedMX(w).matmul(x)`` computes ``x @ W.T`` for an MX weight W of shape [N, K] blocked along K (the layout of a
Linear weight, ``accel.formats.MXTensor`` with ``axis=1``), reading only the packed codes (6.25 bits a weight for
MXFP6, 4.25 for MXFP4) and the E8M0 scales: the weights are decoded in registers, never written to memory.

What is exact: every weight the kernel multiplies equals ``w.dequantize()`` bit for bit (up to the sign of a zero);
``PackedMX.decode()`` returns them (bit-exact, signed zeros included). The products are summed in float32 in a fixed
order (8-lane partial sums), so ``matmul`` matches the float64 product of the exact weights to float32 rounding:
``|y - y64| <= K * 2^-23 * (|x| @ |W|.T)`` (the test's tolerance, a standard bound for a K-term float32 dot product).
Each output row is computed by the same operation sequence whatever the number of activation rows and threads.

The kernel is C (``mxkernel*.c``) compiled on first use (``mxkernel_build``); where that is not possible the numpy
path gives the same weights (``w.dequantize()``, exact) with a numpy matmul, after a one-line notice.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from accel.errors import FormatError
from accel.formats.elements import MXFP4_E2M1, MXFP6_E2M3, MXINT8, ElementFormat
from accel.formats.mx_tensor import MXTensor
from accel.formats.mxkernel_build import kernel_status, load_kernel

__all__ = ["PackedMX", "code_table", "default_threads", "fast_code", "kernel_status", "set_isa"]

#: formats with an AVX2 path (block 32), and the C code of each
_FAST = {MXFP6_E2M3.name: 1, MXFP4_E2M1.name: 2, MXINT8.name: 3}


def fast_code(fmt: ElementFormat) -> int:
    """The kernel's code of ``fmt``'s SIMD paths (1 E2M3, 2 E2M1, 3 INT8); 0 for formats only the portable path runs."""
    return _FAST.get(fmt.name, 0)


def code_table(fmt: ElementFormat) -> np.ndarray:
    """The kernel's 256-entry float32 table of ``fmt``'s code values (zero past ``2**fmt.bits``; the portable path
    reads it)."""
    lut = np.zeros(256, np.float32)
    lut[: 1 << fmt.bits] = fmt.code_values()
    return lut


#: weights per thread below which a call stays on one thread (a thread start costs ~20 us)
MIN_WEIGHTS_PER_THREAD = 1 << 18


def set_isa(level: int, *, avx_vnni: bool = True) -> None:
    """The highest kernel path to use from now on (process-wide): 3 = the best the CPU has (default), 2 = AVX-512 but
    the int8-activation path (``accel.formats.mxkernel_q8``) without VBMI's unpacking, 1 = AVX2 at most, 0 = the
    portable C loop only. ``avx_vnni``: the int8-activation AVX2 code uses AVX-VNNI's ``vpdpbusd`` where the CPU has
    it (the default), else ``vpmaddubsw`` + ``vpmaddwd`` (the same integers). Tests and benchmarks use it to check and
    compare the paths."""
    lib = load_kernel()
    if lib is not None:
        lib.mxk_set_isa(int(level))
        lib.mxk_set_avxvnni(int(bool(avx_vnni)))


def call_threads(threads: int | None, auto: int) -> int:
    """The kernel threads of one call: ``threads`` (an int >= 1, at most 16; FormatError otherwise) or ``auto``."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise FormatError(f"threads must be an int >= 1, got {threads!r}")
        return min(threads, 16)
    return auto


def default_threads() -> int:
    """Threads a large call uses: ``$ACCEL_MXKERNEL_THREADS`` or the CPUs this process may run on (at most 16)."""
    env = os.environ.get("ACCEL_MXKERNEL_THREADS")
    if env:
        try:
            return max(1, min(16, int(env)))
        except ValueError:
            raise FormatError(f"ACCEL_MXKERNEL_THREADS must be an int, got {env!r}") from None
    return max(1, min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class KernelWeight:
    """What ``PackedMX`` and ``accel.formats.ggml_kernel.GGMLKernel`` share: the library (``_lib``, None on the numpy
    path) and the default thread count of a call (``_auto_threads``), set by the subclass."""

    _lib: ctypes.CDLL | None
    _auto_threads: int

    @property
    def uses_kernel(self) -> bool:
        """True when calls run the compiled kernel, False on the numpy path."""
        return self._lib is not None

    @property
    def auto_threads(self) -> int:
        """Threads a call uses by default: 1 below ``MIN_WEIGHTS_PER_THREAD`` weights a thread, else up to
        ``default_threads()``."""
        return self._auto_threads

    def _threads(self, threads: int | None) -> int:
        return call_threads(threads, self._auto_threads)

    # set by the subclass: the weight's shape and its lazily decoded float32 copy (the numpy path)
    in_features: int
    out_features: int
    _dense: np.ndarray | None

    def _dequantize(self) -> np.ndarray:
        """Every weight, float32 ``[N, K]`` (the subclass's exact decode)."""
        raise NotImplementedError

    def _activations(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...], int]:
        """``x`` checked as float32 activations ``[..., K]`` (FormatError otherwise), its leading shape and rows."""
        if not isinstance(x, np.ndarray):
            x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim == 0 or x.shape[-1] != self.in_features:
            raise FormatError(f"matmul needs float32 activations [..., {self.in_features}], got {x.dtype} {x.shape}")
        lead = x.shape[:-1]
        rows = x.size // self.in_features if self.in_features else int(np.prod(lead, dtype=np.int64))
        return x, lead, rows

    def _numpy_matmul(self, x: np.ndarray, lead: tuple[int, ...], rows: int) -> np.ndarray:
        """``x @ W.T`` with numpy on the exact weights (decoded once, kept): the path without the kernel."""
        if self._dense is None:
            self._dense = self._dequantize()
        return (x.reshape(rows, self.in_features) @ self._dense.T).reshape(*lead, self.out_features)


class PackedMX(KernelWeight):
    """An MX weight [N, K] (blocked along K) kept packed, for ``matmul`` by the fused kernel (or the numpy path).

    Args:
        weight: the MXTensor (2-D, ``axis=1``); its arrays are referenced, not copied.
        use_kernel: False forces the numpy path (default: the kernel when it loads).
    """

    def __init__(self, weight: MXTensor, use_kernel: bool = True) -> None:
        if not isinstance(weight, MXTensor):
            raise FormatError(f"PackedMX needs an MXTensor, got {type(weight).__name__}")
        if len(weight.shape) != 2 or weight.axis != 1:
            raise FormatError(
                f"PackedMX needs a 2-D weight blocked along axis 1, got shape {weight.shape} axis {weight.axis}"
            )
        self.weight = weight
        self.out_features, self.in_features = weight.shape
        self._width = weight.nblocks * weight.block_size  # padded K
        self._lut = code_table(weight.fmt)
        self._fast = fast_code(weight.fmt)
        self._lib = load_kernel() if use_kernel else None
        self._dense: np.ndarray | None = None
        # the weight's half of the C call, built once (numpy's .ctypes attribute costs microseconds a call)
        self._ptrs = (
            weight.codes.ctypes.data,
            weight.scales.ctypes.data,
            self._lut.ctypes.data,
            weight.fmt.bits,
            weight.block_size,
        )
        self._auto_threads = max(1, min(default_threads(), self.out_features * self._width // MIN_WEIGHTS_PER_THREAD))

    @property
    def kernel_path(self) -> str:
        """Which code runs ``matmul``: ``"avx512-vbmi"``, ``"avx2"``, ``"portable"`` (C loop) or ``"numpy"``."""
        if self._lib is None:
            return "numpy"
        return ("portable", "avx2", "avx512-vbmi")[self._lib.mxk_fast_path(self._fast, self.weight.block_size)]

    @property
    def nbytes(self) -> int:
        """Bytes the kernel streams per call: packed codes + scales."""
        return self.weight.nbytes

    def _dequantize(self) -> np.ndarray:
        return self.weight.dequantize(np.float32)

    def decode(self, threads: int | None = None) -> np.ndarray:
        """Every weight, float32 [N, K], bit-exact to ``weight.dequantize()`` (signed zeros and NaN blocks too)."""
        w, nthreads = self.weight, self._threads(threads)
        if self._lib is None:
            return w.dequantize(np.float32)
        out = np.empty((self.out_features, self._width), np.float32)
        self._lib.mxk_decode(*self._ptrs, self.out_features, w.nblocks, out.ctypes.data, nthreads)
        return out[:, : self.in_features] if self._width != self.in_features else out

    def matmul(self, x: np.ndarray, threads: int | None = None) -> np.ndarray:
        """``x @ W.T``: float32 activations ``[..., K]`` -> float32 ``[..., N]`` (see the module docstring: exact
        weights, float32 sums). ``threads``: kernel threads (default: 1 for small weights, else ``default_threads``)."""
        x, lead, rows = self._activations(x)
        nthreads = self._threads(threads)
        if self._lib is None:
            return self._numpy_matmul(x, lead, rows)
        if self._width == self.in_features and x.flags.c_contiguous:
            x2 = x.reshape(rows, self._width)
        else:  # zero-padded to whole blocks: the padding codes then add exact zeros
            x2 = np.zeros((rows, self._width), np.float32)
            x2[:, : self.in_features] = x.reshape(rows, self.in_features)
        y = np.empty((rows, self.out_features), np.float32)
        bits, block = self._ptrs[3:]
        self._lib.mxk_linear(
            *self._ptrs[:3],
            bits,
            block,
            self._fast,
            self.out_features,
            self.in_features,
            self.weight.nblocks,
            x2.ctypes.data,
            rows,
            self._width,
            y.ctypes.data,
            nthreads,
        )
        return y.reshape(*lead, self.out_features)

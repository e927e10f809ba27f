"""Build and load the fused MX kernel (``mxkernel*.c``): compiled on first use with the system C compiler, cached.

The C sources ship inside the package: ``mxkernel.h`` (what the files share) and ``mxkernel.c`` (the API, the path
dispatch, the thread pool), ``mxkernel_portable.c``, ``mxkernel_avx2.c``, ``mxkernel_vbmi.c`` (one file per path),
``mxkernel_q8.c``, ``mxkernel_gq8.c`` and ``mxkernel_gx16.c`` (int8 activations, integer dot products: MX blocks,
GGUF blocks as stored and GGUF blocks interleaved 16 rows at a time) and
``mxkernel_ort.c`` (the onnxruntime operator ``ai.accel::MXLinear``, registered by ``accel.backends.onnx_mxlinear``),
compiled together into one library. On the first call the library is compiled with ``$CC`` (else ``cc``, else
``gcc``) into ``$ACCEL_CACHE/mxkernel/`` (``ACCEL_CACHE`` defaults to ``~/.cache/accel``) under a name that hashes the
sources, the compiler and the platform, written to a temporary file and renamed into place (safe when several processes
build at once), then loaded with ctypes. Later processes load the cached file (a few milliseconds).

``ACCEL_MXKERNEL=numpy`` skips the kernel (the numpy path is used). When no compiler is found or the build or load
fails, ``load_kernel`` returns None and prints one line to stderr saying why; callers then use the numpy path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).parent
#: the C files compiled together (the API file first) and the header they share
_PARTS = ("", "_portable", "_avx2", "_avx512", "_vbmi", "_q8", "_gq8", "_gx16", "_attn", "_ort")
SOURCES = tuple(_HERE / f"mxkernel{part}.c" for part in _PARTS)
HEADER = _HERE / "mxkernel.h"
#: the C library's ``mxk_version()``; bump both together
VERSION = 9
#: seconds a compile may take before it is given up
BUILD_TIMEOUT_S = 120
_FLAGS = ("-O2", "-std=gnu99", "-shared", "-fPIC", "-pthread")

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_int = ctypes.c_int


@dataclass(frozen=True)
class KernelStatus:
    """Whether the compiled kernel is in use: ``library`` (path of the shared object) or ``reason`` (why not)."""

    available: bool
    library: str | None
    reason: str | None


def cache_dir() -> Path:
    """``$ACCEL_CACHE/mxkernel`` (``ACCEL_CACHE`` defaults to ``~/.cache/accel``)."""
    root = Path(os.environ.get("ACCEL_CACHE") or Path.home() / ".cache" / "accel")
    return root / "mxkernel"


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _library_path(cc: str) -> Path:
    key = hashlib.sha256()
    for path in (HEADER, *SOURCES):
        key.update(path.read_bytes())
    key.update(f"{cc}|{platform.machine()}|{sys.platform}|{' '.join(_FLAGS)}|{VERSION}".encode())
    return cache_dir() / f"mxkernel-{key.hexdigest()[:16]}.so"


def build(cc: str | None = None) -> Path:
    """Compile the kernel's sources into the cache (if not there yet) and return the library's path.

    Raises RuntimeError (with the compiler's message) when no compiler is found or the compile fails."""
    cc = cc or _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc)")
    lib = _library_path(cc)
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        cmd = [cc, *_FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
        _publish(tmp, lib)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"compiling {SOURCES[0].name} took over {BUILD_TIMEOUT_S} s") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _publish(tmp: str, lib: Path) -> None:
    """Put the compiled ``tmp`` at ``lib`` unless another process got there first: a hard link creates the name only
    if it is absent, so a library some process has loaded is never replaced (its mapping would show as deleted, and
    two processes would run two copies). Where links are refused, an atomic replace."""
    try:
        os.link(tmp, lib)
    except FileExistsError:
        pass
    except OSError:
        os.replace(tmp, lib)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.mxk_version.restype = _int
    lib.mxk_version.argtypes = []
    lib.mxk_fast_path.restype = _int
    lib.mxk_fast_path.argtypes = [_int, _int]
    lib.mxk_set_isa.restype = None
    lib.mxk_set_isa.argtypes = [_int]
    lib.mxk_set_avxvnni.restype = None
    lib.mxk_set_avxvnni.argtypes = [_int]
    lib.mxk_avxvnni.restype = _int
    lib.mxk_avxvnni.argtypes = []
    lib.mxk_decode.restype = _int
    lib.mxk_decode.argtypes = [_p, _p, _p, _int, _int, _i64, _i64, _p, _int]
    lib.mxk_decode_ggml.restype = _int
    lib.mxk_decode_ggml.argtypes = [_p, _p, _int, _i64, _i64, _p, _int]
    lib.mxk_linear.restype = _int
    lib.mxk_linear.argtypes = [_p, _p, _p, _int, _int, _int, _i64, _i64, _i64, _p, _i64, _i64, _p, _int]
    lib.mxk_linear_q8.restype = _int
    lib.mxk_linear_q8.argtypes = [_p, _p, _int, _i64, _i64, _p, _i64, _i64, _p, _int]
    lib.mxk_linear_x16.restype = _int
    lib.mxk_linear_x16.argtypes = [_p, _p, _int, _i64, _i64, _p, _i64, _i64, _p, _int]
    lib.mxk_quantize_q8.restype = None
    lib.mxk_quantize_q8.argtypes = [_p, _i64, _i64, _i64, _p, _p]
    lib.mxk_q8_block_sums.restype = None
    lib.mxk_q8_block_sums.argtypes = [_p, _p, _i64, _i64, _int, _p, _p]
    lib.mxk_q8_path.restype = _int
    lib.mxk_q8_path.argtypes = []
    lib.mxk_silu_mul.restype = None
    lib.mxk_silu_mul.argtypes = [_p, _i64, _i64, _p]
    lib.mxk_set_ort_threads.restype = None
    lib.mxk_set_ort_threads.argtypes = [_int]
    lib.mxk_pfor_calls.restype = ctypes.c_long
    lib.mxk_pfor_calls.argtypes = []
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, KernelStatus]:
    if os.environ.get("ACCEL_MXKERNEL", "").lower() == "numpy":
        return None, KernelStatus(False, None, "ACCEL_MXKERNEL=numpy")
    try:
        path = build()
        lib = _declare(ctypes.CDLL(str(path)))
        if lib.mxk_version() != VERSION:
            raise RuntimeError(f"{path} is version {lib.mxk_version()}, expected {VERSION}")
    except (OSError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(
            f"accel: fused MX kernel unavailable ({reason}); using the numpy path (same weights, slower)",
            file=sys.stderr,
        )
        return None, KernelStatus(False, None, reason)
    return lib, KernelStatus(True, str(path), None)


def load_kernel() -> ctypes.CDLL | None:
    """The loaded kernel library, or None (numpy path; the reason is printed once and in ``kernel_status()``)."""
    return _load()[0]


def kernel_status() -> KernelStatus:
    """Whether the compiled kernel is in use, and why not."""
    return _load()[1]


def reset() -> None:
    """Forget the loaded state (the next ``load_kernel`` reads ``ACCEL_MXKERNEL`` again; tests use it)."""
    _load.cache_clear()

"""onnxruntime sessions for ``OrtBackend``: the session options, and an optional cache of optimized graphs.

Creating a session optimizes the graph each time (``ORT_ENABLE_ALL``: constant folding, fusions); for graphs that
decode their weights in the graph (``mx-packed``) the folding decodes every weight and takes most of the creation
time (SmolLM2-135M: ~15 s of ~16 s, benchmarks/session_load.py). With ``optimized_dir`` the first session writes its
optimized graph there (``optimized_model_filepath``, weights as external data) and later sessions open that copy
with the optimizations off. The copy is keyed by the file's path, size and modification time (``.onnx`` and
``.onnx.data``), the onnxruntime version and the CPU (an ``ORT_ENABLE_ALL`` graph may hold kernels chosen for this
machine's instruction set), written under a temporary name and renamed, so a crash leaves no half copy. It takes the
optimized graph's size on disk: about the source's, or the decoded float32 weights for ``mx-packed``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

import onnxruntime as ort

from accel.backends.onnx_mxlinear import check_mx_kernel_graph, register_mx_kernel, uses_mx_kernel_error
from accel.errors import BackendError

__all__ = ["SessionOptions", "configured_session", "open_session", "optimized_key", "session_options"]

_MODEL, _DATA = "model.onnx", "model.onnx.data"


def session_options(
    threads: int | None, spin: bool, optimize: bool = True, profile: str | os.PathLike | None = None
) -> ort.SessionOptions:
    """Session options of an ``OrtBackend``: ``threads`` intra-op threads (None: onnxruntime's choice), idle threads
    spinning or not, graph optimizations all on (``optimize``) or off (a graph optimized already), onnxruntime's
    profiler writing to the file prefix ``profile``."""
    opts = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if profile is not None:
        opts.enable_profiling, opts.profile_file_prefix = True, str(profile)
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BackendError(f"threads must be an int >= 1; got {threads!r}")
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return opts


def _cpu() -> str:
    """This machine's processor model and instruction-set flags (what onnxruntime's kernel choice depends on)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in info if line.startswith(("model name", "flags", "Features"))]
    return platform.machine() + "\n".join(dict.fromkeys(keep))  # one line of each kind


def optimized_key(path: Path, providers: list[str]) -> str:
    """The cache key of ``path``'s optimized graph (hex, 16 characters)."""
    h = hashlib.sha256(f"{path.resolve()}|{ort.__version__}|{','.join(providers)}|{_cpu()}".encode())
    for f in (path, path.with_name(path.name + ".data")):
        if f.is_file():
            st = f.stat()
            h.update(f"|{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


class SessionOptions(TypedDict, total=False):
    """``OrtBackend``'s session settings, given as its keywords: ``threads`` (intra-op threads; None: onnxruntime's
    choice), ``providers`` (default ``["CPUExecutionProvider"]``), ``spin`` (idle threads busy-wait; default off),
    ``profile`` (onnxruntime's profiler file prefix), ``optimized_dir`` (the optimized-graph cache: module docstring).
    """

    threads: int | None
    providers: list[str] | None
    spin: bool
    profile: str | os.PathLike | None
    optimized_dir: str | os.PathLike | None


def configured_session(path: Path, options: Mapping[str, Any]) -> ort.InferenceSession:
    """``open_session`` of ``path`` with the ``SessionOptions`` ``options`` (defaults filled in); BackendError naming
    an unknown setting."""
    unknown = sorted(set(options) - set(SessionOptions.__annotations__))
    if unknown:
        raise BackendError(
            f"OrtBackend got unknown keyword(s) {', '.join(unknown)}; session settings: "
            f"{', '.join(SessionOptions.__annotations__)}"
        )
    return open_session(
        path,
        threads=options.get("threads"),
        spin=bool(options.get("spin", False)),
        providers=options.get("providers") or ["CPUExecutionProvider"],
        optimized_dir=options.get("optimized_dir"),
        profile=options.get("profile"),
    )


def open_session(
    path: Path,
    *,
    threads: int | None,
    spin: bool,
    providers: list[str],
    optimized_dir: str | os.PathLike | None = None,
    profile: str | os.PathLike | None = None,
) -> ort.InferenceSession:
    """An ``InferenceSession`` of ``path`` (module docstring); BackendError when onnxruntime cannot load it.
    ``profile``: onnxruntime's profiler file prefix (``OrtBackend``)."""
    if optimized_dir is None:
        return _session(path, session_options(threads, spin, profile=profile), providers)
    cached = Path(optimized_dir) / f"{path.stem}-{optimized_key(path, providers)}"
    if (cached / _MODEL).is_file():
        return _session(cached / _MODEL, session_options(threads, spin, False, profile), providers)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{cached.name}."))
    opts = session_options(threads, spin, profile=profile)
    opts.optimized_model_filepath = str(tmp / _MODEL)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", _DATA)
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        session = _session(path, opts, providers)
    except BackendError:  # perhaps only the saving failed: open without it (raising the real problem, if any)
        shutil.rmtree(tmp, ignore_errors=True)
        return _session(path, session_options(threads, spin, profile=profile), providers)
    try:
        if (tmp / _MODEL).is_file():
            tmp.chmod(0o755)  # mkdtemp creates 0700
            os.replace(tmp, cached)
    except OSError:  # no room or rights for the copy, or another process wrote it first: the session is fine
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return session


def _session(path: Path, opts: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """The session; a graph with accel's fused-kernel operators (``ai.accel::MXLinear``, the ``*-kernel`` weights)
    is opened again with the kernel library registered, its calls on the session's intra-op threads."""
    try:
        return ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:
        if not uses_mx_kernel_error(exc):
            raise BackendError(f"onnxruntime cannot load {path}: {exc}") from exc
    check_mx_kernel_graph(path)  # a kernel graph accel did not write is refused, not run with other numbers
    register_mx_kernel(opts, opts.intra_op_num_threads or None)
    try:
        return ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:
        raise BackendError(f"onnxruntime cannot load {path}: {exc}") from exc

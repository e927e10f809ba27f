"""Shared by the benchmarks: the ``run`` block every results JSON carries, and an atomic JSON writer.

The benchmarks are scripts (``python benchmarks/X.py``), so Python puts this folder on ``sys.path`` and they import
this module by its bare name, as they import ``spd_support``. It needs only the standard library.

Every results JSON is an object whose ``"run"`` key holds (:func:`run_metadata`)::

    {"date_utc": "2026-11-25T04:30:00Z",             the start of the run (when the script imported this module)
     "wall_s": 812.4,                                 seconds from that start to the writing of the file
     "command": "python benchmarks/formats.py --no-smollm",   the script and its arguments, to re-run it
     "machine": {"cpu": "AMD EPYC 9R14", "cpus": 2, "platform": "Linux-6.8.0-...-x86_64-with-glibc2.39"},
     "versions": {"python": "3.12.3", "numpy": "2.3.1", "onnxruntime": "1.32.0", "torch": "2.13.0"}}

``cpu`` is the ``model name`` of ``/proc/cpuinfo`` where there is one (else ``platform.processor()`` or the
architecture); ``cpus`` is ``os.cpu_count()``; a package that is not installed has version ``null``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

#: the repository root (commands are recorded relative to it)
ROOT = Path(__file__).resolve().parents[1]
#: the start of the run: the wall clock and perf_counter when the benchmark script imported this module
_START = (datetime.now(timezone.utc), time.perf_counter())
#: the packages whose versions a run records (installed distributions; none is imported for it)
VERSIONED = ("numpy", "onnxruntime", "torch")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from ``cpuinfo`` (Linux), else ``platform.processor()``, else the architecture."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (the imported module's ``__version__`` when it is loaded
    already), or None when it is not installed."""
    version = getattr(sys.modules.get(name), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def command_line(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """``python <script> <args>``: the script relative to the repository root, the arguments ``argv`` (default
    ``sys.argv[1:]``), quoted for a POSIX shell."""
    path = Path(script).resolve()
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return shlex.join(["python", name, *(sys.argv[1:] if argv is None else argv)])


def run_metadata(script: str | Path, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``run`` block of a results JSON (module docstring): date, duration, command, machine and versions."""
    started, t0 = _START
    return {
        "date_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": command_line(script, argv),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": {"python": platform.python_version(), **{n: package_version(n) for n in VERSIONED}},
    }


def _not_a_file_path(path: Path) -> str | None:
    """Why ``path`` cannot take a file (a directory there, or a file where a parent directory must go), or None."""
    if path.is_dir():
        return f"{path} is a directory; name a JSON file, e.g. {path / 'results.json'}"
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a directory: cannot write {path}"
    return None


def json_out(value: str) -> Path:
    """argparse ``type=`` of an ``--out`` option: the path, refused at once (not after the run) where it cannot take
    a file."""
    path = Path(value)
    problem = _not_a_file_path(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def write_json(path: str | Path, data: Any, *, default: Callable[[Any], Any] | None = None) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically and return the path.

    The parent directory is created. The JSON goes to a temporary file in the same directory, which is renamed over
    ``path`` only once it is complete, so ``path`` holds either its old content or the whole new file, never a part
    (an error or interrupt while writing removes the temporary file and leaves ``path`` as it was). ``default`` is
    ``json.dump``'s (None: a value JSON cannot hold raises TypeError). IsADirectoryError (NotADirectoryError) when
    ``path`` is a directory (a parent of it is a file).
    """
    path = Path(path)
    problem = _not_a_file_path(path)
    if problem:
        raise (IsADirectoryError if path.is_dir() else NotADirectoryError)(problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=default)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a results file is as readable as any other
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def save_results(
    path: str | Path,
    data: dict[str, Any],
    script: str | Path,
    argv: Sequence[str] | None = None,
    *,
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """Write a benchmark's results: ``{"run": run_metadata(script, argv), **data}`` by :func:`write_json`
    (ValueError if ``data`` has a ``run`` key of its own)."""
    if "run" in data:
        raise ValueError(f"results for {path} already hold a 'run' key: the run block would replace it")
    return write_json(path, {"run": run_metadata(script, argv), **data}, default=default)

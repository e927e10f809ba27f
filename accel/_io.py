"""Writing outputs: the operating system's refusals as the caller's named error, and nothing half-written left.

Every public function that writes a file or a folder (``save_tensors``, ``compress_checkpoint``, ``save_pretrained``,
``write_qaic_files``, the draft, head and n-gram store writers) goes through these helpers (docs/errors.md,
"Outputs"):

- ``check_output_path`` refuses, before any work, a path that cannot be written: a file target that is a folder, a
  folder target that is a file, a parent that is a file, or a folder where nothing can be created (read-only, a
  pseudo file system such as ``/sys``: probed by creating and removing a temporary file there, since ``os.access``
  says yes to root on those);
- ``writing`` turns an ``OSError`` raised while writing (a full disk, a folder removed under the writer) into the
  caller's ``AccelError`` subclass, one line naming the output, what was being written and the operating system's
  reason;
- ``output_folder`` / ``output_file`` do both and remove, on any failure, the folders they created.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from accel.errors import AccelError

__all__ = ["check_output_path", "output_file", "output_folder", "writing"]


def _reason(exc: OSError, path: Path) -> str:
    """The operating system's reason, with the file it concerns when that is not ``path`` itself."""
    text = exc.strerror or str(exc) or type(exc).__name__
    names = [os.fsdecode(n) for n in (exc.filename, exc.filename2) if n is not None]
    return text if not names or names == [str(path)] else f"{text}: {' -> '.join(names)}"


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet: what creating ``path`` makes."""
    missing = None
    while not path.exists() and path != path.parent:
        missing, path = path, path.parent
    return missing


def check_output_path(path: str | os.PathLike, what: str, error: type[AccelError], *, folder: bool = False) -> Path:
    """``path`` as a ``Path`` when ``what`` (a file, or with ``folder`` a folder) can be written there; else
    ``error``, one line naming the path and why. Nothing is left behind (the write probe removes its file)."""
    out = Path(path)
    if not folder and out.is_dir():
        raise error(f"cannot write {what} to {out}: it is a directory; give a file path")
    if folder and out.exists() and not out.is_dir():
        raise error(f"cannot write {what} to {out}: it exists and is not a directory; give a directory path")
    base = _nearest_existing(out if folder else out.parent)
    if not base.is_dir():
        raise error(f"cannot write {what} to {out}: {base} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".accel-probe-", dir=base)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise error(f"cannot write {what} to {out}: nothing can be created in {base} ({reason})") from exc
    os.close(fd)
    Path(probe).unlink(missing_ok=True)
    return out


@contextmanager
def writing(path: str | os.PathLike, what: str, error: type[AccelError]) -> Iterator[None]:
    """Within the block, an ``OSError`` becomes ``error``: ``cannot write WHAT to PATH: REASON`` (chained)."""
    try:
        yield
    except OSError as exc:
        raise error(f"cannot write {what} to {path}: {_reason(exc, Path(path))}") from exc


@contextmanager
def output_folder(
    path: str | os.PathLike, what: str, error: type[AccelError], files: tuple[str, ...] = ()
) -> Iterator[Path]:
    """The folder ``path`` for ``what``, checked (``check_output_path``; none of the ``files`` it will hold may be a
    folder) and created with its missing parents; an ``OSError`` inside the block is ``error``, and on any failure
    the folders created here are removed with what was written into them (an existing folder is kept: its writer
    replaces each of its files whole)."""
    out = check_output_path(path, what, error, folder=True)
    for name in files:
        if (out / name).is_dir():
            raise error(f"cannot write {what} to {out}: {out / name} is a directory")
    created = _first_missing(out)
    try:
        with writing(out, what, error):
            out.mkdir(parents=True, exist_ok=True)
            yield out
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


@contextmanager
def output_file(path: str | os.PathLike, what: str, error: type[AccelError], *, folder: bool = False) -> Iterator[Path]:
    """The file path ``path`` for ``what`` (with ``folder``, a folder that the block builds as a temporary sibling
    and renames into place), checked and with its missing parent folders created; an ``OSError`` inside the block is
    ``error``, and on any failure the folders created here are removed (the block writes a temporary file or
    folder and renames it, so the target itself is never half-written)."""
    out = check_output_path(path, what, error, folder=folder)
    created = _first_missing(out.parent)
    try:
        with writing(out, what, error):
            out.parent.mkdir(parents=True, exist_ok=True)
            yield out
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise

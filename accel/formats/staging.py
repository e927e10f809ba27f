"""An output folder built beside its target and renamed into place when complete, or left as a resumable partial.

``accel compress`` writes ``OUT`` as ``OUT.accel-partial/`` (a sibling, so the final rename stays on one filesystem)
holding ``ACCEL_PARTIAL.json``: the settings of the run, the source shards it read (size and mtime) and, for each
finished shard, its part of the report. A failure from bad input removes the partial folder (nothing is left on
disk); an interruption (Ctrl-C, SIGTERM, or a SIGKILL that gave no chance to clean up) leaves it, and a later run
either finishes it (``resume=True`` / ``--resume``: finished shards are checked and kept, temp files of the killed
shard dropped) or clears it (``overwrite=True`` / ``--overwrite``). A run with neither refuses to start beside one.
A folder is removed only when accel made it (it holds the marker, or is empty).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from accel._io import check_output_path
from accel.errors import FormatError
from accel.formats.writer import make_temp_file

PARTIAL_SUFFIX = ".accel-partial"
MARKER = "ACCEL_PARTIAL.json"
MARKER_FORMAT = "accel-compress-partial/1"


class PartialState(BaseModel):
    """What ``ACCEL_PARTIAL.json`` records: enough to check that a resumed run continues the same work."""

    format: str = MARKER_FORMAT
    settings: dict[str, Any] = Field(description="the compression settings; a resumed run must use the same")
    sources: dict[str, list[int]] = Field(description="source shard -> [size in bytes, mtime in ns]")
    done: dict[str, dict[str, Any]] = Field(default_factory=dict, description="finished shard -> its report part")


def partial_dir(out: Path) -> Path:
    """The partial folder beside ``out``."""
    return out.with_name(out.name + PARTIAL_SUFFIX)


def check_output(out: Path, overwrite: bool) -> None:
    """FormatError unless ``out`` can be written: absent, an empty folder, or (with ``overwrite``) a checkpoint."""
    check_output_path(out, "the compressed checkpoint", FormatError, folder=True)  # a file, not writable, ...
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise FormatError(f"{out} exists and is not empty (pass overwrite=True / --overwrite)")
    if not (out / "config.json").is_file():
        raise FormatError(
            f"{out} is not empty and holds no config.json: refusing to replace a folder that is not a checkpoint"
        )


def open_partial(out: Path, state: PartialState, resume: bool, overwrite: bool) -> tuple[Path, PartialState]:
    """The partial folder to write into, and its state (with the shards already done when resuming). The parent
    folder must exist."""
    staging = partial_dir(out)
    if staging.exists():
        old = _read_marker(staging)
        if resume and old is not None:
            _check_resumable(staging, old, state)
            drop_temp_files(staging)
            return staging, old
        if not resume and not overwrite:
            raise FormatError(
                f"{staging} holds an unfinished run (interrupted or killed): pass resume=True / --resume to finish "
                "it, or overwrite=True / --overwrite to start over"
            )
        remove_partial(staging)
    staging.mkdir()
    try:
        write_marker(staging, state)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, state


def _read_marker(staging: Path) -> PartialState | None:
    marker = staging / MARKER
    if not marker.is_file():
        if staging.is_dir() and not any(staging.iterdir()):
            return None  # killed right after mkdir: empty, ours to reuse
        raise FormatError(f"{staging} exists but was not made by accel compress (no {MARKER}); move it away")
    try:
        state = PartialState.model_validate_json(marker.read_text())
    except (OSError, ValidationError, ValueError) as exc:
        raise FormatError(
            f"{marker} is unreadable ({type(exc).__name__}); remove {staging} or use --overwrite"
        ) from exc
    if state.format != MARKER_FORMAT:
        raise FormatError(f"{marker}: unsupported partial format {state.format!r} (supported: {MARKER_FORMAT})")
    return state


def _check_resumable(staging: Path, old: PartialState, new: PartialState) -> None:
    if old.settings != new.settings:
        diff = sorted(k for k in set(old.settings) | set(new.settings) if old.settings.get(k) != new.settings.get(k))
        raise FormatError(
            f"cannot resume {staging}: it was started with other settings ({', '.join(diff)} differ: "
            f"{ {k: old.settings.get(k) for k in diff} }); pass the same options, or --overwrite to start over"
        )
    if old.sources != new.sources:
        raise FormatError(f"cannot resume {staging}: the source shards changed since it was started; use --overwrite")


def drop_temp_files(staging: Path) -> None:
    """Remove the temp files a killed or interrupted writer left (finished files were renamed into place; a shard
    not recorded as done is simply written again), and the empty write probe of ``accel._io.check_output_path`` that a
    SIGKILL between its creation and removal leaves. Nothing to do once ``staging`` was renamed into place."""
    if not staging.is_dir():
        return
    for p in staging.iterdir():
        if (p.name.endswith(".tmp") or p.name.startswith(".accel-probe-")) and p.is_file():
            p.unlink()


def write_marker(staging: Path, state: PartialState) -> None:
    """Record ``state`` atomically (temp file, then rename)."""
    write_text_atomic(staging / MARKER, state.model_dump_json(indent=1))


def remove_partial(staging: Path) -> None:
    """Remove a partial folder that accel made (it holds the marker, or is empty)."""
    if not staging.exists():
        return
    if staging.is_dir() and ((staging / MARKER).is_file() or not any(staging.iterdir())):
        shutil.rmtree(staging)
        return
    raise FormatError(f"{staging} exists but was not made by accel compress (no {MARKER}); move it away")


def finish(staging: Path, out: Path) -> None:
    """Drop the marker and rename ``staging`` to ``out`` (replacing an existing ``out``), with Ctrl-C/SIGTERM held
    back so that the folder is never caught half-moved."""
    with _signals_deferred():
        (staging / MARKER).unlink()
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            os.rename(staging, out)
            return
        old = out.with_name(f".{out.name}.accel-old-{os.getpid()}")
        os.rename(out, old)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Block SIGINT and SIGTERM (delivered when the block ends); a no-op where signals cannot be masked."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    previous = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, previous)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename."""
    fd, tmp = make_temp_file(path)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a temp file and a rename."""
    fd, tmp = make_temp_file(dst)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def source_stamp(path: Path) -> list[int]:
    """[size in bytes, mtime in ns] of a source file (a resumed run checks they did not change)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]

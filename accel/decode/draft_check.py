"""``check_draft_weights``: a draft checkpoint directory whose weights hold NaN or ±Inf is refused by name before it
is exported or loaded, and each version of a draft's files is read for it once.

The check reads every tensor (a 0.5B draft: about 2 GB). A clean result is recorded as an empty stamp file under
``$ACCEL_CACHE/checked-drafts``, keyed as ``export_cached`` keys the draft's export: the names, sizes and modification
times of its checkpoint files (``accel.backends.export.checkpoint_files``). A build whose draft was checked before
(its export cached, or its torch load repeated) reads no tensor for the check; an edited draft is read again, and a
damaged one is refused every time (no stamp is written for it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from accel.errors import DraftError
from accel.models.smollm2 import cache_root
from accel.models.sources import engine_quant_method, open_checkpoint

__all__ = ["CHECKED_DIR", "check_draft_weights"]

#: the folder under ``$ACCEL_CACHE`` that holds one empty stamp per draft version found clean
CHECKED_DIR = "checked-drafts"


def check_draft_weights(path: Path) -> None:
    """``DraftError`` naming the first tensor of a draft checkpoint directory that holds NaN or infinite weights (read
    one tensor at a time; skipped when this version of the draft's files was found clean before: module docstring).
    Such a draft would otherwise run with garbage proposals: exact still, but silently without speculation. ``.onnx``
    and ``.gguf`` drafts are used as they are."""
    if not path.is_dir() or engine_quant_method(path) is not None:  # an engine's MX layout: its loader checks it
        return
    stamp = _clean_stamp(path)
    if stamp.is_file():
        return
    _, tensors = open_checkpoint(path)
    for name in tensors:
        array = np.asarray(tensors[name])
        if array.dtype.kind == "f" and not bool(np.isfinite(array).all()):
            raise DraftError(f"draft {path}: {name} holds NaN or infinite weights: the checkpoint is damaged")
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    except OSError:  # a read-only cache: the draft is clean, only the record of it is lost (checked again next time)
        pass


def _clean_stamp(path: Path) -> Path:
    """The stamp file of this version of draft ``path``: its name and SHA-256 of each checkpoint file's name, size
    (bytes) and modification time (ns), as the export cache keys them."""
    # start-up: accel.backends.export imports onnx, which importing accel.decode does not
    from accel.backends.export import checkpoint_files

    key = hashlib.sha256(b"finite draft weights")
    for f in checkpoint_files(path):
        st = f.stat()
        key.update(f"\0{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return cache_root() / CHECKED_DIR / f"{path.name}-{key.hexdigest()[:16]}"

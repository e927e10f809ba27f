"""Fail when git tracks a file over the size limit that is not a declared package asset.

Declared assets are the shipped models under ``accel/demo_data/`` (the demo's drafts); everything else over
``LIMIT_BYTES`` (profiles, ONNX exports, results, checkpoints) belongs outside the repository.
Usage: ``python tools/check_large_files.py`` from the repository root (``make lint`` runs it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT_BYTES = 5 * 1024 * 1024
DECLARED_ASSETS = ("accel/demo_data/",)  # package data shipped on purpose (pyproject.toml package-data)


def oversized(root: Path, limit: int = LIMIT_BYTES) -> list[tuple[str, int]]:
    """Tracked files over ``limit`` bytes outside the declared asset folders, as ``(path, bytes)``."""
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout.decode().split("\0")
    )
    out = []
    for name in filter(None, names):
        path = root / name
        if name.startswith(DECLARED_ASSETS) or not path.is_file():
            continue
        size = path.stat().st_size
        if size > limit:
            out.append((name, size))
    return out


def main() -> int:
    bad = oversized(Path.cwd())
    for name, size in bad:
        print(
            f"{name}: {size / 2**20:.1f} MiB tracked (limit {LIMIT_BYTES / 2**20:.0f} MiB outside "
            f"{', '.join(DECLARED_ASSETS)}): remove it from git or declare it a package asset",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

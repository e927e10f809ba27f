"""tools/check_large_files.py: tracked files over the limit fail lint unless they are declared package assets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from check_large_files import oversized  # noqa: E402


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_oversized_files_outside_assets_are_flagged(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "accel" / "demo_data").mkdir(parents=True)
    (tmp_path / "accel" / "demo_data" / "model.safetensors").write_bytes(b"\0" * 2048)
    (tmp_path / "profile.json").write_bytes(b"\0" * 4096)
    (tmp_path / "small.txt").write_bytes(b"x" * 100)
    (tmp_path / "untracked.bin").write_bytes(b"\0" * 4096)
    _git(tmp_path, "add", "accel", "profile.json", "small.txt")
    assert oversized(tmp_path, limit=1024) == [("profile.json", 4096)]


def test_this_repository_passes():
    assert oversized(ROOT) == []

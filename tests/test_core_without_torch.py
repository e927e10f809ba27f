"""The core install (formats, sim, spd, onnxruntime backend) must work without torch (DEVELOPERS: torch is an extra)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCK_TORCH = textwrap.dedent(
    """
    import importlib.abc, sys

    class _NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by test)", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_blocker_really_blocks_torch():
    proc = _run("import torch")
    assert proc.returncode != 0 and "blocked by test" in proc.stderr


def test_core_imports_without_torch():
    proc = _run(
        """
        import accel, accel.formats, accel.sim, accel.spd
        from accel.backends import Backend, OrtBackend, prefill
        import numpy as np
        mx = accel.formats.quantize(np.linspace(-3, 3, 64, dtype=np.float32), "mxfp6")
        assert mx.dequantize().shape == (64,)
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


def test_cli_help_without_torch():
    proc = _run(
        """
        from accel.cli import build_parser
        text = build_parser().format_help()
        for cmd in ("compress", "predict", "generate"):
            assert cmd in text, cmd
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr

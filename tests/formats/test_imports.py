"""``import accel.formats`` must not import torch (CONTRIBUTING.md: the core install needs no torch)."""

from __future__ import annotations

import subprocess
import sys


def test_import_without_torch():
    code = (
        "import sys, accel, accel.formats\n"
        "from accel.formats import quantize, MXTensor, get_format, pack_codes, unpack_codes, load_tensors, "
        "save_tensors, compress_checkpoint, CompressionReport\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

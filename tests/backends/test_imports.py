"""``from accel.backends import OrtBackend`` (and the qaic writers) must work without importing torch."""

from __future__ import annotations

import subprocess
import sys


def test_ort_backend_does_not_import_torch():
    code = (
        "import sys\n"
        "from accel.backends import OrtBackend, write_qaic_files, QaicBackend\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

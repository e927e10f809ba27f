"""Run accel's instruction-set-dependent paths on prepared inputs and save what they compute: a script that
``test_isa_emulated.py`` runs natively and under an emulated CPU (``qemu-x86_64 -cpu Haswell``: AVX2, no AVX-512, no
VNNI), to compare the two.

    python tests/backends/isa_runner.py IN.npz OUT.npz GRAPH.onnx [GRAPH.onnx ...]

``IN.npz`` holds ``ids`` / ``pos`` (int64 ``[1, S]``) for every graph, and ``mx_x`` / ``mx_w`` (float32) for the
fused MX kernel; ``OUT.npz`` gets ``<graph stem>`` (the logits), ``mx_y`` and ``mx_path`` (the kernel path used),
``mx_q8_y`` / ``mx_q8_path`` (the kernel with int8 activations), ``gguf_<type>_y`` / ``_eye`` / ``_path`` for every
``gguf_<type>`` input (a GGUF block type's bytes of a ``[48, K]`` weight, on the kernel; ``gguf_<type>_x16_y``: int8
activations on the interleaved blocks), and ``u8s8`` (what
onnxruntime's uint8 x int8 ``MatMulInteger`` gives for a pair of 255 * 127: 64,770 exact, 32,767 saturated). Needs no
torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> None:
    from accel.backends import OrtBackend
    from accel.backends.cpu import onnxruntime_u8s8_pair
    from accel.formats import get_format, quantize
    from accel.formats.mxkernel import PackedMX

    inputs, out = np.load(argv[0]), argv[1]
    result: dict[str, np.ndarray] = {"u8s8": np.array(onnxruntime_u8s8_pair())}
    for path in map(Path, argv[2:]):
        b = OrtBackend(path, threads=1)
        ids, pos = inputs["ids"], inputs["pos"]
        result[path.stem] = b.forward(ids, pos, num_logits=ids.shape[1])
    packed = PackedMX(quantize(inputs["mx_w"], get_format("mxfp6_e2m3")))
    result["mx_y"] = packed.matmul(inputs["mx_x"])
    result["mx_path"] = np.array(packed.kernel_path)
    from accel.formats.mxkernel_q8 import matmul_q8, q8_kernel_path

    result["mx_q8_y"] = matmul_q8(packed, inputs["mx_x"])
    result["mx_q8_path"] = np.array(q8_kernel_path(packed))
    from accel.formats.ggml import GGMLTensor
    from accel.formats.ggml_kernel import GGMLKernel

    k = inputs["mx_x"].shape[1]
    for key in inputs.files:  # GGUF blocks: gguf_<type> = the file's bytes of a [48, K] weight
        if key.startswith("gguf_"):
            g = GGMLKernel(GGMLTensor.from_blocks(inputs[key], key[5:], (48, k)))
            result[f"{key}_y"] = g.matmul(inputs["mx_x"])
            result[f"{key}_eye"] = g.matmul(np.eye(k, dtype=np.float32))  # every weight through the SIMD path
            result[f"{key}_path"] = np.array(g.kernel_path)
            result[f"{key}_x16_y"] = g.matmul_q8_x16(inputs["mx_x"])  # int8 activations, interleaved blocks
    np.savez(out, **result)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Run accel's instruction-set-dependent paths on prepared inputs and save what they compute: a script that
``test_isa_emulated.py`` runs natively and under an emulated CPU (``qemu-x86_64 -cpu Haswell``: AVX2, no AVX-512, no
VNNI), to compare the two.

    python tests/backends/isa_runner.py IN.npz OUT.npz GRAPH.onnx [GRAPH.onnx ...]

``IN.npz`` holds ``ids`` / ``pos`` (int64 ``[1, S]``) for every graph, and ``mx_x`` / ``mx_w`` (float32) for the
fused MX kernel; ``OUT.npz`` gets ``<graph stem>`` (the logits), ``mx_y`` and ``mx_path`` (the kernel path used),
and ``u8s8`` (what onnxruntime's uint8 x int8 ``MatMulInteger`` gives for a pair of 255 * 127: 64,770 exact, 32,767
saturated). Needs no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def u8s8_pair() -> int:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(np.full((2, 1), 127, np.int8), "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(sess.run(None, {"a": np.full((1, 2), 255, np.uint8)})[0][0, 0])


def main(argv: list[str]) -> None:
    from accel.backends import OrtBackend
    from accel.formats import get_format, quantize
    from accel.formats.mxkernel import PackedMX

    inputs, out = np.load(argv[0]), argv[1]
    result: dict[str, np.ndarray] = {"u8s8": np.array(u8s8_pair())}
    for path in map(Path, argv[2:]):
        b = OrtBackend(path, threads=1)
        ids, pos = inputs["ids"], inputs["pos"]
        result[path.stem] = b.forward(ids, pos, num_logits=ids.shape[1])
    packed = PackedMX(quantize(inputs["mx_w"], get_format("mxfp6_e2m3")))
    result["mx_y"] = packed.matmul(inputs["mx_x"])
    result["mx_path"] = np.array(packed.kernel_path)
    np.savez(out, **result)


if __name__ == "__main__":
    main(sys.argv[1:])

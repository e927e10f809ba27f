"""``GraphBuilder``: accumulates ONNX nodes and initializers for the graph writers of ``accel.backends``.

Also the opset and IR version every accel graph uses (stock onnxruntime rejects IR 14: docs/reference.md §1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["IR_VERSION", "OPSET", "GraphBuilder"]

OPSET = 18  # BitwiseAnd/Or need 18; LayerNormalization 17
IR_VERSION = 8  # the IR of opset 18; stock onnxruntime rejects IR 14 (docs/reference.md §1)


class GraphBuilder:
    """Accumulates nodes and initializers; ``op`` returns the output name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}
        self._n = 0
        self.opsets: set[str] = set()  # non-standard domains used (com.microsoft for MatMulNBits)

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        """Append one node with one output (named ``name`` or a fresh name); returns the output name."""
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"n{self._n}_{op_type}", **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        """Append one node with ``n_out`` outputs; returns their names."""
        self._n += 1
        outs = [f"{op_type.lower()}_{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n{self._n}_{op_type}", **attrs))
        return outs

    def init(self, name: str, arr: np.ndarray) -> str:
        """Add the initializer ``name`` holding ``arr``; returns ``name``."""
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A small shared constant initializer."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]

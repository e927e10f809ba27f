"""``GraphBuilder``: accumulates ONNX nodes and initializers for the graph writers of ``accel.backends``.

With an ``ExternalData`` sink, every initializer of ``min_bytes`` or more is written to the external-data file the
moment it is created and the graph keeps only a reference (location, offset, length): the weights never sit in the
protobuf, so an export holds one tensor at a time however large the model (docs/backends.md, "Export").

Also the opset and IR version every accel graph uses (stock onnxruntime rejects IR 14: docs/reference.md §1).
"""

from __future__ import annotations

from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["IR_VERSION", "OPSET", "ExternalData", "GraphBuilder"]

OPSET = 18  # BitwiseAnd/Or need 18; LayerNormalization 17
IR_VERSION = 8  # the IR of opset 18; stock onnxruntime rejects IR 14 (docs/reference.md §1)


class ExternalData:
    """Appends tensors to one ONNX external-data file as they are created.

    ``file`` is where the bytes go (a temporary file that the exporter renames to ``location`` next to the model once
    complete); ``location`` is the name recorded in each tensor, relative to the ``.onnx`` file. Tensors of
    ``ALIGN_THRESHOLD`` bytes or more start at a multiple of ``ALIGN`` bytes (onnx's own external-data writer aligns the
    same way), so runtimes can memory-map them. Bytes are little-endian, as ONNX stores raw data.
    """

    ALIGN, ALIGN_THRESHOLD, CHUNK_BYTES = 65536, 1 << 20, 16 << 20

    def __init__(self, file: BinaryIO, location: str, min_bytes: int = 1024) -> None:
        self.file, self.location, self.min_bytes = file, location, min_bytes
        self.nbytes = 0  # bytes written so far (the data file's size), padding included

    def tensor(self, name: str, arr: np.ndarray) -> onnx.TensorProto:
        """Write ``arr`` (numeric; a non-contiguous view such as a transpose is written in row chunks of at most
        ``CHUNK_BYTES``, never copied whole) and return its external ``TensorProto``."""
        arr = np.asarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        if arr.nbytes >= self.ALIGN_THRESHOLD and self.nbytes % self.ALIGN:
            pad = self.ALIGN - self.nbytes % self.ALIGN
            self.file.write(b"\0" * pad)
            self.nbytes += pad
        offset = self.nbytes
        if arr.flags.c_contiguous or arr.ndim < 2:
            self.file.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data if arr.size else b"")
        else:
            rows = max(1, self.CHUNK_BYTES // max(1, arr[0].nbytes))
            for r in range(0, arr.shape[0], rows):
                self.file.write(np.ascontiguousarray(arr[r : r + rows]).reshape(-1).view(np.uint8).data)
        self.nbytes += arr.nbytes
        t = onnx.TensorProto()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.dims.extend(arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(arr.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t


class GraphBuilder:
    """Accumulates nodes and initializers; ``op`` returns the output name.

    ``external``: an ``ExternalData`` sink; initializers of at least its ``min_bytes`` go there as they are added.
    ``inline_bytes`` / ``external_bytes`` count the initializer bytes kept in the graph and written out.
    """

    def __init__(self, external: ExternalData | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.external = external
        self.inline_bytes = 0
        self._consts: dict[tuple, str] = {}
        self._n = 0
        self.opsets: set[str] = set()  # non-standard domains used (com.microsoft for MatMulNBits)

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        """Append one node with one output (named ``name`` or a fresh name); returns the output name."""
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"n{self._n}_{op_type}", **attrs))
        return out

    def ops(
        self,
        op_type: str,
        inputs: list[str],
        n_out: int,
        unused: tuple[int, ...] = (),
        names: dict[int, str] | None = None,
        **attrs: Any,
    ) -> list[str]:
        """Append one node with ``n_out`` outputs; returns their names (``""``, an omitted optional output, for the
        indices in ``unused``; ``names[i]`` for output ``i`` where given, else a fresh name)."""
        self._n += 1
        names = names or {}
        outs = ["" if i in unused else names.get(i, f"{op_type.lower()}_{self._n}_{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n{self._n}_{op_type}", **attrs))
        return outs

    def init(self, name: str, arr: np.ndarray) -> str:
        """Add the initializer ``name`` holding ``arr`` (written out at once with an external sink); returns ``name``.

        The builder keeps no reference to ``arr``: once written, the caller's array can be freed.
        """
        arr = np.asarray(arr)
        if self.external is not None and arr.nbytes >= self.external.min_bytes:
            self.inits.append(self.external.tensor(name, arr))
        else:
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
            self.inline_bytes += arr.nbytes
        return name

    @property
    def external_bytes(self) -> int:
        """Bytes written to the external-data file so far (0 without one)."""
        return self.external.nbytes if self.external is not None else 0

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A small shared constant initializer."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]

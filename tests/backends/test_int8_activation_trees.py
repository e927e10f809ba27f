"""Targets whose Linear activations are int8 (``*-nbits`` at accuracy level 4, ``*-kernel-q8``) score no token trees
on ``OrtBackend`` (a tree call's float rounding moves their codes: docs/spd.md, "Token trees"); float-activation
exports of the same weights (``accuracy_level=1``, fp32) do, and the export says which in its metadata."""

from __future__ import annotations

import onnx
import pytest

from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.errors import SpdError
from accel.spd import GREEDY, DraftTree, generate
from tests.backends.test_onnx_mx_kernel import _model


@pytest.mark.parametrize(
    ("weights", "int8"),
    [
        (ExportWeights("mxint8-nbits"), True),
        (ExportWeights("mxint8-nbits", accuracy_level=1), False),
        (ExportWeights("fp32"), False),
    ],
)
def test_int8_activation_targets_refuse_trees(tmp_path, weights, int8):
    kw = {"ctx_len": 32, "batch_size": 1, "progress": False, "tree": True}
    path = export_onnx(_model(), tmp_path / "t.onnx", weights=weights, **kw)
    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    assert meta["accel.int8_activations"] == str(int(int8))
    target = OrtBackend(path)
    draft = OrtBackend(export_onnx(_model(seed=3), tmp_path / "d.onnx", **kw))
    assert ("tree" in target.info.capabilities) is not int8
    if int8:
        with pytest.raises(SpdError, match="its Linear activations are int8"):
            generate(target, DraftTree(draft, nodes=4), [[1, 2, 3]], max_new_tokens=4, sampling=GREEDY)
    else:
        assert (
            len(generate(target, DraftTree(draft, nodes=4), [[1, 2, 3]], max_new_tokens=4, sampling=GREEDY).tokens[0])
            == 4
        )

"""Cloud AI 100 files against golden copies (the formats QEfficient writes), and the missing-SDK error.

No card or SDK is available here: the compile and run path is not verified on hardware (see docs/backends.md).
Regenerate the golden files only after checking a diff by hand: ``ACCEL_REGEN_GOLDEN=1 pytest tests/backends``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accel.backends import export_onnx
from accel.backends.qaic import QaicBackend, QaicCompileSpec, QaicOptions, write_qaic_files
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig

GOLDEN = Path(__file__).parent / "golden"
CASES = {  # (call lengths, compile options)
    "default": (dict(prompt_len=32, k=7), QaicOptions(mxfp6=True, mxint8_kv=False, num_devices=1)),
    "mxint8_2dev": (dict(prompt_len=16, k=3), QaicOptions(mxfp6=False, mxint8_kv=True, num_devices=2, num_cores=14)),
}


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=48)
    return export_onnx(
        Decoder(cfg).init_weights(0), tmp_path_factory.mktemp("q") / "model.onnx", ctx_len=64, progress=False
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_files_match_golden(onnx_file, case):
    out = onnx_file.parent / f"qaic_{case}"
    lengths, options = CASES[case]
    spec = write_qaic_files(onnx_file, out, ctx_len=64, options=options, **lengths)
    assert spec.onnx_path == "../model.onnx" and spec.num_layers == 2 and spec.vocab_size == 64
    written = sorted(p.name for p in out.iterdir())
    golden = GOLDEN / case
    if os.environ.get("ACCEL_REGEN_GOLDEN"):
        golden.mkdir(parents=True, exist_ok=True)
        for name in written:
            (golden / name).write_text((out / name).read_text())
    assert written == sorted(p.name for p in golden.iterdir())
    for name in written:
        assert (out / name).read_text() == (golden / name).read_text(), name
    assert QaicCompileSpec.model_validate_json((out / "accel_qaic.json").read_text()) == spec


def test_golden_structure():
    # independent of the writer: the facts the Cloud AI 100 flow relies on (docs/reference.md §2)
    spec = json.loads((GOLDEN / "default" / "specializations.json").read_text())["specializations"]
    assert spec == [
        {"batch_size": "1", "seq_len": "32", "ctx_len": "64"},
        {"batch_size": "1", "seq_len": "8", "ctx_len": "64"},
    ]
    io = (GOLDEN / "default" / "custom_io.yaml").read_text()
    assert io.count("IOName") == 8 and " - IOName: past_value.1_RetainedState\n   Precision: float16\n" in io
    assert "mxint8" in (GOLDEN / "mxint8_2dev" / "custom_io.yaml").read_text()
    cmd = (GOLDEN / "default" / "compile.sh").read_text()
    for flag in (
        "-retained-state",
        "-convert-to-fp16",
        "-mxfp6-matmul",
        "-aic-num-cores=16",
        "-network-specialization-config=specializations.json",
        "-custom-IO-list-file=custom_io.yaml",
    ):
        assert flag in cmd


def test_mismatched_graph_settings(onnx_file, tmp_path):
    with pytest.raises(BackendError, match="ctx_len=64"):
        write_qaic_files(onnx_file, tmp_path, prompt_len=32, k=7, ctx_len=128)
    with pytest.raises(BackendError, match="no ONNX file"):
        write_qaic_files(tmp_path / "nope.onnx", tmp_path, prompt_len=32, k=7, ctx_len=64)


def test_missing_sdk_is_a_clear_error(tmp_path):
    # the SDK is genuinely absent on this machine (no mock); where it is installed this test does not apply
    try:
        import QEfficient  # noqa: F401

        pytest.skip("QEfficient is installed")
    except ImportError:
        pass
    with pytest.raises(BackendError, match="Cloud AI 100 runtime is not installed"):
        QaicBackend(tmp_path / "qpc")


def test_tree_specialization(onnx_file, tmp_path):
    """A tree graph gets a third specialization, seq_len = tree_nodes; a chain graph refuses tree_nodes."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=48)
    tree_file = export_onnx(Decoder(cfg).init_weights(0), tmp_path / "tree.onnx", ctx_len=64, progress=False, tree=True)
    tree16 = QaicOptions(tree_nodes=16)
    spec = write_qaic_files(tree_file, tmp_path / "qaic", prompt_len=32, k=3, ctx_len=64, options=tree16)
    written = json.loads((tmp_path / "qaic" / "specializations.json").read_text())["specializations"]
    assert [s["seq_len"] for s in written] == ["32", "4", "16"] and spec.seq_lens == (4, 16, 32)
    assert QaicCompileSpec.model_validate_json((tmp_path / "qaic" / "accel_qaic.json").read_text()).tree_nodes == 16
    with pytest.raises(BackendError, match="no tree inputs"):
        write_qaic_files(onnx_file, tmp_path / "chain", prompt_len=32, k=3, ctx_len=64, options=tree16)
    with pytest.raises(BackendError, match="tree_nodes 65"):
        big = QaicOptions(tree_nodes=65)
        write_qaic_files(tree_file, tmp_path / "big", prompt_len=32, k=3, ctx_len=64, options=big)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"k": 0}, "k: Input should be greater than 0"),
        ({"prompt_len": 1.5}, "prompt_len"),
        ({"options": QaicOptions(num_cores=-1)}, "num_cores"),
        ({"options": QaicOptions(num_devices="two")}, "num_devices"),  # type: ignore[arg-type]
        ({"k": 64}, "must not exceed ctx_len"),
        ({"ctx_len": 32}, "exported with ctx_len=64"),
    ],
)
def test_bad_settings_leave_no_folder(onnx_file, tmp_path, changes, needle):
    kwargs = {"prompt_len": 32, "k": 7, "ctx_len": 64, **changes}
    with pytest.raises(BackendError, match=needle):
        write_qaic_files(onnx_file, tmp_path / "a" / "qaic", **kwargs)
    assert list(tmp_path.iterdir()) == []  # no empty output folder, no temp folder, no parent


def test_output_that_is_a_file_or_unwritable(onnx_file, tmp_path):
    (tmp_path / "f").write_text("keep")
    with pytest.raises(BackendError, match="is not a directory"):
        write_qaic_files(onnx_file, tmp_path / "f", prompt_len=32, k=7, ctx_len=64)
    with pytest.raises(BackendError, match=r"cannot write the Cloud AI 100 files to .*f/qaic: .*f is not a directory"):
        write_qaic_files(onnx_file, tmp_path / "f" / "qaic", prompt_len=32, k=7, ctx_len=64)  # was a raw OSError
    assert [p.name for p in tmp_path.iterdir()] == ["f"] and (tmp_path / "f").read_text() == "keep"
    out = tmp_path / "existing"  # an existing folder keeps its other files and gets the new ones
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    write_qaic_files(onnx_file, out, prompt_len=32, k=7, ctx_len=64)
    assert (out / "notes.txt").read_text() == "mine" and (out / "compile.sh").stat().st_mode & 0o100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "f"]


class _NoCard:
    """Stands in for the SDK's session class where no card exists; any use of it is a test failure."""

    def __init__(self, *a, **kw) -> None:
        self.input_names = ["input_ids", "position_ids", "past_key.0"]
        self.output_names = ["logits"]

    def skip_buffers(self, names) -> None:
        pass

    def run(self, *a, **kw):
        raise AssertionError("the card was called")


def test_tree_calls_are_refused_with_the_reason(onnx_file, tmp_path, monkeypatch):
    """QaicBackend has no in-graph KV compaction: tree calls, cache moves and a branching proposer are clear errors
    raised before the card is touched."""
    import numpy as np

    import accel.backends.qaic as qaic
    from accel.backends import TreeInputs, require
    from accel.errors import SpdError
    from accel.spd import GREEDY, DraftTree, generate
    from tests.helpers.decoders import backend

    write_qaic_files(onnx_file, tmp_path / "qaic", prompt_len=16, k=3, ctx_len=64)
    monkeypatch.setattr(qaic, "_session_class", lambda: _NoCard)
    qb = QaicBackend(tmp_path / "qaic" / "qpc")
    ids, pos = np.zeros((1, 2), np.int64), np.array([[0, 1]])
    assert not qb.info.capabilities
    with pytest.raises(BackendError, match=r"no 'tree' capability: .*in-graph compaction is not implemented"):
        require(qb, "tree")
    with pytest.raises(BackendError, match=r"no 'tree' capability: .*in-graph compaction is not implemented"):
        qb.forward(ids, pos, tree=TreeInputs(pos, np.ones((1, 2, 64), bool)))
    with pytest.raises(BackendError, match="cannot move cache slots"):
        qb.move_cache(np.array([[3]]), np.array([[2]]))
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=48)
    draft = backend(Decoder(cfg).init_weights(1), 1, ctx_len=64)
    with pytest.raises(SpdError, match=r"qaic target backend cannot score them: .*retained on the card"):
        generate(qb, DraftTree(draft, nodes=4, top_k=2), [[1, 2, 3]], max_new_tokens=4, sampling=GREEDY)


def test_the_old_option_keywords_still_work_and_warn(onnx_file, tmp_path):
    """``write_qaic_files``'s compile keywords before ``QaicOptions`` write the same files, with a DeprecationWarning
    naming the replacement; unknown keywords and both forms together are refused by name."""
    new = tmp_path / "new"
    write_qaic_files(onnx_file, new, prompt_len=16, k=3, ctx_len=64, options=QaicOptions(num_devices=2, num_cores=14))
    with pytest.warns(DeprecationWarning, match=r"num_cores=, num_devices= -> options=QaicOptions\(num_cores=..."):
        write_qaic_files(onnx_file, tmp_path / "old", prompt_len=16, k=3, ctx_len=64, num_cores=14, num_devices=2)
    for f in sorted(p.name for p in new.iterdir()):
        assert (tmp_path / "old" / f).read_text() == (new / f).read_text(), f
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*num_chips"):
        write_qaic_files(onnx_file, tmp_path / "x", prompt_len=16, k=3, ctx_len=64, num_chips=2)
    with pytest.raises(TypeError, match="got options= and the deprecated num_cores"):
        write_qaic_files(onnx_file, tmp_path / "y", prompt_len=16, k=3, ctx_len=64, options=QaicOptions(), num_cores=2)

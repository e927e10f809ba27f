"""``accel export-draft DRAFT -o OUT --format speculators``: no accel draft has a speculators (EAGLE-3) form, and the
command says why, for each kind of draft, in one line, writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from accel.cli import EXIT_ERROR, main
from accel.models import save_pretrained
from accel.serving.speculators_format import SPECULATORS_EXPORT_REFUSALS
from tests.helpers.decoders import oracle_feature_draft, random_model
from tests.serving.helpers import tiny_llama

HEADS = Path(__file__).resolve().parents[2] / "accel" / "demo_data" / "smollm2-hydra"


def _speculators_folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    return path


@pytest.mark.parametrize("kind", ["feature", "hydra", "standalone", "speculators"])
def test_speculators_export_says_why_not(tmp_path, capsys, kind):
    if kind == "hydra" and not HEADS.is_dir():
        pytest.skip("the shipped Hydra heads are not in this checkout")
    source = {
        "feature": lambda: save_pretrained(oracle_feature_draft(random_model(0), list(range(8))), tmp_path / "src"),
        "hydra": lambda: HEADS,
        "standalone": lambda: save_pretrained(tiny_llama(tied=False), tmp_path / "src"),
        "speculators": lambda: _speculators_folder(tmp_path / "src"),
    }[kind]()
    out = tmp_path / "out"
    assert main(["export-draft", str(source), "-o", str(out), "--format", "speculators"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and SPECULATORS_EXPORT_REFUSALS[kind] in err, err
    assert not out.exists()


def test_speculators_export_of_nothing_is_refused(tmp_path, capsys):
    assert main(["export-draft", str(tmp_path / "nowhere"), "-o", str(tmp_path / "o"), "--format", "speculators"]) == (
        EXIT_ERROR
    )
    assert "no draft checkpoint directory" in capsys.readouterr().err


def test_vllm_speculative_config():
    from accel.errors import DraftError
    from accel.serving.speculators_format import vllm_speculative_config

    assert vllm_speculative_config("heads/eagle3", 3) == {
        "model": "heads/eagle3",
        "method": "eagle3",
        "num_speculative_tokens": 3,
    }
    for bad in (0, True, 2.0):
        with pytest.raises(DraftError, match="num_speculative_tokens"):
            vllm_speculative_config("heads/eagle3", bad)

"""Bad input gives a DraftError that names the offending thing, from the API and from the command line."""

from __future__ import annotations

import shutil

import pytest

from accel.cli import main
from accel.drafts import DistillConfig, distill, evaluate_draft
from accel.errors import DraftError
from tests.helpers.drafts import write_target

TEXT = "def add(a, b):\n    return a + b\n" * 4


def test_vocabulary_mismatch(tiny_target, tmp_path):
    other = write_target(tmp_path / "v300", vocab=300)
    with pytest.raises(DraftError, match=r"vocab_size 300 .* has 256"):
        evaluate_draft(tiny_target, other, [[1, 2, 3, 4]])


def test_missing_checkpoint_and_files(tiny_target, tmp_path):
    with pytest.raises(DraftError, match="does not exist"):
        evaluate_draft(tiny_target, tmp_path / "nowhere", [TEXT])
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tiny_target / "config.json", no_weights / "config.json")
    with pytest.raises(DraftError, match="has no weights"):
        evaluate_draft(tiny_target, no_weights, [TEXT])
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    shutil.copy(tiny_target / "model.safetensors", no_config / "model.safetensors")
    with pytest.raises(DraftError, match=r"no config.json"):
        evaluate_draft(no_config, tiny_target, [TEXT])


@pytest.mark.parametrize("damage", ["truncate", "garbage", "bad_json", "wrong_shape"])
def test_corrupted_draft(tiny_target, tmp_path, damage):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_target, bad)
    weights = bad / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 64)
    elif damage == "bad_json":
        (bad / "config.json").write_text("{not json")
    else:  # config says 3 layers, weights have 2
        import json

        cfg = json.loads((bad / "config.json").read_text())
        cfg["num_hidden_layers"] = 3
        (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftError, match=r"draft checkpoint .*bad"):
        evaluate_draft(tiny_target, bad, [TEXT])


def test_bad_data_and_options(tiny_target, tmp_path):
    with pytest.raises(DraftError, match="fewer than 2 tokens"):
        evaluate_draft(tiny_target, tiny_target, [[5]])
    with pytest.raises(DraftError, match="outside"):
        evaluate_draft(tiny_target, tiny_target, [[5, 999]])
    with pytest.raises(DraftError, match="temperature"):
        evaluate_draft(tiny_target, tiny_target, [TEXT], temperature=-1)
    with pytest.raises(DraftError, match="does not exist"):
        distill(tiny_target, tmp_path / "d", DistillConfig(data_files=[tmp_path / "missing.txt"], progress=False))
    with pytest.raises(ValueError, match="divisible"):
        DistillConfig(d_model=30, heads=4)
    with pytest.raises(ValueError, match="needs prompts"):
        DistillConfig(self_generate=3)


def test_cli_reports_errors_with_exit_code(tiny_target, tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text(TEXT)
    assert main(["eval-draft", str(tiny_target), str(tmp_path / "nowhere"), "--data", str(data)]) == 2
    assert "draft checkpoint" in capsys.readouterr().err
    assert main(["distill", str(tiny_target), "-o", str(tmp_path / "d")]) == 2
    assert "no data" in capsys.readouterr().err


@pytest.mark.parametrize("max_k", [0, 65, 10**8, True, 2.0])
def test_max_k_is_bounded(tiny_target, max_k):
    with pytest.raises(DraftError, match=r"max_k must be an int in 1\.\.64"):
        evaluate_draft(tiny_target, tiny_target, [TEXT], max_k=max_k)


@pytest.mark.parametrize("field", ["batch_size", "gen_batch_size"])
def test_distill_batch_sizes_are_bounded(capsys, tiny_target, tmp_path, field):
    with pytest.raises(ValueError, match=f"{field}\n  Input should be less than or equal to 1024"):
        DistillConfig(**{field: 10**8})
    if field == "batch_size":
        argv = ["distill", str(tiny_target), "-o", str(tmp_path / "d"), "--batch-size", "100000000", "--steps", "1"]
        assert main(argv) == 2
        assert "batch_size" in capsys.readouterr().err
        assert not (tmp_path / "d").exists()

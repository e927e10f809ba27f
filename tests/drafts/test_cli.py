"""``accel distill`` and ``accel eval-draft`` end to end on a tiny target."""

from __future__ import annotations

import json

from accel.cli import main


def test_distill_then_eval_draft(tiny_target, text_file, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\\n\nWrite a haiku\n")
    out = tmp_path / "draft"
    code = main(
        [
            "distill",
            str(tiny_target),
            "-o",
            str(out),
            "--layers",
            "1",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--data",
            str(text_file),
            "--self-generate",
            "4",
            "--prompts",
            str(prompts),
            "--chat",
            "--gen-tokens",
            "8",
            "--steps",
            "6",
            "--batch-size",
            "4",
            "--threads",
            "1",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "draft written to" in text and "6 steps" in text
    assert (out / "model.safetensors").is_file()
    assert main(["eval-draft", str(tiny_target), str(out), "--data", str(text_file), "--json", "--max-k", "3"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert 0.0 <= ev["greedy_agreement"] <= 1.0 and len(ev["accept_rate_by_position"]) == 3
    assert main(["eval-draft", str(tiny_target), str(tiny_target), "--data", str(text_file)]) == 0
    assert "greedy agreement          1.000" in capsys.readouterr().out

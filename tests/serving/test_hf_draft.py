"""Standalone drafts exported as plain Hugging Face checkpoints: ``transformers.AutoModelForCausalLM`` loads them
and gives accel's logits (fp32, up to summation order: 2e-5 as tests/models/test_loading.py), restricted heads
widened with zero rows, MX-compressed drafts dequantized exactly, feature drafts refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from accel.drafts.architecture import restrict_head
from accel.drafts.export_hf import export_hf_draft
from accel.errors import DraftError
from accel.models import MASKED_LOGIT, load_checkpoint, save_pretrained
from tests.helpers.decoders import oracle_feature_draft, random_model
from tests.serving.helpers import tiny_llama

transformers = pytest.importorskip("transformers")
#: float32 summation order differs between accel's torch ops and transformers' by the CPU's BLAS kernels: on an
#: AVX2-only AMD EPYC the largest difference was 2.03e-5 at logits of 3.5 to 9 (relative 2e-6 to 6e-6)
ATOL, RTOL = 2e-5, 1e-5
SHIPPED = Path(__file__).resolve().parents[2] / "accel" / "demo_data" / "smollm2-draft"
KEEP = np.array([90, 0, 3, 7, 8, 15, 31, 32, 33, 50, 64, 77, 95, 12, 40, 41])


def _both(draft, out: Path, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    export_hf_draft(draft, out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ours = load_checkpoint(draft) if isinstance(draft, Path) else draft
    with torch.no_grad():
        return ours.causal_forward(tokens), hf(tokens).logits


@pytest.mark.parametrize("tied", [True, False])
def test_plain_draft_loads_in_transformers_with_accel_logits(tmp_path, tied):
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    ours, theirs = _both(tiny_llama(tied=tied), tmp_path / "hf", tokens)
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=RTOL)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and not any(k.startswith("accel") for k in config)


def test_restricted_head_is_widened_with_zero_rows(tmp_path):
    draft = restrict_head(tiny_llama(tied=False), KEEP).eval()
    src = tmp_path / "src"
    save_pretrained(draft, src)
    (src / "tokenizer_config.json").write_text("{}")
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    ours, theirs = _both(src, tmp_path / "hf", tokens)
    keep = np.sort(KEEP)
    others = np.setdiff1d(np.arange(96), keep)
    torch.testing.assert_close(theirs[..., keep], ours[..., keep], atol=ATOL, rtol=RTOL)
    assert torch.all(ours[..., others] == MASKED_LOGIT) and torch.all(theirs[..., others] == 0)
    assert (tmp_path / "hf" / "tokenizer_config.json").is_file()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "accel_head_vocab" not in config and config["vocab_size"] == 96


def test_shipped_mx_draft_loads_in_transformers(tmp_path):
    if not (SHIPPED / "model.safetensors").is_file():
        pytest.skip("the shipped SmolLM2 draft is not in this checkout")
    tokens = torch.randint(0, 49152, (2, 24), generator=torch.Generator().manual_seed(2))
    ours, theirs = _both(SHIPPED, tmp_path / "hf", tokens)
    ids = load_checkpoint(SHIPPED).lm_head_token_ids
    torch.testing.assert_close(theirs[..., ids], ours[..., ids], atol=ATOL, rtol=RTOL)
    top2 = ours[..., ids].topk(2).values
    clear = (top2[..., 0] > 0) & (top2[..., 0] - top2[..., 1] > 1e-3)  # no zero row and no near tie can flip it
    assert clear.sum() > 0
    assert torch.equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])


def test_feature_draft_is_refused(tmp_path):
    target = random_model(0)
    draft = oracle_feature_draft(target, list(range(8)))
    with pytest.raises(DraftError, match="speculators"):
        export_hf_draft(draft, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_draft_cli(tmp_path, capsys):
    """``accel export-draft DRAFT -o OUT --format hf`` writes what ``export_hf_draft`` writes (transformers loads it
    with accel's logits); Hydra heads, a missing source and an existing output are one-line errors."""
    from accel.cli import EXIT_ERROR, main

    src = save_pretrained(tiny_llama(tied=False), tmp_path / "src")
    assert main(["export-draft", str(src), "-o", str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert "wrote" in capsys.readouterr().out
    tokens = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, load_checkpoint(src).causal_forward(tokens), atol=ATOL, rtol=RTOL)
    capsys.readouterr()  # transformers' loading bar
    heads = Path(__file__).resolve().parents[2] / "accel" / "demo_data" / "smollm2-hydra"
    for argv, named in (
        ([str(heads), "-o", str(tmp_path / "h")], "Hydra heads"),
        ([str(tmp_path / "nowhere"), "-o", str(tmp_path / "n")], "no draft checkpoint directory"),
        ([str(src), "-o", str(tmp_path / "hf")], "exists"),
    ):
        assert main(["export-draft", *argv]) == EXIT_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, err

"""``distill`` on a tiny random target: the loss goes down, the checkpoint loads everywhere, resume is exact."""

from __future__ import annotations

import json

import pytest
import torch

from accel.drafts import DistillConfig, distill
from accel.drafts.loss import topk_kl
from accel.errors import DraftError
from accel.models import load_checkpoint
from accel.models.loading import read_checkpoint_tensors


def _cfg(text_file, **kw) -> DistillConfig:
    base = dict(
        layers=1,
        d_model=32,
        heads=2,
        data_files=[text_file],
        max_windows_per_file=12,
        seq_len=32,
        prompts=["def f(x):\n", "hello world"],
        self_generate=4,
        gen_tokens=12,
        gen_batch_size=4,
        batch_size=4,
        lr=1e-2,
        warmup_steps=2,
        max_steps=16,
        eval_every=4,
        checkpoint_every=4,
        seed=0,
        threads=1,
        progress=False,
        held_out_fraction=0.2,
    )
    base.update(kw)
    return DistillConfig(**base)


def test_topk_kl_is_zero_iff_draft_matches_renormalised_teacher():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 5, 50, generator=gen)
    logp, ids = torch.topk(torch.log_softmax(logits, -1), 50, dim=-1)
    mask = torch.ones(1, 5, dtype=torch.bool)
    assert float(topk_kl(logits, ids, logp, mask)) == pytest.approx(0.0, abs=1e-6)  # full k: KL(p||p) = 0
    assert float(topk_kl(torch.zeros(1, 5, 50), ids, logp, mask)) > 0.01
    # masked positions do not count
    bad = logits.clone()
    bad[0, 2] = -bad[0, 2]
    mask[0, 2] = False
    assert float(topk_kl(bad, ids, logp, mask)) == pytest.approx(0.0, abs=1e-6)


def test_distill_trains_and_writes_a_loadable_checkpoint(tiny_target, text_file, tmp_path):
    out = tmp_path / "draft"
    report = distill(tiny_target, out, _cfg(text_file))
    assert report.steps == 16 and report.stopped_by == "max_steps"
    losses = [h.loss for h in report.history]
    assert losses[-1] < 0.8 * losses[0], losses  # the distillation loss decreases
    assert report.train_tokens > 0 and report.held_out_tokens > 0
    assert 0.0 <= report.greedy_agreement <= 1.0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "distill.json"):
        assert (out / name).is_file(), name
    draft = load_checkpoint(out)  # the models loader reads it like any HF checkpoint
    assert draft.config.vocab_size == 256 and draft.config.num_layers == 1 and draft.config.hidden_size == 32
    assert json.loads((out / "distill.json").read_text())["steps"] == 16


def test_resume_continues_from_the_saved_step_exactly(tiny_target, text_file, tmp_path):
    full = distill(tiny_target, tmp_path / "full", _cfg(text_file, max_steps=12, schedule_steps=12))
    part = distill(tiny_target, tmp_path / "part", _cfg(text_file, max_steps=8, schedule_steps=12))
    assert part.steps == 8
    resumed = distill(tiny_target, tmp_path / "part", _cfg(text_file, max_steps=12, schedule_steps=12, resume=True))
    assert resumed.steps == 12
    assert [h.step for h in resumed.history] == [4, 8, 12]  # history continued, not restarted
    # the final training state (latest weights) equals the uninterrupted run's: same batches, same optimizer state
    a = torch.load(tmp_path / "full" / ".distill" / "state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / ".distill" / "state.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert resumed.history[-1].loss == pytest.approx(full.history[-1].loss, rel=1e-6)


def test_resume_refuses_a_different_architecture(tiny_target, text_file, tmp_path):
    distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=4))
    with pytest.raises(DraftError, match="different architecture"):
        distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=8, d_model=16, resume=True))


def test_resume_from_a_damaged_training_state_is_a_named_error(tiny_target, text_file, tmp_path):
    """Before: a state missing an entry was a bare KeyError from deep in the restore (one of another shape a
    RuntimeError from torch, a saved tensor an AttributeError); now a DraftError naming the file."""
    distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=4))
    state_path = tmp_path / "d" / ".distill" / "state.pt"
    state = torch.load(state_path, weights_only=True)
    del state["optimizer"]
    torch.save(state, state_path)
    with pytest.raises(DraftError, match=r"training state .*state\.pt does not fit this run \(KeyError"):
        distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=8, resume=True))
    torch.save(torch.zeros(3), state_path)
    with pytest.raises(DraftError, match=r"state\.pt holds a Tensor, not a training state"):
        distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=8, resume=True))


def test_minutes_cap_stops_early_and_still_writes_the_draft(tiny_target, text_file, tmp_path):
    report = distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=10_000, minutes=1e-4))
    assert report.stopped_by == "minutes" and report.steps < 10_000
    assert (tmp_path / "d" / "model.safetensors").is_file()
    assert set(read_checkpoint_tensors(tmp_path / "d"))  # a complete, readable weights file


def test_distill_needs_data(tiny_target, tmp_path):
    with pytest.raises(DraftError, match="no distillation data"):
        distill(tiny_target, tmp_path / "d", DistillConfig(layers=1, d_model=32, heads=2, progress=False))


def test_sampled_softmax_loss_approaches_exact_loss():
    from accel.drafts.loss import sampled_topk_kl

    gen = torch.Generator().manual_seed(0)
    hidden, head = torch.randn(40, 16, generator=gen), torch.randn(300, 16, generator=gen) * 0.3
    teacher = torch.log_softmax(torch.randn(40, 300, generator=gen) * 2, -1)
    logp, ids = torch.topk(teacher, 8, dim=-1)
    exact = float(topk_kl((hidden @ head.T)[None], ids[None], logp[None], torch.ones(1, 40, dtype=torch.bool)))
    # the normaliser estimate is unbiased; with many negatives the loss converges to the exact one
    approx = float(sampled_topk_kl(hidden, head, ids, logp, 200_000, torch.Generator().manual_seed(1)))
    assert approx == pytest.approx(exact, rel=1e-2)
    coarse = float(sampled_topk_kl(hidden, head, ids, logp, 64, torch.Generator().manual_seed(1)))
    assert coarse == pytest.approx(exact, rel=0.2)


def test_distill_with_sampled_softmax(tiny_target, text_file, tmp_path):
    report = distill(tiny_target, tmp_path / "d", _cfg(text_file, softmax_negatives=64))
    losses = [h.loss for h in report.history]
    assert losses[-1] < 0.8 * losses[0], losses


def test_init_from_warm_starts_and_checks_architecture(tiny_target, text_file, tmp_path):
    first = tmp_path / "first"
    distill(tiny_target, first, _cfg(text_file, max_steps=4))
    cfg = _cfg(text_file, max_steps=1, lr=1e-9, warmup_steps=0, init_from=first)
    report = distill(tiny_target, tmp_path / "second", cfg)
    # a (practically) zero learning rate leaves the warm-started weights: same agreement as the first draft
    assert report.history[0].greedy_agreement is not None
    a, b = load_checkpoint(first), load_checkpoint(tmp_path / "second")
    torch.testing.assert_close(a.embed_tokens.weight, b.embed_tokens.weight, rtol=0, atol=1e-6)
    with pytest.raises(DraftError, match="different architecture"):
        distill(tiny_target, tmp_path / "third", _cfg(text_file, d_model=16, init_from=first))


def test_resume_refuses_a_data_cache_built_with_other_settings(tiny_target, text_file, tmp_path):
    distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=2))
    with pytest.raises(DraftError, match="other data settings"):
        distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=2, gen_tokens=5, resume=True))
    # more self-generated rows keep the data cache (batches only append) but not the training state
    with pytest.raises(DraftError, match="different architecture/data config"):
        distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=2, self_generate=8, resume=True))
    (tmp_path / "d" / ".distill" / "state.pt").unlink()
    more = distill(tiny_target, tmp_path / "d", _cfg(text_file, max_steps=2, self_generate=8, resume=True))
    assert more.steps == 2 and more.train_tokens > 0

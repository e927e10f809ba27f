"""The exit head shipped for SmolLM2-135M (``accel/demo_data/smollm2-exit-L15``): greedy PPD with it equals greedy AR
token for token on a held-out prompt (torch stages, k = 3), its card states how it was built, and it matches the
true token far more often than the plain exit (the card's held-out figures, and the decoder's own count here)."""

from __future__ import annotations

import json

import pytest

from accel.backends import TorchBackend
from accel.backends.stages import split_layers
from accel.drafts.checkpoint import load_text_tokenizer
from accel.drafts.early_exit import load_exit_head, shipped_exit_head
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models import smollm2_checkpoint
from accel.spd import generate_ar
from accel.spd.ppd import GREEDY, generate_ppd
from tests.helpers.scenario import smollm2_model

CTX, NEW = 160, 40


@pytest.fixture(scope="module")
def model():
    return smollm2_model().eval()


def test_card_states_build_and_held_out_match_rate():
    card = json.loads((shipped_exit_head(15) / "exit_head.json").read_text())
    assert card["layer"] == 15 and card["built_with"].startswith("examples/build_exit_head.py")
    plain, trained = card["held_out_topk_agreement"]["plain_exit"], card["held_out_topk_agreement"]["trained"]
    assert trained["1"] <= trained["2"] <= trained["3"]
    assert trained["1"] > plain["1"] + 0.1  # a trained head, not the logit lens
    assert card["held_out"]["positions"] > 500 and card["train"]["positions"] > 10_000


def test_greedy_ppd_with_the_shipped_head_equals_ar(model):
    head = load_exit_head(shipped_exit_head(15), model)
    front_spec, back_spec = split_layers(model.config.num_layers, [15], exit_logits=True)
    tok = load_text_tokenizer(smollm2_checkpoint())
    prompt = tok.encode(HELD_OUT_PROMPTS[0]).ids
    front = TorchBackend(model, ctx_len=CTX, batch_size=3, stage=front_spec, exit_head=head)
    back = TorchBackend(model, ctx_len=CTX, batch_size=1, stage=back_spec)
    res = generate_ppd(front, back, prompt, max_new_tokens=NEW)
    plain = generate_ppd(
        TorchBackend(model, ctx_len=CTX, batch_size=3, stage=front_spec), back, prompt, max_new_tokens=NEW
    )
    ar = generate_ar(TorchBackend(model, ctx_len=CTX, batch_size=1), [prompt], max_new_tokens=NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens[0] == plain.tokens
    assert res.stats.hits > plain.stats.hits  # the trained head's candidates match more often

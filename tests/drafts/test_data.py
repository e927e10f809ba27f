"""Distillation data: self-generated continuations and their teacher distributions."""

from __future__ import annotations

import numpy as np
import torch

from accel.backends import TorchBackend
from accel.drafts.architecture import causal_logits
from accel.drafts.data import TeacherData, chat_prompt, self_generate, split_rows, teacher_topk
from accel.models.decoder import Decoder
from accel.spd import GREEDY, generate_ar
from tests.helpers.drafts import tiny_config


def _target() -> Decoder:
    return Decoder(tiny_config()).init_weights(seed=5, std=0.3)


def test_self_generate_greedy_rows_match_autoregressive_decoding():
    model = _target()
    prompts = [[5, 6, 7, 8, 9], [11, 12], [40, 41, 42]]  # ragged: left padding in one batch
    data = self_generate(model, prompts, [0.0, 0.0, 0.0], gen_tokens=10, k=8, seed=0)
    for i, p in enumerate(prompts):
        ref = generate_ar(TorchBackend(model, ctx_len=32), [p], max_new_tokens=10, sampling=GREEDY)
        assert data.tokens[i, len(p) : len(p) + 10].tolist() == ref.tokens[0]


def test_self_generate_teacher_equals_causal_pass():
    model = _target()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
    data = self_generate(model, prompts, [0.0, 1.0], gen_tokens=6, k=4, seed=1)
    for i in range(len(prompts)):
        n = int(data.mask[i].sum())
        with torch.no_grad():
            logp = torch.log_softmax(causal_logits(model, data.tokens[i : i + 1, : n + 1])[0], -1)
        ref_vals, ref_ids = torch.topk(logp[:n], 4, dim=-1)
        torch.testing.assert_close(data.topk_logp[i, :n], ref_vals, rtol=1e-4, atol=1e-4)
        assert torch.equal(data.topk_ids[i, :n], ref_ids)
        # the position after the last generated token has no teacher distribution
        assert n == len(prompts[i]) + 6 - 1


def test_self_generate_stops_rows_at_eos():
    model = _target()
    free = self_generate(model, [[1, 2]], [0.0], gen_tokens=8, k=2, seed=0)
    eos = int(free.tokens[0, 4])  # the third generated token, used as EOS
    data = self_generate(model, [[1, 2]], [0.0], gen_tokens=8, k=2, seed=0, eos_token_ids=(eos,))
    first = int(np.flatnonzero(data.tokens[0, 2:].numpy() == eos)[0]) + 2
    assert data.tokens[0, : first + 1].tolist() == free.tokens[0, : first + 1].tolist()
    assert not data.mask[0, first:].any() and data.tokens[0, first + 1 :].eq(0).all()


def test_teacher_data_roundtrip_concat_and_split():
    model = _target()
    a = teacher_topk(model, [[1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(20, 40))], k=3, batch_size=1)
    b = TeacherData.from_tensors(a.tensors())
    assert all(
        torch.equal(x, y) for x, y in zip((a.tokens, a.mask, a.topk_ids), (b.tokens, b.mask, b.topk_ids), strict=True)
    )
    c = TeacherData.concat([a, a.subset(torch.tensor([0]))])
    assert len(c) == 3 and c.num_positions == 8 + 19 + 8
    train, held = split_rows(20, 0.1, seed=0)
    assert len(held) == 2 and set(train.tolist()) | set(held.tolist()) == set(range(20))


def test_chat_prompt_template():
    assert chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

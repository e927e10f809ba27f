"""Exit-head training data from an existing distillation folder (``accel.drafts.early_exit_data``): a folder written
by ``ShardCache`` reads back unchanged and untouched, the states are the stage path's at the masked positions in
``topk_ids[mask]`` order, and foreign or damaged folders are clear errors; the shipped-head lookup."""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from accel.drafts.data import TeacherData, self_generate
from accel.drafts.distill_data import ShardCache
from accel.drafts.early_exit import exit_hidden, load_exit_head, shipped_exit_head
from accel.drafts.early_exit_data import exit_states, read_teacher_dir
from accel.errors import DraftError
from accel.models import Decoder, ModelConfig

VOCAB = 64


@pytest.fixture(scope="module")
def target() -> Decoder:
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=64)
    return Decoder(cfg).init_weights(5, std=0.35).eval()


@pytest.fixture()
def folder(target, tmp_path):
    """A build_data-style folder: settings.json and two gen shards of different lengths (ShardCache writes them)."""
    cache = ShardCache(tmp_path / "data")
    cache.stamp({"teacher_top_k": 8, "prompts": ["a", "b"], "gen_tokens": 6})
    parts = []
    for b, n in enumerate((5, 9)):
        prompts = [[1 + b, 2, 3], [4, 5 + b, 6, 7]]
        make = functools.partial(self_generate, target, prompts, [1.0, 0.0], n, 8, b)
        parts.append(cache.get(f"gen-{b:05d}", make))
    return tmp_path / "data", parts


def test_read_back_untouched_and_states_in_mask_order(target, folder):
    path, parts = folder
    before = {f.name: os.stat(f).st_mtime_ns for f in path.iterdir()}
    data = read_teacher_dir(path, vocab_size=VOCAB)
    assert {f.name: os.stat(f).st_mtime_ns for f in path.iterdir()} == before  # read only
    want = TeacherData.concat(parts)
    assert torch.equal(data.tokens, want.tokens) and torch.equal(data.mask, want.mask)
    assert torch.equal(data.topk_ids, want.topk_ids) and torch.equal(data.topk_logp, want.topk_logp)
    assert len(read_teacher_dir(path, vocab_size=VOCAB, max_shards=1)) == len(parts[0])

    states = exit_states(target, data, 2, batch_size=3, log=lambda _: None)  # batches cut across rows
    full = exit_hidden(target, data.tokens, 2)
    assert states.shape == (data.num_positions, 32)
    torch.testing.assert_close(states, full[data.mask], rtol=1e-4, atol=1e-4)  # other cache lengths


def test_foreign_or_damaged_folders(target, folder, tmp_path):
    path, _ = folder
    with pytest.raises(DraftError, match="does not exist"):
        read_teacher_dir(tmp_path / "nowhere", vocab_size=VOCAB)
    with pytest.raises(DraftError, match="vocabulary"):
        read_teacher_dir(path, vocab_size=10)
    with pytest.raises(DraftError, match="max_shards"):
        read_teacher_dir(path, vocab_size=VOCAB, max_shards=-1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DraftError, match=r"no settings\.json"):
        read_teacher_dir(empty, vocab_size=VOCAB)
    (empty / "settings.json").write_text(json.dumps({"teacher_top_k": 8}))
    with pytest.raises(DraftError, match="no data shards"):
        read_teacher_dir(empty, vocab_size=VOCAB)
    (empty / "settings.json").write_text("[1, 2]")
    with pytest.raises(DraftError, match="not a build_data settings"):
        read_teacher_dir(empty, vocab_size=VOCAB)

    (path / "settings.json").write_text(json.dumps({"teacher_top_k": 4}))
    with pytest.raises(DraftError, match=r"top-8, but settings\.json says top-4"):
        read_teacher_dir(path, vocab_size=VOCAB)
    (path / "settings.json").write_text(json.dumps({"teacher_top_k": 8}))
    shard = path / "gen-00001.safetensors"
    t = TeacherData.from_tensors(load_file(str(shard))).tensors()
    t["topk_logp"] = t["topk_logp"] + 1.0  # probabilities above 1
    save_file(t, str(shard))
    with pytest.raises(DraftError, match=r"gen-00001\.safetensors: topk_logp must be finite log-probabilities"):
        read_teacher_dir(path, vocab_size=VOCAB)
    save_file({"tokens": t["tokens"]}, str(shard))
    with pytest.raises(DraftError, match="expected tensors"):
        read_teacher_dir(path, vocab_size=VOCAB)
    shard.write_bytes(b"not a safetensors file")
    with pytest.raises(DraftError, match="not a readable safetensors shard"):
        read_teacher_dir(path, vocab_size=VOCAB)


def test_shipped_head_lookup(target):
    with pytest.raises(DraftError, match="no shipped exit head for layer 2"):
        shipped_exit_head(2)
    path = shipped_exit_head(15)
    assert path.name == "smollm2-exit-L15" and (path / "exit_head.safetensors").stat().st_size < 1_200_000
    with pytest.raises(DraftError, match="trained for a target"):
        load_exit_head(path, target)  # the SmolLM2 head refuses another target

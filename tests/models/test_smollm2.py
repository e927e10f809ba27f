"""SmolLM2-135M (GGUF, docs/reference.md §7): our GGUF loader and tokenizer vs transformers' GGUF loader.

Tolerance: SmolLM2's logits reach ~30; fp32 operation order (30 layers) moves them by ~3e-5, so ``atol=1e-3``
(a wrong Q/K un-permutation or a swapped weight changes them by O(1)).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from accel.backends import TorchBackend
from accel.errors import ModelError

try:
    from accel.models import smollm2_gguf_path

    GGUF = smollm2_gguf_path()
except ModelError as exc:  # pragma: no cover - the dev extra installs it
    pytest.skip(f"SmolLM2 is not installed: {exc}", allow_module_level=True)

from accel.models import load_tokenizer, smollm2_checkpoint
from accel.models.gguf_loader import _cached_reader, _reader
from tests.helpers.scenario import hf_reference, make_tokens, run_scenario, smollm2_model

PROMPTS = (3, 5)
TEXTS = [
    "Hello world, how are you?",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "  spaces\tand\nnewlines, ünïcödé and 日本語!",
]


@pytest.fixture(scope="module")
def ours():
    """Loaded through the cached conversion, so the comparison with transformers also covers smollm2_checkpoint."""
    return smollm2_model()


@pytest.fixture(scope="module")
def gguf_tok():
    return load_tokenizer(GGUF)  # parsing the GGUF metadata takes seconds: once per module


@pytest.mark.slow
def test_gguf_loader_matches_transformers(ours):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name).eval()
    rows = make_tokens(ours.config.vocab_size, PROMPTS, seed=3)
    ref = hf_reference(hf, rows)
    got = run_scenario(TorchBackend(ours, ctx_len=16, batch_size=2), rows, PROMPTS)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-3, rtol=0)
    assert ours.config.tie_word_embeddings and ours.config.num_kv_heads == 3


def test_gguf_tokenizer_matches_transformers(gguf_tok):
    from transformers import AutoTokenizer

    ours = gguf_tok
    theirs = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.token_to_id("<|im_end|>") == 2


def test_gguf_tokenizer_splits_digits(gguf_tok):
    # llama.cpp's "smollm" pre-tokenizer (and SmolLM2's tokenizer.json) split numbers into single digits
    assert gguf_tok.encode("12345").tokens == ["1", "2", "3", "4", "5"]


def test_smollm2_checkpoint_is_cached(ours, gguf_tok):
    directory = smollm2_checkpoint()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in directory.iterdir()}
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert smollm2_checkpoint() == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    for text in TEXTS:
        assert load_tokenizer(directory).encode(text).ids == gguf_tok.encode(text).ids


def test_the_kept_gguf_metadata_holds_few_python_objects():
    """The parsed file stays cached for the process; gguf's reader keeps a memmap and a dict per token and merge
    (~500 K objects for SmolLM2), which every full garbage collection during a decode walked. What is kept now is
    the fields' values: a few lists, whatever the vocabulary."""
    _cached_reader.cache_clear()
    gc.collect()
    before = len(gc.get_objects())
    parsed = _reader(GGUF)
    gc.collect()
    added = len(gc.get_objects()) - before
    assert len(parsed.fields["tokenizer.ggml.tokens"].data) == 49152
    assert parsed.fields["tokenizer.ggml.tokens"].contents()[0] == "<|endoftext|>"
    assert added < 20_000, added

"""GGUF tokenizers per pre-tokenizer type (``tokenizer.ggml.pre``) against transformers' tokenizers.

A byte-level BPE vocabulary is trained on a small corpus (code, chat templates, unicode, digits, whitespace runs),
written into tiny GGUF files that differ only in ``tokenizer.ggml.pre``, and each file's ``accel`` tokenizer is compared
token for token with transformers' tokenizer of the same file (and, for ``qwen2``, with ``Qwen2Tokenizer`` built from
the same vocabulary: the model family's own tokenizer, NFC included). The GPT-2 rule, which the loader used for every
file before, gives other tokens on the same corpus: the tests can fail.
"""

from __future__ import annotations

import json
import unicodedata

import pytest

from accel.errors import ModelError
from accel.models import ModelConfig
from accel.models.gguf_tokenizer import gguf_tokenizer
from accel.models.random_checkpoint import write_random_checkpoint

pytest.importorskip("transformers")

_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 1024; ++i) { total += values[i] * 31337; }",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "Prices rose 12345678 times in 2024: 3.14159, 2.71828 and 1,000,000.",
    "Unicode: naïve café, Größe, 東京タワー, emoji 🤖🚀, Ελληνικά, русский текст.",
    "whitespace   runs\t\ttabs\n\n\nnewlines    and trailing   ",
    "I'M SURE he'LL say it's fine, WE'VE done what THEY'D asked.",
    "CamelCaseIdentifiers andSnake_case_names and HTTPServerError",
    "line one\r\nline two\r\n\r\n  indented // comment /* block */",
    "e\u0301te\u0301 (decomposed accents) vs \u00e9t\u00e9",
]


@pytest.fixture(scope="module")
def vocab():
    """(tokens, merges, types) of a byte-level BPE trained on the corpus (digits and whitespace runs get merges)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # merges across words too
    trainer = trainers.BpeTrainer(
        vocab_size=900, special_tokens=_SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1
    )
    tok.train_from_iterator(CORPUS * 3 + ["12 123 1234 99999 2024 007"] * 5, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if t in _SPECIAL else 1 for t in tokens]
    return tokens, merges, types


def _gguf(tmp_path, vocab, pre: str | None, arch: str = "llama", add_bos: bool = False):
    tokens, merges, types = vocab
    cfg = ModelConfig(
        model_type=arch, vocab_size=len(tokens), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
        intermediate_size=64,
    )  # fmt: skip
    meta = dict(
        tokenizer_model="gpt2", tokenizer_pre=pre, token_list=tokens, token_merges=merges, token_types=types,
        bos_token_id=0, eos_token_id=2, add_bos_token=add_bos,
    )  # fmt: skip
    if pre is None:
        del meta["tokenizer_pre"]
    return write_random_checkpoint(cfg, tmp_path / f"{pre}.gguf", kind="gguf", tokenizer=meta)


def _transformers_ids(path, texts: list[str] = CORPUS) -> list[list[int]]:
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return [ref(text)["input_ids"] for text in texts]


@pytest.mark.parametrize(
    ("pre", "arch"),
    [("gpt-2", "llama"), ("llama-bpe", "llama"), ("qwen2", "qwen2"), ("tekken", "llama"), ("smollm", "llama")],
)
def test_matches_transformers_gguf_tokenizer(tmp_path, vocab, pre, arch):
    path = _gguf(tmp_path, vocab, pre, arch)
    ours = gguf_tokenizer(path)
    theirs = _transformers_ids(path)
    for text, ids in zip(CORPUS, theirs, strict=True):
        if pre == "qwen2" and unicodedata.normalize("NFC", text) != text:
            continue  # transformers' GGUF path skips Qwen2's NFC normalizer; test_qwen2_matches_qwen2_tokenizer
        if pre == "smollm" and any(c.isdigit() for c in text):
            continue  # transformers' GGUF path has no digit split for "smollm"; SmolLM2's tokenizer.json has it
        ids_ours = ours.encode(text).ids
        assert ids_ours == ids, (pre, text)
        expected = unicodedata.normalize("NFC", text) if pre == "qwen2" else text
        assert ours.decode(ids_ours, skip_special_tokens=False) == expected


def test_qwen2_matches_qwen2_tokenizer(tmp_path, vocab):
    """qwen2 against the family's own tokenizer class on the same vocabulary: NFC normalization included."""
    from transformers import Qwen2Tokenizer

    tokens, merges, _ = vocab
    ref = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges])
    ref.add_special_tokens({"additional_special_tokens": _SPECIAL})
    ours = gguf_tokenizer(_gguf(tmp_path, vocab, "qwen2", "qwen2"))
    for text in CORPUS:
        assert ours.encode(text).ids == ref(text)["input_ids"], text


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "tekken"])
def test_gpt2_rule_differs(tmp_path, vocab, pre):
    """The wrong variant: the plain GPT-2 split on the same vocabulary gives other tokens for these families."""
    arch = "qwen2" if pre == "qwen2" else "llama"
    right = gguf_tokenizer(_gguf(tmp_path, vocab, pre, arch))
    wrong = gguf_tokenizer(_gguf(tmp_path, vocab, "gpt-2", arch))
    assert any(right.encode(t).ids != wrong.encode(t).ids for t in CORPUS)


@pytest.mark.parametrize(
    ("pre", "words"),
    [
        ("gpt-2", ["12345"]),
        ("smollm", list("12345")),
        ("llama-bpe", ["123", "45"]),
        ("qwen2", list("12345")),
        ("default", ["123", "45"]),
    ],
)
def test_number_split(tmp_path, vocab, pre, words):
    """How each family splits a number before the merges (GPT-2: whole; SmolLM2, Qwen2: digits; Llama 3: by 3)."""
    tok = gguf_tokenizer(_gguf(tmp_path, vocab, pre, "qwen2" if pre == "qwen2" else "llama"))
    split = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str("12345")]
    assert split == words


def test_add_bos_token(tmp_path, vocab):
    """tokenizer.ggml.add_bos_token = true (Llama 3): BOS first, as transformers' tokenizer of the file."""
    path = _gguf(tmp_path, vocab, "llama-bpe", add_bos=True)
    ours = gguf_tokenizer(path)
    assert ours.encode("hello").ids[0] == 0
    assert [ours.encode(t).ids for t in CORPUS] == _transformers_ids(path)


def test_unknown_pre_tokenizer_is_refused(tmp_path, vocab):
    path = _gguf(tmp_path, vocab, "deepseek-llm")
    with pytest.raises(ModelError, match=r"tokenizer.ggml.pre='deepseek-llm' is not supported.*--tokenizer"):
        gguf_tokenizer(path)


#: llama.cpp's 'default' split (LLAMA_VOCAB_PRE_TYPE_DEFAULT), worked out by hand from its four regexes applied in
#: turn (punctuation runs incl. $+<=>^~|; GPT-2's regex without its last ``\s+``; digit runs; groups of 3 digits)
DEFAULT_SPLITS = [
    ("Hello, world!", ["Hello", ",", " world", "!"]),
    (" (x)", [" ", "(", "x", ")"]),  # GPT-2: " (", "x", ")"
    ("don't", ["don", "'", "t"]),  # the apostrophe is punctuation first; GPT-2: "don", "'t"
    (" 2024", [" ", "202", "4"]),  # GPT-2: " 2024"
    ("12345", ["123", "45"]),
    ("a  b\n\n c", ["a", " ", " b", "\n\n", " c"]),
    ("x+=1", ["x", "+=", "1"]),
    ("a`b", ["a", "`", "b"]),  # the backtick is a symbol, not punctuation: GPT-2's regex splits it
    ("$5.99|~^", ["$", "5", ".", "99", "|~^"]),
]


@pytest.mark.parametrize("pre", ["default", None])
def test_default_pre_tokenizer_is_llama_cpp_fallback(tmp_path, vocab, pre):
    """'default' or no tokenizer.ggml.pre: llama.cpp's fallback split, with a one-line warning naming it; the tokens
    are the GPT-2-split tokens of each hand-derived piece (so only the split is under test, and the GPT-2 rule on the
    whole text, the wrong variant, differs)."""
    from accel.errors import TokenizerWarning

    said = "is missing" if pre is None else "is 'default'"
    with pytest.warns(TokenizerWarning, match=rf"tokenizer.ggml.pre {said}: using llama.cpp's 'default'") as caught:
        tok = gguf_tokenizer(_gguf(tmp_path, vocab, pre))
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    gpt2 = gguf_tokenizer(_gguf(tmp_path, vocab, "gpt-2"))
    byte = lambda s: s.replace(" ", "\u0120").replace("\n", "\u010a")  # noqa: E731  (ByteLevel's symbols)
    split_differs = ids_differ = 0
    for text, pieces in DEFAULT_SPLITS:
        assert [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)] == [byte(p) for p in pieces], text
        expected = [i for p in pieces for i in gpt2.encode(p).ids]
        assert tok.encode(text).ids == expected, text
        assert tok.decode(expected) == text
        split_differs += [w for w, _ in gpt2.pre_tokenizer.pre_tokenize_str(text)] != [byte(p) for p in pieces]
        ids_differ += gpt2.encode(text).ids != expected
    assert split_differs == 4 and ids_differ >= 1  # " (x)", "don't", " 2024", "12345"


# ----------------------------------------------------------------------------------- SentencePiece (Llama 2, Mistral)


@pytest.fixture(scope="module")
def spm_vocab():
    """(tokens, scores, types) like a Llama 2 GGUF: <unk> <s> </s>, 256 byte tokens, then pieces by merge order."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=1, limit_alphabet=120)
    tok.train_from_iterator([t for t in CORPUS if "<|" not in t] * 3, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def _spm_gguf(tmp_path, spm_vocab, **extra):
    tokens, scores, types = spm_vocab
    cfg = ModelConfig(
        vocab_size=len(tokens), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    meta = dict(
        tokenizer_model="llama", token_list=tokens, token_scores=scores, token_types=types,
        bos_token_id=1, eos_token_id=2, unk_token_id=0, **extra,
    )  # fmt: skip
    return write_random_checkpoint(cfg, tmp_path / "spm.gguf", kind="gguf", tokenizer=meta)


def test_sentencepiece_matches_transformers(tmp_path, spm_vocab):
    """A Llama 2-style GGUF (SentencePiece BPE, byte fallback for the characters outside the vocabulary)."""
    path = _spm_gguf(tmp_path, spm_vocab)
    ours = gguf_tokenizer(path)
    texts = [*CORPUS, "a crab \U0001f980 and \u03a9 outside the vocabulary"]  # the last one needs byte fallback
    for text, ids in zip(texts, _transformers_ids(path, texts), strict=True):
        assert ours.encode(text).ids == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == text
    assert ours.encode("hello").ids[0] == 1  # BOS: llama.cpp's default for SentencePiece
    assert any(t.startswith("<0x") for t in ours.encode(texts[-1]).tokens)


def test_sentencepiece_merge_order_matters(tmp_path, spm_vocab):
    """The wrong variant: merges ranked by token id instead of score give other tokens."""
    tokens, scores, types = spm_vocab
    flipped = scores[:259] + [-s for s in scores[259:]]  # the last-learned piece now ranks first
    ours = gguf_tokenizer(_spm_gguf(tmp_path, (tokens, flipped, types)))
    right = gguf_tokenizer(_spm_gguf(tmp_path / "r", spm_vocab))
    assert any(ours.encode(t).ids != right.encode(t).ids for t in CORPUS)

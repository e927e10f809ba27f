"""The tokenizer of a GGUF file, built from its ``tokenizer.ggml.*`` metadata with the ``tokenizers`` package (no
transformers): byte-level BPE (``tokenizer.ggml.model = "gpt2"``) or SentencePiece BPE (``"llama"``: Llama 2,
Mistral 7B; merges ranked by the token scores, byte fallback, ``▁`` for spaces, BOS added unless the file says not).

A byte-level GGUF stores the vocabulary and the merges but not how text is split into words before the merges apply:
it names the rule in ``tokenizer.ggml.pre`` (llama.cpp's pre-tokenizer types). Each family below reproduces the split
of the models' own ``tokenizer.json``; any other name is refused, since the merges applied to differently split text
give the model input it was not trained on (give the model's ``tokenizer.json`` instead):

==========================================  =====================================================================
``tokenizer.ggml.pre``                      split before byte-level BPE
==========================================  =====================================================================
``gpt-2``, ``gpt2``                         GPT-2's regex (``ByteLevel(use_regex=True)``)
``smollm``, ``starcoder``, ``refact``,      every digit alone, then GPT-2's regex (SmolLM2, StarCoder)
``command-r``
``llama-bpe``, ``llama3``, ``llama-v3``,    Llama 3's regex: case-insensitive contractions, numbers in runs of
``smaug-bpe``                               up to 3 digits, a newline run kept apart
``qwen2``, ``deepseek-r1-qwen``             Qwen2's regex (Llama 3's with single digits), after NFC normalization
``tekken``                                  Mistral Tekken's regex (upper/lower case runs)
``default``, or no ``tokenizer.ggml.pre``   llama.cpp's fallback (``LLAMA_VOCAB_PRE_TYPE_DEFAULT``): four splits in
                                            turn, each keeping what it does not match as pieces too: runs of
                                            punctuation and ``$+<=>^~|``, GPT-2's regex, digit runs, then ``[0-9]{3}``
                                            groups from the left; with a ``TokenizerWarning`` naming it
==========================================  =====================================================================

Control tokens (``token_type`` 3) are special tokens, user-defined ones (4) are matched whole; BOS is prepended when
``tokenizer.ggml.add_bos_token`` is true (Llama 3), as the models' own tokenizers do.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from accel.errors import ModelError, TokenizerWarning
from accel.models.gguf_loader import _reader

__all__ = ["GGUF_PRE_TOKENIZERS", "gguf_tokenizer"]

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
#: llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (src/llama-vocab.cpp): splits applied one after the other
_DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

#: ``tokenizer.ggml.pre`` -> (family, split regex or None for GPT-2's, NFC normalization)
GGUF_PRE_TOKENIZERS: dict[str, tuple[str, str | None, bool]] = {
    "default": ("default", None, False),
    **{name: ("gpt2", None, False) for name in ("gpt-2", "gpt2")},
    **{name: ("digits+gpt2", None, False) for name in ("smollm", "starcoder", "refact", "command-r")},
    **{name: ("llama3", _LLAMA3, False) for name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")},
    **{name: ("qwen2", _QWEN2, True) for name in ("qwen2", "deepseek-r1-qwen")},
    "tekken": ("tekken", _TEKKEN, False),
}


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _pre_tokenizer(pre: str | None) -> tuple[Any, Any]:
    """(pre-tokenizer, normalizer or None) of a ``tokenizer.ggml.pre`` name; ModelError for an unknown one.

    No name (the key is absent, as in GGUFs converted before llama.cpp recorded it) means ``"default"``, as in
    llama.cpp; both warn (``TokenizerWarning``), since the fallback split may not be the model's own."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    if pre is None or pre == "default":
        said = "is missing" if pre is None else "is 'default'"
        warnings.warn(
            f"GGUF tokenizer.ggml.pre {said}: using llama.cpp's 'default' pre-tokenizer (punctuation runs, GPT-2's "
            "regex, digits in groups of 3); tokens may differ from the model's own tokenizer.json (--tokenizer)",
            TokenizerWarning,
            stacklevel=4,
        )
        isolated = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in _DEFAULT_SPLITS]
        return pre_tokenizers.Sequence(
            [*isolated, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        ), None
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ModelError(
            f"GGUF tokenizer.ggml.pre={pre!r} is not supported (its text split is unknown, so the tokens would differ "
            f"from the model's own tokenizer); supported: {', '.join(GGUF_PRE_TOKENIZERS)}. Give the model's "
            "tokenizer.json instead (--tokenizer)"
        )
    family, regex, nfc = GGUF_PRE_TOKENIZERS[pre]
    if regex is None:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        parts = [pre_tokenizers.Digits(individual_digits=True)] if family == "digits+gpt2" else []
        pre_tok = pre_tokenizers.Sequence([*parts, byte_level]) if parts else byte_level
    else:
        pre_tok = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tok, normalizers.NFC() if nfc else None


def gguf_tokenizer(path: str | Path) -> Any:
    """A ``tokenizers.Tokenizer`` for a GGUF file: ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, split by
    ``tokenizer.ggml.pre``) or ``"llama"`` (SentencePiece BPE with byte fallback: Llama 2, Mistral 7B).

    ``ModelError`` for another tokenizer model or a ``tokenizer.ggml.pre`` not in ``GGUF_PRE_TOKENIZERS``.
    """
    try:
        from tokenizers import AddedToken
    except ImportError as exc:
        raise ModelError("tokenizers is not installed: pip install tokenizers") from exc

    reader = _reader(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ModelError(
            f"GGUF tokenizer.ggml.model={kind!r} is not supported; supported: 'gpt2' (byte-level BPE), 'llama' "
            "(SentencePiece BPE). Give the model's tokenizer.json instead (--tokenizer)"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)]
    if len(types) != len(tokens):
        raise ModelError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    tok = _byte_level(reader, tokens) if kind == "gpt2" else _sentencepiece(reader, tokens)
    kinds = list(zip(tokens, types, strict=True))
    special = (2, 3) if kind == "llama" else (3,)  # control tokens; SentencePiece's <unk> (2) too
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in kinds if ty in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in kinds if ty == 4])  # user-defined
    _add_bos(tok, reader, tokens, default=kind == "llama")  # llama.cpp adds BOS to a SentencePiece vocabulary
    return tok


def _byte_level(reader: Any, tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models

    pre_tok, normalizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    tok.pre_tokenizer = pre_tok
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(reader: Any, tokens: list[str]) -> Any:
    """SentencePiece BPE: ``▁`` for spaces (and before the text when ``tokenizer.ggml.add_space_prefix``, the
    default), merges ranked by the scores of the tokens they make, unknown characters as ``<0xNN>`` byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scores = _field(reader, "tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelError("GGUF SentencePiece tokenizer without one tokenizer.ggml.scores entry per token")
    unk = _field(reader, "tokenizer.ggml.unknown_token_id", 0)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges_from_scores(vocab, [float(s) for s in scores]),
            unk_token=tokens[int(unk)],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(content=" ", left=1, right=0)] if prefix else steps)
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece vocabulary: every split of a token into two tokens, best token score first
    (ties: longer left piece, then longer right piece, then token order, then left/right piece ids)."""
    ranked: list[tuple[float, int, int, int, int, int, str, str]] = []
    for token, index in vocab.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], -len(left), -len(right), index, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(r[6], r[7]) for r in ranked]


def _add_bos(tok: Any, reader: Any, tokens: list[str], *, default: bool) -> None:
    """Prepend BOS when ``tokenizer.ggml.add_bos_token`` (or ``default`` when the file does not say)."""
    from tokenizers import processors

    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if _field(reader, "tokenizer.ggml.add_bos_token", default) and bos is not None:
        name = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name} $A", pair=f"{name} $A {name} $B", special_tokens=[(name, int(bos))]
        )

"""The byte-level BPE tokenizer of a GGUF file (``tokenizer.ggml.model = "gpt2"``), built from its
``tokenizer.ggml.*`` metadata with the ``tokenizers`` package (no transformers).

A GGUF stores the vocabulary and the merges but not how text is split into words before the merges apply: it names
the rule in ``tokenizer.ggml.pre`` (llama.cpp's pre-tokenizer types). Each family below reproduces the split of the
models' own ``tokenizer.json``; any other name is refused, since the merges applied to differently split text give the
model input it was not trained on (give the model's ``tokenizer.json`` instead):

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
==========================================  =====================================================================

Control tokens (``token_type`` 3) are special tokens, user-defined ones (4) are matched whole; BOS is prepended when
``tokenizer.ggml.add_bos_token`` is true (Llama 3), as the models' own tokenizers do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accel.errors import ModelError

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

#: ``tokenizer.ggml.pre`` -> (family, split regex or None for GPT-2's, NFC normalization)
GGUF_PRE_TOKENIZERS: dict[str, tuple[str, str | None, bool]] = {
    **{name: ("gpt2", None, False) for name in ("gpt-2", "gpt2")},
    **{name: ("digits+gpt2", None, False) for name in ("smollm", "starcoder", "refact", "command-r")},
    **{name: ("llama3", _LLAMA3, False) for name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")},
    **{name: ("qwen2", _QWEN2, True) for name in ("qwen2", "deepseek-r1-qwen")},
    "tekken": ("tekken", _TEKKEN, False),
}


def _reader(path: str | Path) -> Any:
    from accel.models.gguf_loader import _reader as read

    return read(path)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _pre_tokenizer(pre: str | None) -> tuple[Any, Any]:
    """(pre-tokenizer, normalizer or None) of a ``tokenizer.ggml.pre`` name; ModelError for an unknown one."""
    from tokenizers import Regex, normalizers, pre_tokenizers

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
    """A ``tokenizers.Tokenizer`` for a GGUF file with ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE).

    ``ModelError`` for another tokenizer model (SentencePiece ``llama`` files: give the model's ``tokenizer.json``)
    or a ``tokenizer.ggml.pre`` not in ``GGUF_PRE_TOKENIZERS``.
    """
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    except ImportError as exc:
        raise ModelError("tokenizers is not installed: pip install tokenizers") from exc

    reader = _reader(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(
            f"GGUF tokenizer.ggml.model={kind!r} is not supported; supported: 'gpt2' (byte-level BPE). Give the "
            "model's tokenizer.json instead (--tokenizer)"
        )
    pre_tok, normalizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)]
    if len(types) != len(tokens):
        raise ModelError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    tok.pre_tokenizer = pre_tok
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    kinds = list(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in kinds if ty == 3])  # control
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in kinds if ty == 4])  # user-defined
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        name = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{name} $A", pair=f"{name} $A {name} $B", special_tokens=[(name, int(bos))]
        )
    return tok

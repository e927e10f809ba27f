"""GGUF test helpers: tokenizer metadata for the tiny random GGUF files the tests write."""

from __future__ import annotations


def byte_tokenizer() -> dict:
    """GGUF tokenizer metadata: GPT-2's 256 byte symbols, a few merges, 16 control tokens (the first is EOS)."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll", "o Ġ", "Ġ w"]
    controls = [f"<|c{i}|>" for i in range(16)]
    tokens = symbols + [m.replace(" ", "") for m in merges] + controls
    types = [1] * (len(symbols) + len(merges)) + [3] * len(controls)
    return dict(
        tokenizer_model="gpt2",
        tokenizer_pre="gpt-2",
        token_list=tokens,
        token_merges=merges,
        token_types=types,
        eos_token_id=len(symbols) + len(merges),
    )


#: size of byte_tokenizer()'s vocabulary
BYTE_TOKENS = 256 + 5 + 16

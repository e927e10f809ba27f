"""Exception hierarchy shared by every subpackage.

Each subpackage raises its own subclass (``FormatError``, ``ModelError``, ``BackendError``, ``SpdError``, ``SimError``,
``DraftError``, ``SuperposedError``) so callers can catch one family; all are ``ValueError`` subclasses because they
describe bad input.
"""

from __future__ import annotations


class AccelError(ValueError):
    """Base class of every error accel raises on purpose."""


class FormatError(AccelError):
    """Bad input to ``accel.formats``: unknown format, wrong dtype/axis, corrupted or truncated file."""


class ModelError(AccelError):
    """Bad input to ``accel.models``: unsupported config field, missing or mismatched weights."""


class BackendError(AccelError):
    """Bad input to a backend: positions beyond ctx_len, wrong batch size, token ids out of vocab, bad graph."""


class SpdError(AccelError):
    """Bad input to the speculative decoding loop: vocab mismatch, K out of range, context exhausted."""


class SimError(AccelError):
    """Bad input to ``accel.sim``: unknown hardware or preset, negative sizes, alpha outside [0, 1], K < 1."""


class DraftError(AccelError):
    """Bad input to ``accel.drafts``: incompatible target/draft, missing or corrupted checkpoint."""


class NonFiniteWarning(UserWarning):
    """Compression kept NaN / ±Inf weights (``nonfinite="keep"``): the blocks holding them decode to NaN."""


class TokenizerWarning(UserWarning):
    """A tokenizer built from a file that does not say how it splits text (a GGUF without ``tokenizer.ggml.pre`` or
    with ``"default"``): the fallback rule used may give other tokens than the model's own tokenizer."""


class SuperposedError(AccelError):
    """Bad input to ``accel.superposed``: k < 1, weights that do not match the n-gram orders, a backend without
    mixed inputs, a store for another vocabulary."""


class NgramError(SuperposedError):
    """A bad n-gram store or query: not a store file, truncated, failing its checksum, unsorted, ids out of range."""


class CpuWarning(UserWarning):
    """A graph runs on a CPU whose instruction set is known to compute it less accurately (e.g. full-range int8
    weights on an x86 CPU without VNNI: docs/backends.md, "int8 on every x86 CPU")."""

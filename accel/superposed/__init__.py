"""Superposed Decoding (Shen et al. 2024, docs/reference.md §9): k drafts from one forward pass per token, filtered
by n-gram statistics; the n-gram store it reads; evaluation against nucleus sampling. See docs/superposed.md.

Needs numpy only (the backends it runs on bring their own runtimes); ``accel.superposed.corpus`` needs the
``tokenizers`` package, and self-written corpora need torch.
"""

from accel.errors import NgramError, SuperposedError
from accel.superposed.build import build_store
from accel.superposed.decode import Beams, Draft, SuperposedResult, superposed_generate
from accel.superposed.proposer import SuperposedProposer
from accel.superposed.scoring import TUNED, SuperposedConfig
from accel.superposed.store import NgramStore

__all__ = [
    "TUNED",
    "Beams",
    "Draft",
    "NgramError",
    "NgramStore",
    "SuperposedConfig",
    "SuperposedError",
    "SuperposedProposer",
    "SuperposedResult",
    "build_store",
    "superposed_generate",
]

"""``accel generate``'s flags as a ``DecodeSpec``.

The flags are checked first (``accel.apps.generate_options.check_generate_options``: every flag is used as given or
refused, naming the flag), then mapped onto the spec: ``--draft`` is a ``chain`` (a ``tree`` with ``--tree-nodes``),
``--hydra`` a ``hydra`` tree, ``--eagle3`` an ``eagle3`` chain (an ``eagle3_tree`` with ``--tree-nodes``),
``--ngram`` a ``lookup`` alone or first (``first_of``), or merged into the tree with ``--ngram-merge`` (``merge``).
Flags left out take the spec's defaults, and the spec validates the rest: without ``--autotune`` / ``--no-autotune``
a run with a proposer is autotuned unless a size flag (``--k``, ``--tree-nodes``, ``--tree-depth``,
``--min-draft-prob``, ``--ngram-k``) pins its shape.
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.apps.generate_options import check_generate_options
from accel.decode.spec import DecodeSpec

__all__ = ["spec_from_args"]


def _given(**fields: Any) -> dict[str, Any]:
    """The fields whose flag was given (not None): the others take the spec's defaults."""
    return {k: v for k, v in fields.items() if v is not None}


def _model_part(args: argparse.Namespace) -> dict[str, Any] | None:
    """The draft chain or tree, the Hydra tree, or the EAGLE-3 chain or tree of the flags (None: none of them)."""
    shared = _given(weights=args.draft_weights, threads=args.draft_threads)
    tree = _given(
        nodes=args.tree_nodes,
        top_k=args.tree_top_k,
        depth=args.tree_depth,
        min_prob=args.tree_min_prob,
        expand_prob=args.tree_expand_prob,
    )
    if args.hydra:
        return {"kind": "hydra", "heads": args.hydra, **tree, **shared}
    if args.eagle3 and args.tree_nodes is not None:
        return {"kind": "eagle3_tree", "head": args.eagle3, **tree, **shared}
    if args.eagle3:
        return {"kind": "eagle3", "head": args.eagle3, **_given(k=args.k, min_draft_prob=args.min_draft_prob), **shared}
    if args.draft and args.tree_nodes is not None:
        return {"kind": "tree", "draft": args.draft, **tree, **shared}
    if args.draft:
        return {
            "kind": "chain",
            "draft": args.draft,
            **_given(k=args.k),
            **_given(min_draft_prob=args.min_draft_prob),
            **shared,
        }
    return None


def _proposer(args: argparse.Namespace) -> dict[str, Any]:
    """The proposer of the flags: lookup first (or merged into the tree), then the draft or the heads."""
    model = _model_part(args)
    if not args.ngram:
        return model or {"kind": "none"}
    lookup = {"n": args.ngram, **_given(k=args.ngram_k or args.k)}
    if model is None:
        return {"kind": "lookup", **lookup}
    if args.ngram_merge:
        return {"kind": "merge", "lookup": lookup, "tree": model}
    return {"kind": "first_of", "lookup": lookup, "then": model}


def spec_from_args(args: argparse.Namespace) -> DecodeSpec:
    """The ``DecodeSpec`` of ``accel generate``'s flags (module docstring); ``SpdError`` for a flag that would be
    ignored, pydantic's ``ValidationError`` (naming the field) for a value the spec refuses."""
    check_generate_options(args)
    return DecodeSpec.model_validate(
        {
            "target": _given(
                path=args.target,
                weights=args.target_weights,
                backend=args.backend,
                ctx_len=args.ctx_len,
                threads=args.threads,
                device=args.device,
                dtype=args.dtype,
                mx_weights=args.mx_weights,
            ),
            "proposer": _proposer(args),
            "sampling": _given(
                greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
            ),
            **_given(max_new_tokens=args.max_new_tokens, tokenizer=args.tokenizer, autotune=args.autotune),
        }
    )

"""Checks of ``accel generate``'s flags that need no model: every flag is used as given or refused.

A flag that would be ignored (a tree setting without a tree, ``--exit-head`` or ``--ppd-k`` without ``--ppd``,
``--ctx-len`` with an ``.onnx`` target), silently replaced
(``--tree-nodes 0`` running the default tree, ``--tree-depth 0`` the default depth) or that contradicts another
(``--draft`` with ``--hydra``) is an ``SpdError`` naming the flag, the value and what it needs. These are rules about
the flags: which ``DecodeSpec`` (``accel.decode``) they describe. Rules about the decode itself (target weights on an
``.onnx`` file, Hydra heads on a ``.gguf`` target, value ranges) are the spec's validators; limits that need the
models (the target's context, the Hydra heads' depth) are checked where the models are opened (``DraftTree.check``,
``accel.drafts.hydra.open.hydra_tree_shape``).
"""

from __future__ import annotations

import argparse

from accel.errors import SpdError

__all__ = ["check_generate_options"]


def _positive(args: argparse.Namespace, name: str, flag: str) -> None:
    """SpdError unless ``args.<name>`` is None or an int >= 1."""
    value = getattr(args, name, None)
    if value is not None and value < 1:
        raise SpdError(f"{flag} must be an int >= 1; got {value}")


def _needs(cond: bool, flag: str, value: object, what: str) -> None:
    """SpdError saying that ``flag`` (given as ``value``) would be ignored unless ``what``."""
    if not cond:
        raise SpdError(f"{flag} {value} would be ignored: it needs {what}")


def check_generate_options(args: argparse.Namespace) -> None:
    """Refuse option values ``accel generate`` would otherwise clamp or ignore (module docstring)."""
    for name in (
        "k",
        "tree_nodes",
        "tree_depth",
        "tree_top_k",
        "ngram",
        "ngram_k",
        "draft_threads",
        "ppd_k",
        "ctx_len",
    ):
        _positive(args, name, "--" + name.replace("_", "-"))
    draft, hydra = bool(args.draft), bool(getattr(args, "hydra", None))
    tree = hydra or (draft and args.tree_nodes is not None)
    tree_what = "a tree: --tree-nodes with --draft, or --hydra"
    for name in ("tree_depth", "tree_top_k", "tree_min_prob", "tree_expand_prob"):
        if getattr(args, name) is not None:
            _needs(tree, "--" + name.replace("_", "-"), getattr(args, name), tree_what)
    if getattr(args, "k", None) is not None:  # a chain's length, or lookup's when --ngram-k is not given
        _needs(
            (draft and not tree) or (bool(args.ngram) and args.ngram_k is None),
            "--k",
            args.k,
            "a draft chain (--draft without a tree) or --ngram (without --ngram-k); a tree's size is --tree-nodes",
        )
    if args.min_draft_prob is not None:
        _needs(draft and not tree, "--min-draft-prob", args.min_draft_prob, "a draft chain: --draft without a tree")
    if args.ngram_k is not None:
        _needs(bool(args.ngram), "--ngram-k", args.ngram_k, "--ngram")
    if args.draft_weights is not None:
        _needs(draft or hydra, "--draft-weights", args.draft_weights, "--draft or --hydra")
    if args.draft_threads is not None:
        _needs(draft or hydra, "--draft-threads", args.draft_threads, "--draft or --hydra")
    if getattr(args, "exit_head", None) is not None:
        _needs(args.ppd is not None, "--exit-head", args.exit_head, "--ppd EXIT_LAYER")
    if getattr(args, "ppd_k", None) is not None:
        _needs(args.ppd is not None, "--ppd-k", args.ppd_k, "--ppd EXIT_LAYER")
    target = str(getattr(args, "target", None) or "")
    if getattr(args, "ctx_len", None) is not None and target.endswith(".onnx"):
        _needs(False, "--ctx-len", args.ctx_len, "a checkpoint directory or .gguf target (an .onnx file keeps its own)")
    _check_proposer_flags(args)


def _check_proposer_flags(args: argparse.Namespace) -> None:
    """The flags that choose the proposer must name one: a draft or heads (not both), a tree with something to grow
    it, lookup merged only into a tree."""
    hydra = getattr(args, "hydra", None)
    if hydra and args.draft:
        raise SpdError("give --draft or --hydra, not both")
    if args.tree_nodes is not None and not (args.draft or hydra):
        raise SpdError("--tree-nodes needs a draft model (--draft) or Hydra heads (--hydra) to build the trees with")
    if args.ngram_merge and not (args.ngram and (hydra or (args.draft and args.tree_nodes))):
        raise SpdError("--ngram-merge joins lookup into a tree: give --ngram and --tree-nodes with --draft, or --hydra")

"""Checks of ``accel generate``'s flags that need no model: every flag is used as given or refused.

A flag that would be ignored (a tree setting without a tree, ``--exit-head`` or ``--ppd-k`` without ``--ppd``,
``--ctx-len`` with an ``.onnx`` target), silently replaced (``--tree-nodes 0`` running the default tree,
``--tree-depth 0`` the default depth) or that contradicts another (``--draft`` with ``--hydra`` or ``--eagle3``) is an
``SpdError`` naming the flag, the value and what it needs. These are rules about the flags: which ``DecodeSpec``
(``accel.decode``) they describe. Rules about the decode itself (target weights on an ``.onnx`` file, Hydra heads on a
``.gguf`` target, an EAGLE-3 head on an ``.onnx`` target, value ranges) are the spec's validators; limits that need
the models (the target's context, the Hydra heads' depth) are checked where the models are opened
(``DraftTree.check``, ``accel.drafts.hydra.open.hydra_tree_shape``).
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
    draft, hydra, eagle3 = bool(args.draft), bool(getattr(args, "hydra", None)), bool(getattr(args, "eagle3", None))
    chain_model = draft or eagle3  # a model that proposes a chain, or a tree with --tree-nodes
    tree = hydra or (chain_model and args.tree_nodes is not None)
    tree_what = "a tree: --tree-nodes with --draft or --eagle3, or --hydra"
    for name in ("tree_depth", "tree_top_k", "tree_min_prob", "tree_expand_prob"):
        if getattr(args, name) is not None:
            _needs(tree, "--" + name.replace("_", "-"), getattr(args, name), tree_what)
    if getattr(args, "k", None) is not None:  # a chain's length, or lookup's when --ngram-k is not given
        _needs(
            (chain_model and not tree) or (bool(args.ngram) and args.ngram_k is None),
            "--k",
            args.k,
            "a chain (--draft or --eagle3 without --tree-nodes) or --ngram (without --ngram-k); a tree's size is "
            "--tree-nodes",
        )
    if args.min_draft_prob is not None:
        what = "a chain: --draft or --eagle3 without --tree-nodes"
        _needs(chain_model and not tree, "--min-draft-prob", args.min_draft_prob, what)
    if args.ngram_k is not None:
        _needs(bool(args.ngram), "--ngram-k", args.ngram_k, "--ngram")
    if args.draft_weights is not None:
        _needs(draft or hydra, "--draft-weights", args.draft_weights, "--draft or --hydra")
    if args.draft_threads is not None:
        _needs(draft or hydra or eagle3, "--draft-threads", args.draft_threads, "--draft, --hydra or --eagle3")
    if getattr(args, "exit_head", None) is not None:
        _needs(args.ppd is not None, "--exit-head", args.exit_head, "--ppd EXIT_LAYER")
    if getattr(args, "ppd_k", None) is not None:
        _needs(args.ppd is not None, "--ppd-k", args.ppd_k, "--ppd EXIT_LAYER")
    target = str(getattr(args, "target", None) or "")
    if getattr(args, "ctx_len", None) is not None and target.endswith(".onnx"):
        _needs(False, "--ctx-len", args.ctx_len, "a checkpoint directory or .gguf target (an .onnx file keeps its own)")
    _check_proposer_flags(args)


def _check_proposer_flags(args: argparse.Namespace) -> None:
    """The flags that choose the proposer must name one: a draft, Hydra heads or an EAGLE-3 head (one of them), a
    tree with something to grow it, lookup merged only into a tree."""
    hydra, eagle3 = getattr(args, "hydra", None), getattr(args, "eagle3", None)
    given = [flag for flag, value in (("--draft", args.draft), ("--hydra", hydra), ("--eagle3", eagle3)) if value]
    if len(given) > 1:
        raise SpdError(f"give one of --draft, --hydra and --eagle3, not {' and '.join(given)}")
    if args.tree_nodes is not None and not given:
        raise SpdError(
            "--tree-nodes needs a draft model (--draft), Hydra heads (--hydra) or an EAGLE-3 head (--eagle3) to build "
            "the trees with"
        )
    if args.ngram_merge and not (args.ngram and (hydra or ((args.draft or eagle3) and args.tree_nodes))):
        raise SpdError(
            "--ngram-merge joins lookup into a tree: give --ngram and --tree-nodes with --draft or --eagle3, or --hydra"
        )

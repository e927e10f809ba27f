"""``build(spec)``: the backends and proposer a ``DecodeSpec`` describes, ready for ``accel.spd.generate``.

The proposer is built first, from its own files (a draft model, Hydra heads); the target is then opened with what
the proposer declares it needs (``ProposerInfo.needs_hidden``: the target's hidden states; ``ProposerInfo.branching``:
tree inputs), so no caller decides the target's graph from the kind of draft. On ``backend="ort"`` a checkpoint
(directory or ``.gguf``) is exported once per settings and cached in ``$ACCEL_CACHE/onnx``
(``accel.backends.export_cached``); an ``.onnx`` file is used as it is. An EAGLE-3 head (``accel.serving``) reads
the target's states at its aux layers: the head and that target graph are exported together and cached the same way
(``_eagle3_graphs``). A draft checkpoint directory is first checked for NaN or infinite weights, once per version
of its files (``accel.decode.draft_check``). Everything runs batch 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from accel.backends.base import Backend
from accel.backends.weights import WeightFormat
from accel.decode.draft_check import check_draft_weights
from accel.decode.eagle3 import eagle3_proposer, eagle3_target
from accel.decode.files import find_tokenizer, is_gguf, model_config, onnx_inputs
from accel.decode.opening import (
    WIDE_DRAFT_PARAMS,
    GraphNeeds,
    Opener,
    TorchPlacement,
    draft_threads,
    open_backend,
    open_exit_stage,
)
from accel.decode.proposers import (
    ARSpec,
    ChainSpec,
    DraftModelSpec,
    Eagle3ChainSpec,
    Eagle3TreeSpec,
    EarlyExitSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    MergeSpec,
    ModelPartSpec,
    SuperposedSpec,
    TreeSpec,
)
from accel.decode.spec import DecodeSpec, TargetSpec
from accel.spd import (
    DraftChain,
    DraftTree,
    FirstOf,
    GenerationResult,
    Merge,
    NgramLookup,
    Proposer,
    Sampling,
    StreamCallback,
    check_compatible,
    generate,
)
from accel.spd.autotune import AutoTune, draft_arms
from accel.superposed import NgramStore, SuperposedConfig
from accel.superposed.proposer import SuperposedProposer
from accel.superposed.scoring import TUNED

__all__ = [
    "AUTOTUNE_TREE_NODES",
    "WIDE_DRAFT_PARAMS",
    "DecodeSetup",
    "GraphNeeds",
    "Opener",
    "build",
    "draft_threads",
    "open_backend",
]

#: the largest draft tree the controller may choose when the spec names no tree size (a chain or tree spec without
#: ``nodes``): the shipped feature draft's trees of 4-8 nodes were its best on 2-core CPUs (docs/spd.md)
AUTOTUNE_TREE_NODES = 8


@dataclass
class DecodeSetup:
    """What ``build`` returns: the opened target, the proposer (None: autoregressive), the tokenizer (None: prompts
    are token ids) and the stop tokens, with the spec they came from; ``drafts``: the draft models' backends the
    proposer runs (for timing them; none for lookup, Hydra heads or an EAGLE-3 head)."""

    spec: DecodeSpec
    target: Backend
    proposer: Proposer | None
    tokenizer: Any
    eos_token_id: int | list[int] | None
    drafts: tuple[Backend, ...] = ()

    @property
    def sampling(self) -> Sampling:
        """The spec's warps as an ``accel.spd.Sampling``."""
        return self.spec.sampling.sampling()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]] | np.ndarray,
        stream: StreamCallback | None = None,
        seed: int | None = None,
    ) -> GenerationResult:
        """``accel.spd.generate`` with this setup's backends, proposer, warps, seed (``seed``: another one, e.g. one
        per prompt of a benchmark), token limit and stop tokens (one prompt: the backends run batch 1)."""
        spec = self.spec
        return generate(
            self.target,
            self.proposer,
            prompt_ids,
            max_new_tokens=spec.max_new_tokens,
            sampling=self.sampling,
            seed=spec.sampling.seed if seed is None else seed,
            eos_token_id=self.eos_token_id,
            stream=stream,
        )


def build(spec: DecodeSpec, tokenizer: Any = None, opener: Opener | None = None) -> DecodeSetup:
    """Open what ``spec`` describes (module docstring). ``tokenizer``: one already loaded for the target (None: found
    as ``spec.tokenizer`` or beside the target). ``opener``: backends shared with the other builds given the same one
    (``Opener``; None: this build's own). Raises the ``SpdError`` / ``BackendError`` / ``DraftError`` of the file or
    combination that fails (a draft whose vocabulary differs from the target's, heads deeper than asked)."""
    t = spec.target
    if is_gguf(t.path):  # parsing a GGUF's metadata (the tokenizer's every token and merge) takes seconds to a minute
        mb = t.path.stat().st_size / 1e6
        print(f"reading {t.path.name} ({mb:.0f} MB): GGUF metadata and tokenizer ...", file=sys.stderr, flush=True)
    eos = spec.eos_token_id if spec.eos_token_id is not None else model_config(t.path).get("eos_token_id")
    if tokenizer is None:
        tokenizer = find_tokenizer(spec.tokenizer, t.path)
    drafts = _Drafts(opener or Opener())
    arms = _autotune_arms(spec, drafts) if spec.autotune else None
    proposer = AutoTune(arms) if arms is not None else _proposer(spec, drafts)
    info = proposer.info if proposer is not None else None
    target = drafts.opener.target(
        eagle3_target(spec) or t.path,  # an EAGLE-3 head's target: the export with its aux layers' states
        t,
        GraphNeeds(bool(info and info.needs_hidden), bool(info and info.branching)),
        spin=proposer is None,  # no draft session alternates with the target's calls: let its pool spin
    )
    for draft, path in drafts.opened:
        check_compatible(target, draft, tokenizer, find_tokenizer(None, path) if tokenizer is not None else None)
    if spec.autotune and proposer is not None:
        if not isinstance(proposer, AutoTune):
            proposer = AutoTune(proposer)
        proposer.probe(target)  # the call-cost curve at every budget before the first round (SpdError if it fails)
    return DecodeSetup(spec, target, proposer, tokenizer, eos, tuple(d for d, _ in drafts.opened))


@dataclass
class _Drafts:
    """The draft backends one build opened through ``opener`` (checked against the target once it is open)."""

    opener: Opener
    opened: list[tuple[Backend, Path]] = field(default_factory=list)


def _proposer(spec: DecodeSpec, drafts: _Drafts) -> Proposer | None:
    """The proposer of ``spec.proposer`` (lookup first in a combination); draft backends it opened go to ``drafts``."""
    p = spec.proposer
    if isinstance(p, ARSpec):
        return None
    if isinstance(p, LookupSpec):
        return NgramLookup(p.n, p.k)
    if isinstance(p, FirstOfSpec):
        return FirstOf(NgramLookup(p.lookup.n, p.lookup.k), _model_proposer(p.then, spec.target, drafts))
    if isinstance(p, MergeSpec):
        return Merge(NgramLookup(p.lookup.n, p.lookup.k), _model_proposer(p.tree, spec.target, drafts))
    return _model_proposer(p, spec.target, drafts)


def _autotune_arms(spec: DecodeSpec, drafts: _Drafts) -> list[Proposer] | None:
    """The shapes the controller chooses between for a draft model (``accel.spd.autotune.draft_arms``): n-gram lookup
    first then a draft chain, the chain alone, and a draft tree merged with lookup (where the target's and the draft's
    graphs take tree inputs and the target's activations are not int8), over one draft backend. The spec's lookup, chain
    length ``k`` and tree settings size them (defaults: lookup n=3 k=4, chains of up to 4, trees of up to
    ``AUTOTUNE_TREE_NODES``). None for a proposer without a draft model (lookup alone, Hydra heads): the controller then
    sizes that one proposer."""
    parts = spec.model_parts()
    if not parts or not isinstance(parts[0], ChainSpec | TreeSpec):
        return None
    part, p = parts[0], spec.proposer
    look = p.lookup if isinstance(p, FirstOfSpec | MergeSpec) else LookupSpec()
    t = spec.target
    trees = not t.weights.int8_activations and (t.path.suffix != ".onnx" or "tree_mask" in onnx_inputs(t.path))
    draft = _open_draft(part, t, GraphNeeds(tree=trees), drafts)
    trees = trees and "tree" in draft.info.capabilities  # an .onnx draft is used as it was exported
    k = part.k if isinstance(part, ChainSpec) else min(part.nodes, 4)
    tree = None
    if trees:
        tree = (
            DraftTree(draft, part.nodes, part.top_k, part.depth, part.min_prob, part.expand_prob)
            if isinstance(part, TreeSpec)
            else DraftTree(draft, nodes=AUTOTUNE_TREE_NODES)
        )
    return draft_arms(draft, k=k, lookup=(look.n, look.k), tree=tree, trees=trees)


def _model_proposer(p: ModelPartSpec, target: TargetSpec, drafts: _Drafts) -> Proposer:
    if isinstance(p, HydraTreeSpec):
        return _hydra(p, target, drafts.opener)
    if isinstance(p, Eagle3ChainSpec | Eagle3TreeSpec):
        return eagle3_proposer(p, target)
    if isinstance(p, EarlyExitSpec):
        return _early_exit(p, target, drafts.opener)
    if isinstance(p, SuperposedSpec):
        return _superposed(p, target, drafts)
    draft = _open_draft(p, target, GraphNeeds(tree=isinstance(p, TreeSpec)), drafts)
    if isinstance(p, TreeSpec):
        return DraftTree(
            draft, nodes=p.nodes, top_k=p.top_k, depth=p.depth, min_prob=p.min_prob, expand_prob=p.expand_prob
        )
    return DraftChain(draft, k=p.k, min_draft_prob=p.min_draft_prob)


def _open_draft(p: DraftModelSpec, target: TargetSpec, needs: GraphNeeds, drafts: _Drafts) -> Backend:
    """The draft backend (kept in ``drafts``): int8 for a feature draft unless told otherwise; threads by the draft's
    size (``draft_threads``), the target's on torch (torch threads are global); the graph inputs ``needs`` asks for
    (tree inputs for a ``DraftTree``, mixed inputs for superposed drafts)."""
    feature = bool(model_config(p.draft).get("accel_feature_size"))
    check_draft_weights(p.draft)
    if target.backend != "ort":
        threads = target.threads
    else:
        threads = p.threads if p.threads is not None else draft_threads(p.draft, target.threads, feature)
    weights = p.weights or (WeightFormat.INT8 if feature else WeightFormat.FP32)
    draft = drafts.opener.open(
        p.draft,
        target.backend,
        target.ctx_len,
        threads,
        weights=weights,
        needs=needs,
        placement=TorchPlacement(target.device, target.dtype),
    )
    drafts.opened.append((draft, p.draft))
    return draft


def _hydra(p: HydraTreeSpec, target: TargetSpec, opener: Opener) -> Proposer:
    """The Hydra proposer of this part (``accel.drafts.hydra.open``: the tree shape checked against the heads first,
    then the heads exported once and cached; one per ``opener`` for the same heads, shape and settings)."""
    from accel.drafts.hydra.open import hydra_tree_shape, open_hydra

    shape = hydra_tree_shape(
        p.heads,
        nodes=p.nodes,
        top_k=p.top_k,
        depth=p.depth,
        min_prob=p.min_prob,
        expand_prob=p.expand_prob,
        kernel_target=target.weights.is_kernel,
    )
    key = ("hydra", p.heads.resolve(), target.path.resolve(), shape, target.ctx_len, p.weights, p.threads)
    return opener.shared(
        key,
        lambda: open_hydra(
            p.heads, target.path, shape, ctx_len=target.ctx_len, weights=p.weights, threads=p.threads or 1
        ),
    )


def _early_exit(p: EarlyExitSpec, target: TargetSpec, opener: Opener) -> Proposer:
    """PPD's candidates on this loop: an ``EarlyExit`` over the target's exit stage (one per ``opener`` for the same
    target, layer, head and threads)."""
    from accel.spd.exit_proposer import EarlyExit

    threads = p.threads if p.threads is not None else target.threads
    key = ("exit", target.path.resolve(), target.backend, target.ctx_len, p.exit_layer, str(p.exit_head), threads)
    front = opener.shared(key, lambda: open_exit_stage(target, p.exit_layer, p.exit_head, threads))
    return EarlyExit(front, k=p.k)


def _superposed(p: SuperposedSpec, target: TargetSpec, drafts: _Drafts) -> Proposer:
    """Superposed drafts of the draft model (exported with mixed inputs), scored with the n-gram store if given (the
    tuned interpolation) or by the draft's log-probabilities alone."""
    draft = _open_draft(p, target, GraphNeeds(mix=True), drafts)
    store = NgramStore.load(p.store) if p.store is not None else None
    config = replace(TUNED if store is not None else SuperposedConfig(), k=p.k, temperature=p.temperature)
    return SuperposedProposer(draft, p.depth, config, store)

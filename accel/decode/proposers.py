"""The proposer of a ``DecodeSpec``: a discriminated union on ``kind``, one part per kind of proposer.

=========== ==========================================================================================
``none``     autoregressive decoding (the target alone)
``chain``    a draft model's chain of up to ``k`` tokens (``accel.spd.DraftChain``)
``tree``     a draft model's dynamic token tree (``accel.spd.DraftTree``)
``hydra``    a tree grown from Hydra heads (``accel.drafts.hydra.HydraProposer``)
``eagle3``   an EAGLE-3 head in the speculators format: a chain of up to ``k`` tokens (``DraftChain``)
``eagle3_tree`` an EAGLE-3 head's dynamic token tree (``DraftTree``)
``lookup``   n-gram lookup drafts alone (``accel.spd.NgramLookup``)
``first_of`` lookup first, a model's chain or tree where lookup has no match (``accel.spd.FirstOf``)
``merge``    lookup's chain joined into a model's tree every round (``accel.spd.Merge``)
``early_exit`` PPD's candidates on this loop: the target's early exit proposes its top ``k`` tokens
             (``accel.spd.exit_proposer.EarlyExit``; the pipelined PPD schedule is ``accel generate --ppd``)
``superposed`` k superposed drafts of a draft model, proposed as one tree
             (``accel.superposed.proposer.SuperposedProposer``)
=========== ==========================================================================================

Each part checks its own fields; the rules that tie a part to the target are ``DecodeSpec``'s (``accel.decode.spec``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from accel.backends.weights import WeightFormat
from accel.decode.parts import Part, probability_below_1

__all__ = [
    "SHAPE_FIELDS",
    "ARSpec",
    "ChainSpec",
    "DraftModelSpec",
    "Eagle3ChainSpec",
    "Eagle3Spec",
    "Eagle3TreeSpec",
    "EarlyExitSpec",
    "FirstOfSpec",
    "HydraTreeSpec",
    "HydraWeights",
    "LookupSpec",
    "MergeSpec",
    "ModelPartSpec",
    "ProposerSpec",
    "SuperposedSpec",
    "TreeSpec",
]

#: the weight modes Hydra heads export with (``accel.drafts.hydra.export.HYDRA_WEIGHTS``)
HydraWeights = Literal["fp32", "int8"]

#: the fields that fix a round's size: given explicitly, they pin the shape and ``autotune`` defaults to off
SHAPE_FIELDS = ("k", "nodes", "depth", "min_draft_prob")


class ARSpec(Part):
    """No proposer: the target decodes autoregressively."""

    kind: Literal["none"] = "none"


class _DraftModel(Part):
    """A draft model: its path, export weights and threads.

    Attributes:
        draft: a checkpoint directory, ``.gguf`` file or ``.onnx`` file with the target's vocabulary; a feature draft
            (``accel.drafts.feature``) reads the target's hidden states.
        weights: export weights of a draft checkpoint on onnxruntime (None: int8 for a feature draft, fp32 otherwise).
        threads: onnxruntime intra-op threads of the draft (None: 1 below 20 M parameters, else the target's).
    """

    draft: Path
    weights: WeightFormat | None = None
    threads: int | None = Field(None, ge=1)


class ChainSpec(_DraftModel):
    """A draft chain of up to ``k`` tokens per round, ended early after a proposal the draft gave less than
    ``min_draft_prob`` (``DraftChain``)."""

    kind: Literal["chain"] = "chain"
    k: int = Field(4, ge=1)
    min_draft_prob: float | None = Field(None, ge=0.0, le=1.0)


class _TreeShape(Part):
    """The shape settings shared by draft trees and Hydra trees (``DraftTree``'s names)."""

    top_k: int = Field(4, ge=1)
    depth: int | None = Field(None, ge=1)
    min_prob: float = 0.0
    expand_prob: float | None = None

    @field_validator("min_prob", "expand_prob")
    @classmethod
    def _probabilities(cls, value: float | None, info: ValidationInfo) -> float | None:
        return probability_below_1(info.field_name or "probability", value)


class TreeSpec(_DraftModel, _TreeShape):
    """A draft model's dynamic token tree of up to ``nodes`` nodes (``DraftTree``; the draft and the target are
    exported with tree inputs)."""

    kind: Literal["tree"] = "tree"
    nodes: int = Field(4, ge=1)


class HydraTreeSpec(_TreeShape):
    """Trees grown from Hydra heads (``accel distill-hydra``), one head call per level.

    Attributes:
        heads: the heads directory; the target must be their checkpoint directory (the heads read its embeddings).
        nodes: the node budget (None: 4, or 3 on a ``*-kernel`` target; ``accel.drafts.hydra.tree``).
        weights: the heads' export weights (int8 or fp32).
        threads: onnxruntime threads of the heads (None: 1).
    """

    kind: Literal["hydra"] = "hydra"
    heads: Path
    nodes: int | None = Field(None, ge=1)
    weights: HydraWeights = "int8"
    threads: int | None = Field(None, ge=1)


class _Eagle3Head(Part):
    """An EAGLE-3 draft head saved in the ``speculators`` format (vLLM's draft library; docs/serving.md, "EAGLE-3
    heads"), run on onnxruntime as a feature draft (float32 weights).

    Attributes:
        head: the checkpoint folder (``config.json`` with ``speculators_model_type: eagle3``, safetensors weights);
            the target must be the checkpoint it was trained for (directory or ``.gguf``, backend ``ort``: it is
            exported with the hidden states of the head's aux layers). A head saved without ``embed_tokens`` reads
            the target's.
        threads: onnxruntime intra-op threads of the head (None: the target's; its matmuls are as wide as the
            target's).
    """

    head: Path
    threads: int | None = Field(None, ge=1)


class Eagle3ChainSpec(_Eagle3Head):
    """An EAGLE-3 head's chain of up to ``k`` tokens per round (3: speculators' usual ``speculative_tokens``), ended
    early after a proposal the head gave less than ``min_draft_prob`` (``DraftChain``)."""

    kind: Literal["eagle3"] = "eagle3"
    k: int = Field(3, ge=1)
    min_draft_prob: float | None = Field(None, ge=0.0, le=1.0)


class Eagle3TreeSpec(_Eagle3Head, _TreeShape):
    """An EAGLE-3 head's dynamic token tree of up to ``nodes`` nodes (``DraftTree``; the head and the target are
    exported with tree inputs)."""

    kind: Literal["eagle3_tree"] = "eagle3_tree"
    nodes: int = Field(4, ge=1)


#: the proposer parts that run an EAGLE-3 head
Eagle3Spec = Eagle3ChainSpec | Eagle3TreeSpec


class EarlyExitSpec(Part):
    """PPD's candidates as a proposer of the speculative decoding loop (``EarlyExit``): each round the target's exit
    after ``exit_layer`` layers proposes its top ``k`` next tokens as a depth-1 tree (one accepted at most).

    Attributes:
        exit_layer: layers of the exit stage ``[0, exit_layer)`` (1 .. the target's layers - 1).
        k: candidates per round (k > 1: the target takes tree inputs).
        exit_head: a trained exit head directory (``examples/build_exit_head.py``), ``"shipped"``: the head for
            SmolLM2-135M shipped at ``exit_layer``; None: the plain exit (the target's final norm and LM head).
        threads: onnxruntime threads of the exit stage (None: the target's).
    """

    kind: Literal["early_exit"] = "early_exit"
    exit_layer: int = Field(ge=1)
    k: int = Field(3, ge=1)
    exit_head: Literal["shipped"] | Path | None = None
    threads: int | None = Field(None, ge=1)


class SuperposedSpec(_DraftModel):
    """k superposed drafts of ``depth`` tokens per round from ``depth`` draft calls, proposed as one tree
    (``SuperposedProposer``; the draft is exported with mixed inputs, the target with tree inputs when ``k > 1``).

    Attributes:
        k: drafts kept alive per round (Superposed Decoding's k).
        depth: draft tokens per draft (1..64); the tree has at most ``k * depth`` nodes.
        temperature: applied to the draft's logits before its log-softmax (1.0: the draft's own distribution).
        store: an n-gram store file (``accel ngrams build``) whose counts join the drafts' scores (the tuned
            interpolation, ``accel.superposed.scoring.TUNED``); None: the draft's log-probabilities alone.
    """

    kind: Literal["superposed"] = "superposed"
    k: int = Field(3, ge=1)
    depth: int = Field(4, ge=1, le=64)
    temperature: float = Field(1.0, gt=0.0)
    store: Path | None = None


#: the proposer parts that run a draft model
DraftModelSpec = ChainSpec | TreeSpec | SuperposedSpec
#: the proposer parts that run a model (a draft, Hydra heads, an EAGLE-3 head, an exit stage)
ModelPartSpec = ChainSpec | TreeSpec | HydraTreeSpec | Eagle3ChainSpec | Eagle3TreeSpec | EarlyExitSpec | SuperposedSpec


class LookupSpec(Part):
    """N-gram lookup: what followed the last earlier occurrence of the context's last ``n`` tokens (down to 2), up to
    ``k`` tokens (``NgramLookup``)."""

    kind: Literal["lookup"] = "lookup"
    n: int = Field(3, ge=1)
    k: int = Field(4, ge=1)


ModelProposer = Annotated[
    ChainSpec | TreeSpec | HydraTreeSpec | Eagle3ChainSpec | Eagle3TreeSpec, Field(discriminator="kind")
]
TreeProposer = Annotated[TreeSpec | HydraTreeSpec | Eagle3TreeSpec, Field(discriminator="kind")]


class FirstOfSpec(Part):
    """Lookup where it matches, else the chain or tree of ``then`` (``FirstOf``)."""

    kind: Literal["first_of"] = "first_of"
    lookup: LookupSpec
    then: ModelProposer


class MergeSpec(Part):
    """Lookup's chain joined into the tree every round: one target call verifies both (``Merge``)."""

    kind: Literal["merge"] = "merge"
    lookup: LookupSpec
    tree: TreeProposer


ProposerSpec = Annotated[
    ARSpec
    | ChainSpec
    | TreeSpec
    | HydraTreeSpec
    | Eagle3ChainSpec
    | Eagle3TreeSpec
    | LookupSpec
    | FirstOfSpec
    | MergeSpec
    | EarlyExitSpec
    | SuperposedSpec,
    Field(discriminator="kind"),
]

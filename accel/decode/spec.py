"""``DecodeSpec``: one validated recipe for a decode (target, proposer, sampling, limits) from flags, JSON or YAML.

The proposer is a discriminated union on ``kind``:

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
=========== ==========================================================================================

Every part refuses fields it does not have (a tree setting on a chain is an error naming the field, never ignored),
and the rules that tie fields together are validators (``_refuse`` errors, one line each naming the fields).
Paths are kept as written: relative ones are relative to the working directory, in a spec file as on the command
line. ``accel.decode.build`` turns a spec into ready backends and a proposer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from accel.backends.weights import WeightFormat
from accel.errors import SpdError
from accel.spd.warps import Sampling

__all__ = [
    "ARSpec",
    "ChainSpec",
    "DecodeSpec",
    "Eagle3ChainSpec",
    "Eagle3TreeSpec",
    "FirstOfSpec",
    "HydraTreeSpec",
    "LookupSpec",
    "MergeSpec",
    "ProposerSpec",
    "SamplingSpec",
    "TargetSpec",
    "TreeSpec",
    "load_spec",
]

#: the weight modes Hydra heads export with (``accel.drafts.hydra.export.HYDRA_WEIGHTS``)
HydraWeights = Literal["fp32", "int8"]

#: the fields that fix a round's size: given explicitly, they pin the shape and ``autotune`` defaults to off
SHAPE_FIELDS = ("k", "nodes", "depth", "min_draft_prob")

#: fields of the other proposer kinds, with what they need: a misplaced one is named, not just "extra"
_NEEDS = {
    "draft": "a draft model (kind chain or tree)",
    "heads": "Hydra heads (kind hydra)",
    "head": "an EAGLE-3 head (kind eagle3 or eagle3_tree)",
    "k": "a chain (kind chain or eagle3) or lookup (kind lookup)",
    "min_draft_prob": "a chain (kind chain or eagle3)",
    "n": "lookup (kind lookup, or its part of first_of / merge)",
    "nodes": "a tree (kind tree, hydra or eagle3_tree)",
    "top_k": "a tree (kind tree, hydra or eagle3_tree)",
    "depth": "a tree (kind tree, hydra or eagle3_tree)",
    "min_prob": "a tree (kind tree, hydra or eagle3_tree)",
    "expand_prob": "a tree (kind tree, hydra or eagle3_tree)",
    "weights": "a draft model or Hydra heads (kind chain, tree or hydra; an EAGLE-3 head runs float32)",
    "threads": "a draft model or heads (kind chain, tree, hydra, eagle3 or eagle3_tree)",
}


def _refuse(kind: str, text: str) -> PydanticCustomError:
    """A validation error of type ``kind`` whose message is ``text`` (passed as context: paths may hold braces)."""
    return PydanticCustomError(kind, "{text}", {"text": text})


class _Part(BaseModel):
    """A frozen part of a spec that refuses unknown fields, naming what a misplaced field would need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _misplaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if name not in cls.model_fields and name in _NEEDS:
                    raise _refuse("ignored_field", f"{name} {value!r} would be ignored: it needs {_NEEDS[name]}")
        return data


def _probability_below_1(name: str, value: float | None) -> float | None:
    """``value`` if it is None or in [0, 1) (``DraftTree``'s rule and message), else a named error."""
    if value is not None and not 0.0 <= value < 1.0:
        raise _refuse("probability", f"{name} must be a probability in [0, 1); got {value!r}")
    return value


class TargetSpec(_Part):
    """The model whose tokens are decoded.

    Attributes:
        path: a checkpoint directory, a ``.gguf`` file, or (backend ``ort``) an ``.onnx`` file from ``accel export``.
        weights: the export weight format of a checkpoint on onnxruntime (``accel export --weights``).
        backend: ``ort`` (checkpoints exported once and cached in ``$ACCEL_CACHE/onnx``) or ``torch``.
        ctx_len: KV-cache length in tokens (checkpoints; an ``.onnx`` file keeps its own).
        threads: intra-op threads (torch: of both models; None: the runtime's default).
        device: where backend ``torch`` keeps weights and caches (target and draft): ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: backend ``torch``'s weight and compute dtype (None: the checkpoint's, float32 after MX decoding).
    """

    path: Path
    weights: WeightFormat = WeightFormat.FP32
    backend: Literal["ort", "torch"] = "ort"
    ctx_len: int = Field(512, ge=1)
    threads: int | None = Field(None, ge=0)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    dtype: Literal["float32", "float16", "bfloat16"] | None = None

    @model_validator(mode="after")
    def _weights_need_a_checkpoint_on_ort(self) -> TargetSpec:
        if "ctx_len" in self.model_fields_set and self.path.suffix == ".onnx":
            raise _refuse(
                "ctx_len",
                f"ctx_len {self.ctx_len} would be ignored: {self.path} is an .onnx file, which keeps the cache length "
                "it was exported with (give a checkpoint directory or .gguf file to choose it)",
            )
        if self.backend != "torch" and (self.device != "cpu" or self.dtype is not None):
            given = f"device {self.device}" if self.device != "cpu" else f"dtype {self.dtype}"
            raise _refuse(
                "torch_only",
                f"{given} applies to --backend torch (onnxruntime here runs on the CPU in the export's dtype)",
            )
        if self.weights is not WeightFormat.FP32 and (self.backend != "ort" or self.path.suffix == ".onnx"):
            raise _refuse(
                "target_weights",
                f"weights {self.weights.value}: --target-weights applies to a target checkpoint (directory or .gguf) "
                "on --backend ort (an .onnx file keeps the weights it was exported with)",
            )
        return self


class SamplingSpec(_Part):
    """The warps and the seed: ``greedy`` (argmax; the other warps must then keep their defaults) or
    ``temperature`` / ``top_k`` / ``top_p`` (``accel.spd.Sampling``)."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _valid_warps(self) -> SamplingSpec:
        try:
            self.sampling().validate()
        except SpdError as exc:
            raise _refuse("sampling", str(exc)) from None
        return self

    def sampling(self) -> Sampling:
        """The ``accel.spd.Sampling`` of these settings."""
        return Sampling(self.temperature, self.top_k, self.top_p, self.greedy)


class ARSpec(_Part):
    """No proposer: the target decodes autoregressively."""

    kind: Literal["none"] = "none"


class _DraftModel(_Part):
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


class _TreeShape(_Part):
    """The shape settings shared by draft trees and Hydra trees (``DraftTree``'s names)."""

    top_k: int = Field(4, ge=1)
    depth: int | None = Field(None, ge=1)
    min_prob: float = 0.0
    expand_prob: float | None = None

    @field_validator("min_prob", "expand_prob")
    @classmethod
    def _probabilities(cls, value: float | None, info: ValidationInfo) -> float | None:
        return _probability_below_1(info.field_name or "probability", value)


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


class _Eagle3Head(_Part):
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


class LookupSpec(_Part):
    """N-gram lookup: what followed the last earlier occurrence of the context's last ``n`` tokens (down to 2), up to
    ``k`` tokens (``NgramLookup``)."""

    kind: Literal["lookup"] = "lookup"
    n: int = Field(3, ge=1)
    k: int = Field(4, ge=1)


ModelProposer = Annotated[
    ChainSpec | TreeSpec | HydraTreeSpec | Eagle3ChainSpec | Eagle3TreeSpec, Field(discriminator="kind")
]
TreeProposer = Annotated[TreeSpec | HydraTreeSpec | Eagle3TreeSpec, Field(discriminator="kind")]


class FirstOfSpec(_Part):
    """Lookup where it matches, else the chain or tree of ``then`` (``FirstOf``)."""

    kind: Literal["first_of"] = "first_of"
    lookup: LookupSpec
    then: ModelProposer


class MergeSpec(_Part):
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
    | MergeSpec,
    Field(discriminator="kind"),
]


class DecodeSpec(_Part):
    """One decode, validated (module docstring).

    Attributes:
        target: the target model and how it runs.
        proposer: what proposes each round's candidates (``kind``; default ``none``: autoregressive).
        sampling: warps and seed.
        max_new_tokens: most tokens generated per prompt.
        eos_token_id: the stop token(s) (None: the target's config ``eos_token_id``, if any; ``[]``: none).
        tokenizer: a ``tokenizer.json``, its directory or a ``.gguf`` (None: the target's own).
        autotune: wrap the proposer in ``accel.spd.autotune.AutoTune``: each round's node budget (0: no speculation)
            chosen from the run's measured costs and acceptance; the proposer's own size is the largest budget. For
            a draft model the controller also chooses the shape: lookup then a chain, the chain, or a tree merged
            with lookup (``accel.decode.build``; trees where the target's graph and activations allow them).
            None (the default) is resolved at validation: on when there is a proposer and none of its size fields
            (``SHAPE_FIELDS``: ``k``, ``nodes``, ``depth``, ``min_draft_prob``) was given, off otherwise (an explicit
            size pins the shape; ``pinned_shape()`` names it). A validated spec always holds True or False, so a
            spec written to a file and read back means the same.
    """

    target: TargetSpec
    proposer: ProposerSpec = Field(default_factory=ARSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    max_new_tokens: int = Field(64, ge=1)
    eos_token_id: int | list[int] | None = None
    tokenizer: Path | None = None
    autotune: bool | None = None

    @model_validator(mode="after")
    def _combinations(self) -> DecodeSpec:
        target = self.target
        if self.autotune is None:  # the default: tune unless a size was given (stored, so a dump means the same)
            object.__setattr__(self, "autotune", not isinstance(self.proposer, ARSpec) and not self.pinned_shape())
            self.__pydantic_fields_set__.add("autotune")
        if self.autotune and isinstance(self.proposer, ARSpec):
            raise _refuse(
                "autotune", "autotune would be ignored: it sizes a proposer's rounds (give a draft, --hydra or --ngram)"
            )
        for part in self.model_parts():
            if (
                isinstance(part, TreeSpec | HydraTreeSpec | Eagle3TreeSpec)
                and part.top_k > 1
                and target.weights.int8_activations
            ):
                raise _refuse(
                    "tree_on_int8_activations",
                    f"a token tree cannot verify exactly on target weights {target.weights.value}: their int8 "
                    "activations turn the tree call's float rounding (attention sums over the tree's cache slots) "
                    "into different codes, so greedy output can differ from the target's own decoding; use a chain "
                    "(--draft without --tree-nodes) or lookup, or a float-activation target (fp32, *-kernel)",
                )
            if isinstance(part, HydraTreeSpec) and target.path.suffix in (".onnx", ".gguf"):
                raise _refuse(
                    "hydra_target",
                    f"Hydra heads (--hydra) need the target as a checkpoint directory (they read its embeddings); "
                    f"got {target.path}",
                )
            if isinstance(part, _Eagle3Head):
                _check_eagle3_target(target)
            if isinstance(part, _DraftModel) and target.backend == "torch":
                for name, value in (("weights", part.weights and part.weights.value), ("threads", part.threads)):
                    if value is not None:
                        raise _refuse(
                            "draft_on_torch",
                            f"draft {name} {value} would be ignored on backend torch (it loads the draft as it is, "
                            "on the target's threads)",
                        )
            if isinstance(part, _DraftModel) and part.weights is not None and part.draft.suffix == ".onnx":
                raise _refuse(
                    "draft_weights",
                    f"draft weights {part.weights.value} would be ignored: {part.draft} is an .onnx file, which "
                    "keeps the weights it was exported with",
                )
        return self

    def pinned_shape(self) -> list[str]:
        """The size fields given explicitly in the proposer (``SHAPE_FIELDS``), as ``kind.field``, e.g.
        ``["chain.k"]``: what turns the default ``autotune`` off."""
        p = self.proposer
        parts: list[_Part] = [p]
        if isinstance(p, FirstOfSpec):
            parts = [p.lookup, p.then]
        elif isinstance(p, MergeSpec):
            parts = [p.lookup, p.tree]
        return [
            f"{getattr(part, 'kind', 'lookup')}.{name}"
            for part in parts
            for name in SHAPE_FIELDS
            if name in part.model_fields_set
        ]

    def model_parts(self) -> list[ChainSpec | TreeSpec | HydraTreeSpec | Eagle3ChainSpec | Eagle3TreeSpec]:
        """The parts of the proposer that run a model (a draft, Hydra heads or an EAGLE-3 head): none, or one."""
        p = self.proposer
        if isinstance(p, FirstOfSpec):
            return [p.then]
        if isinstance(p, MergeSpec):
            return [p.tree]
        models = ChainSpec | TreeSpec | HydraTreeSpec | Eagle3ChainSpec | Eagle3TreeSpec
        return [p] if isinstance(p, models) else []


def _check_eagle3_target(target: TargetSpec) -> None:
    """A named error unless ``target`` can feed an EAGLE-3 head: a checkpoint (directory or ``.gguf``) on backend
    ``ort``, which ``build`` exports with the hidden states of the head's aux layers."""
    if target.path.suffix == ".onnx":
        raise _refuse(
            "eagle3_target",
            f"an EAGLE-3 head (--eagle3) needs the target as a checkpoint directory or .gguf file: it is exported with "
            f"the hidden states of the head's aux layers, which an .onnx file does not output; got {target.path}",
        )
    if target.backend != "ort":
        raise _refuse(
            "eagle3_backend",
            f"an EAGLE-3 head (--eagle3) runs on backend ort only (the head and the target's aux-layer outputs are "
            f"onnxruntime graphs); got backend {target.backend}",
        )


def load_spec(path: str | Path) -> DecodeSpec:
    """The ``DecodeSpec`` in a JSON file, or a YAML file (``.yaml`` / ``.yml``)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpdError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
        return DecodeSpec.model_validate(data)
    try:
        return DecodeSpec.model_validate_json(text)
    except ValidationError as exc:
        bad = [e for e in exc.errors() if e["type"] == "json_invalid"]
        if bad:
            raise SpdError(f"{path}: not valid JSON ({bad[0]['msg']})") from None
        raise

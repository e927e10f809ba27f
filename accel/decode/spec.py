"""``DecodeSpec``: one validated recipe for a decode (target, proposer, sampling, limits) from flags, JSON or YAML.

The proposer is a discriminated union on ``kind`` (``accel.decode.proposers``: none, chain, tree, hydra, eagle3,
eagle3_tree, lookup, first_of, merge). Every part refuses fields it does not have (a tree setting on a chain is an
error naming the field, never ignored), and the rules that tie fields together are validators (``refuse`` errors,
one line each naming the fields: ``accel.decode.parts``). Paths are kept as written: relative ones are relative to
the working directory, in a spec file as on the command line. ``accel.decode.build`` turns a spec into ready
backends and a proposer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from accel.backends.weights import WeightFormat
from accel.decode.parts import Part, refuse
from accel.decode.proposers import (
    SHAPE_FIELDS,
    ARSpec,
    ChainSpec,
    DraftModelSpec,
    Eagle3ChainSpec,
    Eagle3Spec,
    Eagle3TreeSpec,
    EarlyExitSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    MergeSpec,
    ModelPartSpec,
    ProposerSpec,
    SuperposedSpec,
    TreeSpec,
)
from accel.errors import SpdError
from accel.spd.warps import Sampling

__all__ = [
    "ARSpec",
    "ChainSpec",
    "DecodeSpec",
    "Eagle3ChainSpec",
    "Eagle3TreeSpec",
    "EarlyExitSpec",
    "FirstOfSpec",
    "HydraTreeSpec",
    "LookupSpec",
    "MergeSpec",
    "ProposerSpec",
    "SamplingSpec",
    "SuperposedSpec",
    "TargetSpec",
    "TreeSpec",
    "load_spec",
]


def kernel_builds() -> bool:
    """Whether accel's fused kernel (``ai.accel::MXLinear``) builds and loads here (built once, then cached)."""
    from accel.formats.mxkernel_build import load_kernel

    return load_kernel() is not None


class TargetSpec(Part):
    """The model whose tokens are decoded.

    Attributes:
        path: a checkpoint directory, a ``.gguf`` file, or (backend ``ort``) an ``.onnx`` file from ``accel export``.
        weights: the export weight format of a checkpoint on onnxruntime (``accel export --weights``); default
            ``gguf-kernel`` for a ``.gguf`` file (its own Q8_0/Q4_0/Q4_1 blocks, and K-quant/Q5 blocks repacked
            exactly, on accel's kernel, where a C compiler builds it), else ``fp32``.
        backend: ``ort`` (checkpoints exported once and cached in ``$ACCEL_CACHE/onnx``) or ``torch``.
        ctx_len: KV-cache length in tokens (checkpoints; an ``.onnx`` file keeps its own).
        threads: intra-op threads (torch: of both models; None: the runtime's default).
        device: where backend ``torch`` keeps weights and caches (target and draft): ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: backend ``torch``'s weight and compute dtype (None: the checkpoint's, float32 after MX decoding).
        mx_weights: backend ``torch`` with an accel-compressed target: ``packed`` keeps its MX weights packed (the CPU
            kernel in float32 on the CPU, ``TorchBackend(mx=...)`` elsewhere: 6.25 bits a weight, slower on a GPU),
            ``decoded`` decodes them once at load; None: packed on the CPU in float32, decoded elsewhere.
    """

    path: Path
    weights: WeightFormat = WeightFormat.FP32
    backend: Literal["ort", "torch"] = "ort"
    ctx_len: int = Field(512, ge=1)
    threads: int | None = Field(None, ge=0)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$")
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    mx_weights: Literal["packed", "decoded"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _gguf_runs_its_own_blocks(cls, data: Any) -> Any:
        """A ``.gguf`` target on onnxruntime without ``weights`` runs its own blocks (``gguf-kernel``) where accel's
        kernel builds here (checked by loading it: the first use compiles it, a few seconds); elsewhere, and for every
        other target, ``fp32``."""
        if isinstance(data, dict) and data.get("weights") is None and data.get("backend", "ort") == "ort":
            if Path(str(data.get("path", ""))).suffix == ".gguf" and kernel_builds():
                return {**data, "weights": WeightFormat.GGUF_KERNEL}
            return {k: v for k, v in data.items() if k != "weights"}
        return data

    @model_validator(mode="after")
    def _weights_need_a_checkpoint_on_ort(self) -> TargetSpec:
        if "ctx_len" in self.model_fields_set and self.path.suffix == ".onnx":
            raise refuse(
                "ctx_len",
                f"ctx_len {self.ctx_len} would be ignored: {self.path} is an .onnx file, which keeps the cache length "
                "it was exported with (give a checkpoint directory or .gguf file to choose it)",
            )
        if self.backend != "torch" and (self.device != "cpu" or self.dtype is not None or self.mx_weights is not None):
            given = (
                f"device {self.device}"
                if self.device != "cpu"
                else f"dtype {self.dtype}"
                if self.dtype is not None
                else f"mx_weights {self.mx_weights}"
            )
            raise refuse(
                "torch_only",
                f"{given} applies to --backend torch (onnxruntime here runs on the CPU in the export's dtype)",
            )
        if self.weights is not None and self.weights.is_gguf and self.path.suffix != ".gguf":
            raise refuse(
                "target_weights",
                f"weights {self.weights.value} runs a .gguf file's own blocks; {self.path} is not a .gguf file",
            )
        if self.weights is not WeightFormat.FP32 and (self.backend != "ort" or self.path.suffix == ".onnx"):
            raise refuse(
                "target_weights",
                f"weights {self.weights.value}: --target-weights applies to a target checkpoint (directory or .gguf) "
                "on --backend ort (an .onnx file keeps the weights it was exported with)",
            )
        return self


class SamplingSpec(Part):
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
            raise refuse("sampling", str(exc)) from None
        return self

    def sampling(self) -> Sampling:
        """The ``accel.spd.Sampling`` of these settings."""
        return Sampling(self.temperature, self.top_k, self.top_p, self.greedy)


class DecodeSpec(Part):
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
            a draft model the controller also chooses the shape: lookup then a chain (the lookup at its own length),
            the chain alone, or a tree merged with lookup (``accel.decode.build``; trees where the target's graph and
            activations allow them).
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
            raise refuse(
                "autotune", "autotune would be ignored: it sizes a proposer's rounds (give a draft, --hydra or --ngram)"
            )
        for part in self.model_parts():
            if _branches(part) and target.weights.int8_activations:
                raise refuse(
                    "tree_on_int8_activations",
                    f"a token tree cannot verify exactly on target weights {target.weights.value}: their int8 "
                    "activations turn the tree call's float rounding (attention sums over the tree's cache slots) "
                    "into different codes, so greedy output can differ from the target's own decoding; use a chain "
                    "(--draft without --tree-nodes) or lookup, or a float-activation target (fp32, *-kernel)",
                )
            if isinstance(part, EarlyExitSpec) and (target.path.suffix in (".onnx", ".gguf") or target.device != "cpu"):
                raise refuse(
                    "early_exit_target",
                    "an early exit (kind early_exit) runs the target's first layers as a stage exported or loaded from "
                    f"its checkpoint directory, on the CPU; got {target.path} on {target.device}",
                )
            if isinstance(part, HydraTreeSpec) and target.path.suffix in (".onnx", ".gguf"):
                raise refuse(
                    "hydra_target",
                    f"Hydra heads (--hydra) need the target as a checkpoint directory (they read its embeddings); "
                    f"got {target.path}",
                )
            if isinstance(part, Eagle3Spec):
                _check_eagle3_target(target)
            if isinstance(part, DraftModelSpec) and target.backend == "torch":
                for name, value in (("weights", part.weights and part.weights.value), ("threads", part.threads)):
                    if value is not None:
                        raise refuse(
                            "draft_on_torch",
                            f"draft {name} {value} would be ignored on backend torch (it loads the draft as it is, "
                            "on the target's threads)",
                        )
            if isinstance(part, DraftModelSpec) and part.weights is not None and part.draft.suffix == ".onnx":
                raise refuse(
                    "draft_weights",
                    f"draft weights {part.weights.value} would be ignored: {part.draft} is an .onnx file, which "
                    "keeps the weights it was exported with",
                )
        return self

    def pinned_shape(self) -> list[str]:
        """The size fields given explicitly in the proposer (``SHAPE_FIELDS``), as ``kind.field``, e.g.
        ``["chain.k"]``: what turns the default ``autotune`` off."""
        p = self.proposer
        parts: list[Part] = [p]
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

    def model_parts(self) -> list[ModelPartSpec]:
        """The parts of the proposer that run a model (a draft, Hydra heads or an EAGLE-3 head): none, or one."""
        p = self.proposer
        if isinstance(p, FirstOfSpec):
            return [p.then]
        if isinstance(p, MergeSpec):
            return [p.tree]
        return [p] if isinstance(p, ModelPartSpec) else []


def _branches(part: ModelPartSpec) -> bool:
    """Whether ``part`` proposes token trees (more than one child per node): trees of top-k > 1, an early exit's or
    superposed drafts' k > 1 candidates."""
    if isinstance(part, TreeSpec | HydraTreeSpec | Eagle3TreeSpec):
        return part.top_k > 1
    return isinstance(part, EarlyExitSpec | SuperposedSpec) and part.k > 1


def _check_eagle3_target(target: TargetSpec) -> None:
    """A named error unless ``target`` can feed an EAGLE-3 head: a checkpoint (directory or ``.gguf``) on backend
    ``ort``, which ``build`` exports with the hidden states of the head's aux layers."""
    if target.path.suffix == ".onnx":
        raise refuse(
            "eagle3_target",
            f"an EAGLE-3 head (--eagle3) needs the target as a checkpoint directory or .gguf file: it is exported with "
            f"the hidden states of the head's aux layers, which an .onnx file does not output; got {target.path}",
        )
    if target.backend != "ort":
        raise refuse(
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

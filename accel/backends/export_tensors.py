"""The weights ``export_onnx`` writes, as a lazy mapping: each tensor is read (from a loaded model or a checkpoint
file) and converted to its stored form (float32, an ``MXTensor``) only when the graph builder asks for it, so the
exporter holds one tensor at a time.

Which Linear weights are MX: if the model was compressed (``accel.compress``: modules with an MX weight), exactly
those, in their format; otherwise the Linear layers ``accel.compress`` picks by default (attention and MLP projections;
not ``lm_head``) are quantized with ``mx_format`` along the input features (blocks of 32). The ``*-nbits`` formats take
every Linear and the head in MXINT8.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from accel.backends.weights import ExportWeights, WeightFormat
from accel.errors import BackendError
from accel.formats import get_format, quantize
from accel.models.config import ModelConfig
from accel.models.sources import decoder_tensors

if TYPE_CHECKING:
    import torch

    from accel.models.decoder import Decoder

__all__ = ["ExportLayout", "ExportTensors", "model_tensors"]


@dataclass(frozen=True)
class ExportLayout:
    """What the exporter needs of a model's structure, without its weights: the config, the names of its
    ``nn.Linear`` weights and, for a compressed model, the MX weights of its compressed Linears (by weight name).

    ``of_model`` reads it from a ``Decoder`` (torch); ``of_config`` derives it from a config alone, which is how a
    checkpoint directory or a ``.gguf`` file is exported without importing torch. ``tests/backends`` checks that both
    agree for every model shape the ``Decoder`` builds.
    """

    config: ModelConfig
    linear: frozenset[str]
    mx: dict[str, Any] = field(default_factory=dict)
    model: Any = None  # the Decoder itself when there is one (its parameters are the default source)

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> ExportLayout:
        import torch

        modules = list(model.named_modules())
        linear = frozenset(f"{n}.weight" for n, m in modules if isinstance(m, torch.nn.Linear))
        mx = {f"{n}.weight": mx for n, m in modules if (mx := _mx_of(m)) is not None}
        return cls(model.config, linear, mx, model)  # type: ignore[arg-type]

    @classmethod
    def of_config(cls, config: ModelConfig) -> ExportLayout:
        """The Linear weights a ``Decoder`` of ``config`` has (``accel.models.decoder``): per layer the attention
        projections and the MLP's (``gate_proj`` when gated), the LM head, and a feature draft's ``fc``."""
        mlp = ("gate_proj", "up_proj", "down_proj") if config.mlp == "gated" else ("up_proj", "down_proj")
        per_layer = [f"self_attn.{p}_proj" for p in "qkvo"] + [f"mlp.{p}" for p in mlp]
        names = {f"layers.{i}.{m}.weight" for i in range(config.num_layers) for m in per_layer}
        names.add("lm_head.weight")
        if config.feature_size:
            names.add("fc.weight")
        return cls(config, frozenset(names))

    def linear_weights(self) -> set[str]:
        """Names of the ``nn.Linear`` weights (``lm_head.weight`` always; never a feature draft's ``fc``, which reads
        raw features)."""
        return (set(self.linear) | {"lm_head.weight"}) - {"fc.weight"}

    def default_mx_weights(self) -> list[str]:
        """The Linear weights ``accel.compress`` picks by default: every ``nn.Linear`` except ``lm_head`` (the one
        Linear a ``Decoder`` can tie to its embedding)."""
        return sorted(n for n in self.linear if n.split(".")[-2] != "lm_head")


class ExportTensors(Mapping[str, Any]):
    """``Decoder`` name -> stored tensor, computed on lookup: ``base[name]`` (or ``base[alias[name]]``) passed through
    ``convert[name]`` when there is one. ``in`` and ``len`` never read data."""

    def __init__(
        self,
        base: Mapping[str, Any],
        names: list[str],
        convert: dict[str, Callable[[Any], Any]],
        alias: dict[str, str] | None = None,
    ) -> None:
        self.base, self.names, self.convert, self.alias = base, names, convert, alias or {}
        self._names = set(names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        key = self.alias.get(name, name)
        value = self.base[key] if key in self.base else None  # None: a converter that ignores it (a compressed weight)
        fn = self.convert.get(name)
        return fn(value) if fn is not None else value

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def with_extra(self, extra: dict[str, Any]) -> ExportTensors:
        """This mapping plus the in-memory tensors ``extra`` (e.g. an early-exit head's weights)."""
        convert = dict(self.convert, **{n: partial(_constant, v) for n, v in extra.items()})
        return ExportTensors(self.base, [*self.names, *extra], convert, self.alias)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _mx_of(module: Any) -> Any | None:
    """The MXTensor weight of a compressed Linear (``accel.formats.torch_ops.MXLinear``), else None."""
    if getattr(module, "mx", None) is not None:
        return module.mx
    mx_weight = getattr(module, "mx_weight", None)
    if callable(mx_weight):
        return mx_weight()
    return None


def model_tensors(
    model: Decoder | ExportLayout,
    weights: ExportWeights | WeightFormat | str,
    source: Mapping[str, np.ndarray] | None = None,
) -> tuple[ExportTensors, str | None]:
    """Weights of ``model`` by ``Decoder`` name (float32 numpy or MXTensor, converted lazily) for ``weights``; and
    the MX format used.

    ``source``: where the values come from (``accel.models.sources``: a checkpoint read tensor by tensor; ``model``
    then only gives the structure and may live on the meta device); default the model's own parameters.
    A tied ``lm_head.weight`` is left out (the graph reuses the embedding), except for ``int8`` and the ``*-nbits``
    and ``*-kernel`` formats: there the head is a quantized copy and the embedding stays float32 (it is only gathered).
    """
    layout = model if isinstance(model, ExportLayout) else ExportLayout.of_model(model)
    spec = ExportWeights.of(weights)
    fmt = spec.format
    if source is None and layout.model is None:
        raise BackendError("model_tensors needs a source for a layout without its model")
    base = decoder_tensors(layout.model) if source is None else source
    tied = layout.config.tie_word_embeddings
    names = [n for n in base if not (tied and n == "lm_head.weight")]
    alias: dict[str, str] = {}
    if tied and (fmt == WeightFormat.INT8 or fmt.runs_codes):
        names.append("lm_head.weight")
        alias["lm_head.weight"] = "embed_tokens.weight"  # the head gets its own (quantized) copy
    convert: dict[str, Callable[[Any], Any]] = {}
    if "lm_head_token_ids" in base:  # restricted head: its token ids (int64) go into the graph as is
        convert["lm_head_token_ids"] = lambda t: np.asarray(t).astype(np.int64)
    mx_modules = layout.mx
    names += [n for n in mx_modules if n not in base]  # a compressed Linear's weight is no parameter
    if fmt.is_gguf:  # a .gguf file's blocks as they are (accel.formats.ggml), nothing converted
        if source is None:
            raise BackendError(f"weights='{fmt.value}' runs a .gguf file's own blocks: export its path, not a model")
        return ExportTensors(base, names, convert, alias), "gguf"
    if fmt in (WeightFormat.FP32, WeightFormat.FP16, WeightFormat.INT8):  # int8: quantized in the graph writer
        for name, mx in mx_modules.items():
            convert[name] = partial(_dequantized, mx)
        return ExportTensors(base, names, convert, alias), None
    used_format = _mx_weights(layout, spec, names, mx_modules, convert)
    return ExportTensors(base, names, convert, alias), used_format


def _constant(value: Any, _: Any) -> Any:
    return value


def _dequantized(mx: Any, _: Any) -> np.ndarray:
    return mx.dequantize(np.float32)


def _itself(mx: Any, _: Any) -> Any:
    return mx


def _mx_weights(
    layout: ExportLayout, spec: ExportWeights, names: list[str], mx_modules: dict[str, Any], convert: dict[str, Any]
) -> str:
    """Set the conversions of an MX mode's weights in ``convert``; returns the element format(s) used."""
    rounded = spec.format == WeightFormat.MX_ROUNDED
    for name, mx in mx_modules.items():  # a compressed model keeps exactly its MX weights
        convert[name] = partial(_dequantized, mx) if rounded else partial(_itself, mx)
    if spec.format.element_format:  # *-nbits, *-kernel: every Linear and the head (a compressed model: its codes)
        element = get_format(spec.format.element_format)
        other = sorted({mx.fmt.name for mx in mx_modules.values()} - {element.name})
        if other:
            raise BackendError(
                f"weights={spec.format.value!r} runs {element.name} weights only; this model is compressed with "
                f"{', '.join(other)} (use mx-packed or mx-rounded, or compress with {element.name})"
            )
        linear = layout.linear_weights()
        chosen = sorted(n for n in names if n in linear and n not in mx_modules)
    elif mx_modules:
        return ",".join(sorted({mx.fmt.name for mx in mx_modules.values()}))
    else:
        chosen = [n for n in layout.default_mx_weights() if n in names]  # as accel.compress: not lm_head
        element = get_format(spec.mx_format)

    def to_mx(arr: np.ndarray, name: str) -> Any:
        mx = quantize(np.asarray(arr, np.float32), element, axis=-1, block_size=32, name=name)
        return mx.dequantize(np.float32) if rounded else mx

    for name in chosen:
        convert[name] = partial(to_mx, name=name)
    return element.name

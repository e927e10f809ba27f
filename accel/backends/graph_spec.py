"""``GraphSpec``: the one contract of an exported decoder graph (no torch).

A frozen, validated description of what ``export_onnx`` writes: sizes (``ctx_len`` and ``num_logits`` in tokens,
``batch_size`` in rows), the weights (their ``element`` format and the ``runtime`` that computes with them, as separate
fields), and the optional inputs/outputs (``hidden_output``, ``tree``, ``mix_inputs``, ``logits_input``, ``stage``)
and operators (``ort_ops``, ``accel_attention``). The same object is

- what ``export_onnx`` / ``export_cached`` take (a ``GraphSpec``, or the keywords of ``GraphOptions``, which make one:
  every older keyword call, ``weights="mxfp6-nbits"`` included, builds the same spec);
- the ``export_cached`` key (``cache_key``: SHA-256 of its canonical JSON, the accel version, the graph code and the
  checkpoint's files);
- recorded in the ONNX ``metadata_props`` as ``accel.graph_spec`` (its canonical JSON; the older ``accel.*`` keys are
  derived from it and kept), read back by ``inspect_graph`` and reported by ``OrtBackend.graph_spec``.

The weights, as ``element`` x ``runtime`` (the legacy ``WeightFormat`` name of each; docs/backends.md, "Export"):

=========== ================================ ==============================================================
runtime     elements                         what runs
=========== ================================ ==============================================================
``float``   ``fp32``, ``fp16``               float weights (``fp32``, ``fp16``)
``dynamic`` ``int8``                         onnxruntime's dynamic int8 quantization (``int8``)
``rounded`` any MX element                   MX values dequantized to float32 (``mx-rounded``)
``packed``  any MX element                   MX codes decoded in the graph (``mx-packed``)
``nbits``   ``mxint8``, ``mxfp6``, ``mxfp4`` ``MatMulNBits`` on the exact codes (``*-nbits``)
``kernel``  ``mxint8``, ``mxfp6``, ``mxfp4`` accel's ``ai.accel::MXLinear`` (``*-kernel``, ``*-kernel-q8``)
``kernel``  ``gguf``                         a ``.gguf`` file's own blocks on it (``gguf-kernel``)
=========== ================================ ==============================================================

MX elements are named as ``accel.formats`` aliases them (``mxfp6`` = E2M3, ``mxfp4`` = E2M1, ``mxfp8`` = E4M3; the
full names are accepted and stored short). ``activations`` is what the Linear layers multiply: ``int8`` for
``dynamic`` and, by default, ``nbits`` (``accuracy_level`` 4); ``float32`` for the others (``kernel`` with ``int8``
is ``*-kernel-q8``, ``nbits`` with ``float32`` is ``accuracy_level`` 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np

from accel import __version__
from accel.backends.limits import check_sizes
from accel.backends.onnx_builder import OPSET
from accel.backends.stages import StageSpec
from accel.backends.weights import INT8_SCHEMES, ExportWeights, FloatStorage, Int8Scheme, WeightFormat
from accel.errors import BackendError
from accel.formats.elements import ALIASES, FORMATS

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ELEMENTS", "GRAPH_SPEC_KEY", "RUNTIMES", "GraphOptions", "GraphSpec", "element_name"]

Element = Literal["fp32", "fp16", "int8", "gguf", "mxint8", "mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp6_e3m2", "mxfp4"]
Runtime = Literal["float", "dynamic", "rounded", "packed", "nbits", "kernel"]
Activations = Literal["float32", "int8"]

_SHORT = {full: short for short, full in ALIASES.items()}  # mxfp6_e2m3 -> mxfp6 (accel.formats.elements)
MX_ELEMENTS: tuple[str, ...] = tuple(sorted(_SHORT.get(name, name) for name in FORMATS))
ELEMENTS: tuple[str, ...] = ("fp32", "fp16", "int8", "gguf", *MX_ELEMENTS)
RUNTIMES: tuple[str, ...] = ("float", "dynamic", "rounded", "packed", "nbits", "kernel")
_CODES = ("mxint8", "mxfp6", "mxfp4")  # exactly 8-bit integer blocks (accel.backends.onnx_weights)
#: the elements each runtime runs, and its activations (the default first)
_RUNTIME_ELEMENTS = {"float": ("fp32", "fp16"), "dynamic": ("int8",), "rounded": MX_ELEMENTS, "packed": MX_ELEMENTS,
                     "nbits": _CODES, "kernel": (*_CODES, "gguf")}  # fmt: skip
_RUNTIME_ACTIVATIONS = {"float": ("float32",), "dynamic": ("int8",), "rounded": ("float32",), "packed": ("float32",),
                        "nbits": ("int8", "float32"), "kernel": ("float32", "int8")}  # fmt: skip
_Q8_ELEMENTS = ("mxfp6", "mxfp4", "gguf")  # the int8-activation kernel's formats (accel.formats.mxkernel_q8)
_ORT_ONLY = ("dynamic", "nbits", "kernel")  # contrib, custom or dynamic-quantization operators: onnxruntime only
_WEIGHT_FIELDS = ("element", "runtime", "activations", "float_storage", "int8_scheme")

#: the metadata key holding a graph's spec (its canonical JSON)
GRAPH_SPEC_KEY = "accel.graph_spec"
#: the modules whose code shapes an exported graph: part of the export cache key
GRAPH_CODE = ("export.py", "export_tensors.py", "graph_spec.py", "onnx_builder.py", "onnx_graph.py",
              "onnx_int8.py", "onnx_layers.py", "onnx_mxlinear.py", "onnx_weights.py", "weights.py")  # fmt: skip


class GraphOptions(TypedDict, total=False):
    """The keywords of ``export_onnx`` / ``export_cached`` that make a ``GraphSpec``: its fields, and ``weights``
    (an ``ExportWeights``, a ``WeightFormat`` or its name: the older form of the five weight fields)."""

    ctx_len: int
    batch_size: int
    num_logits: int | None
    logits_input: bool
    weights: ExportWeights | WeightFormat | str
    element: Element
    runtime: Runtime | None
    activations: Activations | None
    float_storage: FloatStorage
    int8_scheme: Int8Scheme
    hidden_output: bool
    tree: bool
    mix_inputs: bool
    stage: StageSpec | None
    ort_ops: bool | None
    accel_attention: bool
    opset: int


OPTION_NAMES: tuple[str, ...] = tuple(GraphOptions.__annotations__)


@dataclass(frozen=True)
class GraphSpec:
    """What one exported decoder graph is (module docstring). Every field is concrete once built: ``None`` for
    ``runtime``, ``activations`` and ``ort_ops`` asks for the element's or runtime's default.

    Attributes:
        ctx_len: KV-cache length in tokens (fixed in the graph).
        batch_size: rows per call (fixed in the graph).
        num_logits: None (logits of every one of the call's tokens) or the last ``num_logits`` tokens' only.
        element: the Linear weights' element format (``fp32``, ``fp16``, ``int8``, or an MX element: ``mxint8``,
            ``mxfp8``, ``mxfp8_e5m2``, ``mxfp6``, ``mxfp6_e3m2``, ``mxfp4``).
        runtime: how the graph computes with them: ``float``, ``dynamic``, ``rounded``, ``packed``, ``nbits``,
            ``kernel`` (default: ``float`` for fp32/fp16, ``dynamic`` for int8; an MX element needs one).
        activations: the Linear activations, ``float32`` or ``int8`` (default: the runtime's; module docstring).
        float_storage: ``rounded``/``packed``: storage of the tensors that stay float (``fp32`` or ``fp16``).
        int8_scheme: ``dynamic``: how the int8 codes are stored (``u8u8``, ``u8s7``, ``u8s8``; ``onnx_int8``).
        hidden_output: the output ``hidden_states`` ``[B, S, hidden]`` (always on for a feature draft's graph).
        tree: the token-tree inputs ``slot_ids`` / ``tree_mask`` (whole-model graphs only).
        mix_inputs: the superposed inputs ``mix_ids`` / ``mix_weights``.
        stage: None (the whole model) or the layer range of a pipeline stage (``accel.backends.stages``).
        ort_ops: onnxruntime's fused RMSNorm/RoPE operators (default: on for the onnxruntime-only runtimes
            ``dynamic``, ``nbits``, ``kernel``).
        accel_attention: each layer's RoPE, cache write and attention as one ``ai.accel::CacheAttention`` node
            (accel's kernel library, onnxruntime only; needs ``ort_ops``, its default then): attends only the slots
            each token sees,
            one node instead of about 15 (docs/backends.md, "The graph of a layer").
        opset: the ONNX opset (only 18).
        logits_input: the input ``num_logits`` (int64 ``[1]``): each call asks for its last tokens' logits only, the
            head runs on those alone (a draft's catch-up and a prompt need one; whole-model graphs, without a fixed
            ``num_logits``).
    """

    ctx_len: int
    batch_size: int = 1
    num_logits: int | None = None
    element: Element = "fp32"
    runtime: Runtime | None = None
    activations: Activations | None = None
    float_storage: FloatStorage = "fp32"
    int8_scheme: Int8Scheme = "u8u8"
    hidden_output: bool = False
    tree: bool = False
    mix_inputs: bool = False
    stage: StageSpec | None = None
    ort_ops: bool | None = None
    accel_attention: bool = False
    opset: int = OPSET
    logits_input: bool = False

    def __post_init__(self) -> None:
        check_sizes(self.ctx_len, self.batch_size)
        n = self.num_logits
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))):
            raise BackendError(f"num_logits must be an int >= 1; got {n!r}")
        if n is not None and not 1 <= n <= self.ctx_len:
            raise BackendError(f"num_logits={n} must be in 1..ctx_len ({self.ctx_len})")
        if isinstance(self.opset, bool) or self.opset != OPSET:
            raise BackendError(f"opset {self.opset} is not supported; supported: {OPSET}")
        ints = {"ctx_len": int(self.ctx_len), "batch_size": int(self.batch_size), "opset": OPSET}
        self._set(**ints, num_logits=None if n is None else int(n))
        self._set(**_weights(self.element, self.runtime, self.activations, self.float_storage, self.int8_scheme))
        flags = ("hidden_output", "tree", "mix_inputs", "logits_input")
        self._set(**{name: _flag(name, getattr(self, name)) for name in flags})
        accel_attention = _flag("accel_attention", self.accel_attention)
        if self.ort_ops is None:  # the runtime's default; accel's attention operator needs onnxruntime's (ort_ops)
            ort_ops = self.runtime in _ORT_ONLY or accel_attention
        else:
            ort_ops = _flag("ort_ops", self.ort_ops)
        self._set(ort_ops=ort_ops, accel_attention=accel_attention)
        if self.accel_attention and not ort_ops:
            raise BackendError(
                "accel_attention (ai.accel::CacheAttention) is an onnxruntime operator: it needs ort_ops"
            )
        if self.stage is not None and not isinstance(self.stage, StageSpec):
            raise BackendError(f"stage must be a StageSpec or None; got {self.stage!r}")
        if self.tree and self.stage is not None and not self.stage.is_whole:
            raise BackendError("tree inputs are for whole-model graphs; a pipeline stage has none (drop tree)")
        if self.logits_input and (self.num_logits is not None or (self.stage is not None and not self.stage.is_whole)):
            raise BackendError("logits_input (the input num_logits) is for whole graphs without a fixed num_logits")

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ the legacy weight names

    @staticmethod
    def weight_fields(weights: ExportWeights | WeightFormat | str) -> dict[str, Any]:
        """The five weight fields (``element``, ``runtime``, ``activations``, ``float_storage``, ``int8_scheme``) of
        an ``ExportWeights``, a ``WeightFormat`` or its name (``"mxfp6-kernel-q8"`` -> ``mxfp6``, ``kernel``,
        ``int8``)."""
        w = ExportWeights.of(weights)
        f = w.format
        fields: dict[str, Any] = {"float_storage": w.float_storage, "int8_scheme": w.int8_scheme}
        if f in (WeightFormat.FP32, WeightFormat.FP16):
            return {**fields, "element": f.value, "runtime": "float"}
        if f == WeightFormat.INT8:
            return {**fields, "element": "int8", "runtime": "dynamic"}
        if f.uses_mx_format:
            runtime = "rounded" if f == WeightFormat.MX_ROUNDED else "packed"
            return {**fields, "element": w.mx_format, "runtime": runtime}
        element, runtime = f.value.split("-")[:2]
        int8 = f.kernel_act_bits == 8 or (f.is_nbits and w.accuracy_level == 4)
        return {**fields, "element": element, "runtime": runtime, "activations": "int8" if int8 else "float32"}

    @property
    def weight_format(self) -> WeightFormat:
        """The legacy ``WeightFormat`` of the weight fields (``mxfp6`` x ``nbits`` -> ``mxfp6-nbits``)."""
        if self.runtime == "float":
            return WeightFormat(self.element)
        if self.runtime == "dynamic":
            return WeightFormat.INT8
        if self.runtime in ("rounded", "packed"):
            return WeightFormat(f"mx-{self.runtime}")
        q8 = "-q8" if self.runtime == "kernel" and self.activations == "int8" else ""
        return WeightFormat(f"{self.element}-{self.runtime}{q8}")

    @property
    def export_weights(self) -> ExportWeights:
        """The weight storage as the legacy ``ExportWeights`` (what ``model_tensors`` and the graph writers read)."""
        mx = self.runtime in ("rounded", "packed")
        return ExportWeights(
            self.weight_format,
            mx_format=self.element if mx else "mxfp6",
            float_storage=self.float_storage,
            accuracy_level=1 if self.runtime == "nbits" and self.activations == "float32" else 4,
            int8_scheme=self.int8_scheme,
        )

    @property
    def int8_activations(self) -> bool:
        """Whether the Linear activations are quantized to int8 per block (``nbits`` or ``kernel`` with ``int8``
        activations): a call's logits then depend on its layout, so ``OrtBackend`` refuses token trees."""
        return self.runtime in ("nbits", "kernel") and self.activations == "int8"

    # ------------------------------------------------------------------ the one description, in three uses

    @classmethod
    def of(cls, spec: GraphSpec | None, options: Mapping[str, Any], caller: str = "export_onnx") -> GraphSpec:
        """The spec of a call ``caller(..., spec, **options)``: ``spec`` itself, or one built from the keywords
        ``options`` (``GraphOptions``); BackendError naming unknown keywords, or ``spec`` given beside keywords."""
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise BackendError(
                f"{caller} got unknown keyword(s) {', '.join(unknown)}; graph settings: {', '.join(OPTION_NAMES)}"
            )
        if spec is not None:
            if not isinstance(spec, GraphSpec):
                raise BackendError(f"{caller}: spec must be a GraphSpec; got {type(spec).__name__}")
            if options:
                given = ", ".join(sorted(options))
                raise BackendError(f"{caller}: give a GraphSpec or its keywords, not both (got a spec and {given})")
            return spec
        fields = dict(options)
        if "weights" in fields:
            both = sorted(set(fields) & set(_WEIGHT_FIELDS))
            if both:
                raise BackendError(f"{caller}: weights= sets {', '.join(both)} too: give one or the other")
            fields.update(cls.weight_fields(fields.pop("weights")))
        if "ctx_len" not in fields:
            raise BackendError(f"{caller} needs ctx_len (the KV-cache length in tokens)")
        return cls(**fields)

    @classmethod
    def from_options(cls, **options: Unpack[GraphOptions]) -> GraphSpec:
        """The spec of ``export_onnx``'s keywords (``GraphOptions``: the fields, or ``weights`` by its legacy name):
        ``GraphSpec.from_options(ctx_len=512, weights="mxfp6-nbits")``."""
        return cls.of(None, options, "GraphSpec.from_options")

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (``stage``: ``start``, ``stop``, ``total``, ``exit_logits``, or None;
        ``logits_input`` only where set)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not out["logits_input"]:  # left out at its default: the keys of graphs exported before it stay the same
            del out["logits_input"]
        st = self.stage
        out["stage"] = None if st is None else {"start": int(st.start), "stop": int(st.stop), "total": int(st.total),
                                                "exit_logits": bool(st.exit_logits)}  # fmt: skip
        return out

    def to_json(self) -> str:
        """The canonical JSON (sorted keys, no spaces): equal specs give equal text."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, source: str = "graph") -> GraphSpec:
        """The spec written by ``to_json``, validated (BackendError naming ``source`` and the problem)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BackendError(f"{source}: {GRAPH_SPEC_KEY} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BackendError(f"{source}: {GRAPH_SPEC_KEY} must be a JSON object; got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        odd = sorted(set(data) - names)
        if odd or "ctx_len" not in data:
            raise BackendError(f"{source}: {GRAPH_SPEC_KEY} has unknown fields {odd} or lacks ctx_len")
        stage = data.get("stage")
        if stage is not None:
            if not isinstance(stage, dict) or set(stage) != {"start", "stop", "total", "exit_logits"}:
                raise BackendError(f"{source}: {GRAPH_SPEC_KEY} stage must be start, stop, total, exit_logits")
            data["stage"] = StageSpec(**stage)
        return cls(**data)

    def metadata(self) -> dict[str, str]:
        """The ONNX ``metadata_props`` this spec fixes: ``accel.graph_spec`` (``to_json``) and the older ``accel.*``
        keys derived from it (weights, sizes, flags, the stage's layers)."""
        w = self.export_weights
        names = ("hidden_output", "tree", "mix_inputs", "logits_input", "ort_ops", "accel_attention")
        flags = {n: getattr(self, n) for n in names}
        meta = {
            GRAPH_SPEC_KEY: self.to_json(),
            "accel.weights": w.format.value,
            "accel.float_weights": w.float_dtype,
            "accel.ctx_len": str(self.ctx_len),
            "accel.batch_size": str(self.batch_size),
            "accel.num_logits": str(self.num_logits or 0),
            **{f"accel.{name}": str(int(value)) for name, value in flags.items()},
            "accel.int8_activations": str(int(self.int8_activations)),
        }
        if self.runtime == "dynamic":
            meta["accel.int8"] = self.int8_scheme
        if self.stage is not None and not self.stage.is_whole:
            meta.update(self.stage.metadata())
        return meta

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str], source: str = "graph") -> GraphSpec | None:
        """The spec a graph's metadata records (``accel.graph_spec``); None for a graph without one (exported by
        another tool or an older accel)."""
        text = meta.get(GRAPH_SPEC_KEY)
        return None if text is None else cls.from_json(text, source)

    def cache_key(self, files: Sequence[Path] = ()) -> str:
        """The hex SHA-256 export key of this spec: its canonical JSON, the accel version, the graph code
        (``GRAPH_CODE``) and each of ``files``' name, size (bytes) and modification time (ns)."""
        key = hashlib.sha256(f"{self.to_json()}\0{__version__}".encode())
        for f in files:
            st = Path(f).stat()
            key.update(f"\0{Path(f).name}:{st.st_size}:{st.st_mtime_ns}".encode())
        for module in GRAPH_CODE:
            key.update(Path(__file__).with_name(module).read_bytes())
        return key.hexdigest()


def _flag(name: str, value: Any) -> bool:
    """``value`` as a bool; BackendError for anything but a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise BackendError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def element_name(name: Any) -> str:
    """The element's stored name (MX full names to their ``accel.formats`` aliases); BackendError for others."""
    if isinstance(name, str) and name.lower() in ELEMENTS:
        return name.lower()
    if isinstance(name, str) and name.lower() in FORMATS:
        return _SHORT.get(name.lower(), name.lower())
    raise BackendError(f"element {name!r} is not supported; supported: {', '.join(ELEMENTS)}")


def _weights(element: Any, runtime: Any, activations: Any, storage: Any, scheme: Any) -> dict[str, Any]:
    """The five weight fields, checked against each other, with ``runtime`` and ``activations`` defaults filled."""
    element = element_name(element)
    if runtime is None:
        runtime = {"fp32": "float", "fp16": "float", "int8": "dynamic", "gguf": "kernel"}.get(element)
        if runtime is None:
            raise BackendError(f"element {element} needs a runtime: rounded, packed (any MX element), nbits or kernel")
    if runtime not in RUNTIMES:
        raise BackendError(f"runtime {runtime!r} is not supported; supported: {', '.join(RUNTIMES)}")
    if element not in _RUNTIME_ELEMENTS[runtime]:
        allowed = ", ".join(_RUNTIME_ELEMENTS[runtime])
        raise BackendError(f"runtime {runtime} runs the elements {allowed}; not {element}")
    activations = _RUNTIME_ACTIVATIONS[runtime][0] if activations is None else activations
    if activations not in _RUNTIME_ACTIVATIONS[runtime]:
        allowed = ", ".join(_RUNTIME_ACTIVATIONS[runtime])
        raise BackendError(f"runtime {runtime} takes activations {allowed}; not {activations!r}")
    if runtime == "kernel" and activations == "int8" and element not in _Q8_ELEMENTS:
        raise BackendError(f"the kernel with int8 activations runs {', '.join(_Q8_ELEMENTS)}; not {element}")
    if storage not in ("fp32", "fp16"):
        raise BackendError(f"float_storage={storage!r} is not supported; supported: fp32, fp16")
    if storage != "fp32" and runtime not in ("rounded", "packed"):
        raise BackendError(f"float_storage applies to runtimes rounded and packed only, not {runtime}")
    if scheme not in INT8_SCHEMES:
        raise BackendError(f"int8_scheme={scheme!r} is not supported; supported: {', '.join(INT8_SCHEMES)}")
    if scheme != "u8u8" and runtime != "dynamic":
        raise BackendError(f"int8_scheme applies to element int8 (runtime dynamic) only, not {runtime}")
    return {"element": element, "runtime": runtime, "activations": activations, "float_storage": storage,
            "int8_scheme": scheme}  # fmt: skip

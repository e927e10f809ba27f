"""Opening the models of a decode: ``open_backend`` (a checkpoint exported once and cached, an ``.onnx`` file, or a
checkpoint on torch), ``cached_graph`` (the export step alone) and ``Opener``, which shares what it opened between the
``build`` calls given the same one (several recipes on one target session: the demo's modes, a benchmark's).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

from accel.backends.base import Backend
from accel.backends.stages import StageBackend
from accel.backends.weights import WeightFormat
from accel.decode.files import is_gguf, model_config, onnx_metadata
from accel.decode.spec import TargetSpec, kernel_builds
from accel.errors import AccelError, SpdError
from accel.models.sources import engine_quant_method

__all__ = [
    "ON_CPU",
    "PLAIN",
    "WIDE_DRAFT_PARAMS",
    "GraphNeeds",
    "Opener",
    "TorchPlacement",
    "cached_graph",
    "draft_threads",
    "open_backend",
    "open_exit_stage",
]

T = TypeVar("T")

#: drafts with at least this many parameters get the target's threads by default. Measured (benchmarks/draft_threads.py,
#: RESULTS.md): the shipped 9 M draft runs best on 1 thread; random drafts of 28 M, 61 M and 135 M parameters beside a
#: 1.7B target gave 1.07-1.10x the SpD tokens/s on 2 threads, and a 0.5B draft 1.46x.
WIDE_DRAFT_PARAMS = 20_000_000


class TorchPlacement(NamedTuple):
    """Where and how backend ``torch`` holds a model (``TargetSpec``'s fields): ``device``, ``dtype`` and, for an
    accel-compressed checkpoint, ``mx_weights`` (``packed``, ``decoded`` or None: the default for the device)."""

    device: str = "cpu"
    dtype: str | None = None
    mx_weights: str | None = None


#: backend torch's default placement: the CPU, the checkpoint's dtype
ON_CPU = TorchPlacement()


class GraphNeeds(NamedTuple):
    """What a proposer needs of an exported graph: the hidden-state output and tree calls of a target
    (``ProposerInfo``'s ``needs_hidden`` and ``branching``); mixed (superposed) inputs of a draft."""

    hidden_output: bool = False
    tree: bool = False
    mix: bool = False


#: a plain graph: logits only, chain calls
PLAIN = GraphNeeds()


def _open_torch(path: Path, ctx_len: int, threads: int | None, placement: TorchPlacement) -> Backend:
    """``open_backend``'s torch branch: a checkpoint directory (plain, accel-compressed, or a Quark /
    compressed-tensors MX folder) or a ``.gguf`` file, loaded as it is, on ``placement.device`` in its dtype; an
    accel-compressed checkpoint's MX weights packed or decoded as ``placement.mx_weights`` says (``TargetSpec``)."""
    device, dtype, mx_weights = placement
    if not (path.is_dir() or is_gguf(path)):
        raise SpdError(f"--backend torch needs a checkpoint directory or a .gguf file; got {path}")
    from accel.backends import TorchBackend
    from accel.backends.torch_graphs import resolve_device
    from accel.backends.torch_mx import checkpoint_mx_formats, pack_compressed
    from accel.models import load_checkpoint

    dev = resolve_device(device)  # before loading: CUDA asked for and absent is named at once
    on_gpu = dev.type == "cuda"  # CUDA graphs and fused projections by default; compiled blocks too
    if path.is_dir() and engine_quant_method(path) is not None:  # a Quark / compressed-tensors MX checkpoint
        from accel.serving import load_mx_checkpoint

        model = load_mx_checkpoint(path)
    else:
        model = load_checkpoint(path)
    cpu_kernel = dev.type == "cpu" and dtype in (None, "float32")
    formats = sorted({f for f, block in checkpoint_mx_formats(path) if block == 32}) if path.is_dir() else []
    if formats and mx_weights != "decoded" and cpu_kernel:
        pack_compressed(model, path)  # an accel-compressed checkpoint keeps its MX weights packed (CPU kernel)
        formats = []
    elif mx_weights != "packed":
        formats = []  # MX weights stay decoded (once, exactly, at load) and are cast to dtype on the device
    elif not formats:
        raise SpdError(f"mx_weights packed: {path} holds no MX weights in blocks of 32 (not an accel-compressed one)")
    runtime = {"mx": formats} if formats else {}
    backend = TorchBackend(
        model, ctx_len=ctx_len, batch_size=1, threads=threads, device=dev, dtype=dtype, compile=on_gpu, **runtime
    )
    if backend.mx_report is not None:
        print(backend.mx_report.line(), file=sys.stderr)
    return backend


def draft_threads(draft: Path, target_threads: int | None, feature_draft: bool) -> int | None:
    """Default onnxruntime threads of a draft: the target's for a feature draft or one of at least
    ``WIDE_DRAFT_PARAMS`` parameters (its matmuls are wide), else 1 (its calls are too short to split)."""
    if feature_draft:
        return target_threads
    cfg = model_config(draft)
    if not cfg:
        return 1
    from accel.sim.models import from_hf_config

    try:
        params = from_hf_config(cfg).num_params
    except (AccelError, ValueError, KeyError, TypeError):  # an architecture the simulator does not describe
        return 1
    return target_threads if params >= WIDE_DRAFT_PARAMS else 1


def open_backend(
    path: Path,
    backend: str,
    ctx_len: int,
    threads: int | None,
    *,
    weights: WeightFormat = WeightFormat.FP32,
    needs: GraphNeeds = PLAIN,
    placement: TorchPlacement = ON_CPU,
    spin: bool = False,
) -> Backend:
    """A batch-1 backend of the model at ``path`` (``backend`` ``torch``: a checkpoint loaded as it is, as
    ``placement`` says; ``ort``: a checkpoint exported with ``weights`` and what the proposer ``needs`` and cached, or
    an ``.onnx`` file); ``ctx_len`` in tokens. ``spin``: onnxruntime's idle threads busy-wait between calls
    (``OrtBackend``): faster when no other model's calls alternate with this one's (autoregressive decoding)."""
    if not path.exists():
        raise SpdError(f"no model at {path}: give a checkpoint directory, a .gguf file or an .onnx file")
    if backend == "torch":
        return _open_torch(path, ctx_len, threads, placement)
    from accel.backends import OrtBackend
    from accel.models.smollm2 import cache_root

    if path.is_dir() or is_gguf(path):  # exported once per checkpoint and settings, cached in $ACCEL_CACHE/onnx
        path = cached_graph(path, ctx_len, weights, needs)
    if path.suffix != ".onnx":
        raise SpdError(f"--backend ort needs an .onnx file, a .gguf file or a checkpoint directory; got {path}")
    # a graph that decodes packed MX weights in the graph spends most of its session creation folding them: keep
    # onnxruntime's optimized graph (accel.backends.ort_session); other graphs gain too little for a second copy
    packed = onnx_metadata(path).get("accel.weights") == "mx-packed"
    t0 = time.perf_counter()
    optimized = cache_root() / "ort" if packed else None
    ort = OrtBackend(path, batch_size=1, threads=threads, spin=spin, optimized_dir=optimized)
    if time.perf_counter() - t0 > 2:  # large graphs: onnxruntime's optimizations take seconds, say where time went
        print(f"onnxruntime session for {path.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return ort


def cached_graph(path: Path, ctx_len: int, weights: WeightFormat, needs: GraphNeeds = PLAIN) -> Path:
    """The ``.onnx`` export of the checkpoint (directory or ``.gguf``) at ``path`` that ``open_backend`` runs:
    ``weights``, a KV cache of ``ctx_len`` tokens, the outputs and inputs ``needs`` asks for, onnxruntime's fused
    operators and (where accel's kernel builds) its cache attention; exported once per settings under
    ``$ACCEL_CACHE/onnx`` (``accel.backends.export_cached``), progress on stderr."""
    from accel.backends import export_cached
    from accel.models.smollm2 import cache_root

    return export_cached(
        path,
        cache_root() / "onnx",
        ctx_len=ctx_len,
        hidden_output=needs.hidden_output,
        weights=weights.value,
        tree=needs.tree,
        mix_inputs=needs.mix,
        logits_input=True,  # each call's logits only where the loop reads them (a prompt, a draft's catch-up)
        ort_ops=True,  # onnxruntime runs it: its fused RMSNorm + residual and RoPE (~5% of an fp32 step)
        accel_attention=kernel_builds(),  # one ai.accel::CacheAttention a layer, where accel's kernel builds
        say=lambda line: print(line, file=sys.stderr, flush=True),
        progress=True,
    )


class Opener:
    """Opens the backends of ``build`` (``open_backend``) and keeps them: the builds given one ``Opener`` share one
    backend per distinct opening (model, runtime, cache length, threads, weights, graph needs, placement, thread
    policy), and one of anything else opened through ``shared`` (Hydra heads). ``target_needs`` widens every target
    graph to at least these needs and ``target_spin`` (not None) sets every target's thread policy, so that recipes
    of different proposers (autoregressive included) decode on one target session. Backends hold one sequence's
    cache: use the setups of one ``Opener`` one after another, never at once."""

    def __init__(self, target_needs: GraphNeeds = PLAIN, target_spin: bool | None = None) -> None:
        self.target_needs, self.target_spin = target_needs, target_spin
        self._kept: dict[Hashable, object] = {}

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """What ``make()`` returned the first time ``key`` was asked for (made then)."""
        if key not in self._kept:
            self._kept[key] = make()
        return cast(T, self._kept[key])

    def target(self, path: Path, t: TargetSpec, needs: GraphNeeds, spin: bool) -> Backend:
        """The target ``t`` (at ``path``: its own or an export made for the proposer) with at least ``needs`` and
        this opener's ``target_needs``; ``spin`` unless ``target_spin`` says otherwise."""
        wide = GraphNeeds(*(a or b for a, b in zip(needs, self.target_needs, strict=True)))
        spin = spin if self.target_spin is None else self.target_spin
        place = TorchPlacement(t.device, t.dtype, t.mx_weights)
        return self.open(
            path, t.backend, t.ctx_len, t.threads, weights=t.weights, needs=wide, placement=place, spin=spin
        )

    def open(
        self,
        path: Path,
        backend: str,
        ctx_len: int,
        threads: int | None,
        *,
        weights: WeightFormat = WeightFormat.FP32,
        needs: GraphNeeds = PLAIN,
        placement: TorchPlacement = ON_CPU,
        spin: bool = False,
    ) -> Backend:
        """``open_backend`` with these arguments, once per distinct set of them."""
        key = (Path(path).resolve(), backend, ctx_len, threads, weights, needs, placement, spin)
        return self.shared(
            key,
            lambda: open_backend(
                path, backend, ctx_len, threads, weights=weights, needs=needs, placement=placement, spin=spin
            ),
        )


def open_exit_stage(t: TargetSpec, exit_layer: int, exit_head: str | Path | None, threads: int | None) -> StageBackend:
    """The exit stage ``[0, exit_layer)`` of the target checkpoint directory ``t.path`` with its exit logits (batch 1,
    a ``t.ctx_len``-token cache, float32 weights): the trained head at ``exit_head`` (``"shipped"``: the one shipped
    for SmolLM2-135M at that layer) or, None, the target's own norm and LM head. Backend ort: exported once into
    ``$ACCEL_CACHE/onnx`` (keyed by the target's and the head's files); torch: loaded. ``SpdError`` for a layer
    outside ``1 .. layers - 1``; ``DraftError`` for a head of another target or layer."""
    # torch-optional: the exit head and the export need torch; an onnxruntime run of a cached stage does not
    from accel.backends.stages import split_layers
    from accel.drafts.early_exit import shipped_exit_head
    from accel.models.config import ModelConfig

    layers = ModelConfig.from_hf(model_config(t.path)).num_layers
    if not 1 <= exit_layer < layers:
        raise SpdError(f"early exit after layer {exit_layer}: the target has {layers} layers (give 1..{layers - 1})")
    head = shipped_exit_head(exit_layer) if exit_head == "shipped" else (Path(exit_head) if exit_head else None)
    stage = split_layers(layers, [exit_layer], exit_logits=True)[0]
    if t.backend == "torch":
        from accel.backends import TorchBackend

        model, exit_module = _exit_model(t.path, head, exit_layer)
        return TorchBackend(model, ctx_len=t.ctx_len, batch_size=1, threads=threads, stage=stage, exit_head=exit_module)
    from accel.backends import OrtBackend

    return OrtBackend(_exit_graph(t.path, t.ctx_len, stage, head, exit_layer), threads=threads)


def _exit_model(path: Path, head: Path | None, exit_layer: int) -> tuple[Any, Any]:
    """The target model at ``path`` and its exit head at ``head`` (None: no head), checked to be for ``exit_layer``."""
    from accel.drafts.early_exit import load_exit_head
    from accel.errors import DraftError
    from accel.models import load_checkpoint

    model = load_checkpoint(path).eval()
    module = load_exit_head(head, model) if head is not None else None
    if module is not None and module.layer != exit_layer:
        raise DraftError(f"the exit head at {head} is for layer {module.layer}, not the early exit's {exit_layer}")
    return model, module


def _exit_graph(path: Path, ctx_len: int, stage: Any, head: Path | None, exit_layer: int) -> Path:
    """The exit stage's ``.onnx`` file in ``$ACCEL_CACHE/onnx``, exported once per target files, head files and
    settings (``GraphSpec.cache_key``)."""
    from accel.backends import export_onnx
    from accel.backends.export import checkpoint_files
    from accel.backends.graph_spec import GraphSpec
    from accel.models.smollm2 import cache_root

    spec = GraphSpec(ctx_len=ctx_len, batch_size=1, stage=stage)
    files = checkpoint_files(path) + (checkpoint_files(head) if head is not None else [])
    out = cache_root() / "onnx" / f"{path.name}-exit{exit_layer}-{spec.cache_key(files)[:12]}.onnx"
    if not out.is_file():
        print(f"ONNX exit stage [0, {exit_layer}) of {path.name}: exporting, once", file=sys.stderr, flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        model, module = _exit_model(path, head, exit_layer)
        export_onnx(model, out, spec, progress=False, exit_head=module)
    return out

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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from accel.backends.base import Backend
from accel.backends.weights import WeightFormat
from accel.decode.draft_check import check_draft_weights
from accel.decode.eagle3 import eagle3_proposer, eagle3_target
from accel.decode.files import find_tokenizer, is_gguf, model_config, onnx_inputs, onnx_metadata
from accel.decode.proposers import (
    ARSpec,
    ChainSpec,
    Eagle3ChainSpec,
    Eagle3Spec,
    Eagle3TreeSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    MergeSpec,
    TreeSpec,
)
from accel.decode.spec import DecodeSpec, TargetSpec, kernel_builds
from accel.errors import AccelError, SpdError
from accel.models.sources import engine_quant_method
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
from accel.spd.autotune import AutoTune

__all__ = [
    "AUTOTUNE_TREE_NODES",
    "WIDE_DRAFT_PARAMS",
    "DecodeSetup",
    "GraphNeeds",
    "build",
    "draft_threads",
    "open_backend",
]

#: drafts with at least this many parameters get the target's threads by default. Measured (benchmarks/draft_threads.py,
#: RESULTS.md): the shipped 9 M draft runs best on 1 thread; random drafts of 28 M, 61 M and 135 M parameters beside a
#: 1.7B target gave 1.07-1.10x the SpD tokens/s on 2 threads, and a 0.5B draft 1.46x.
WIDE_DRAFT_PARAMS = 20_000_000

#: the largest draft tree the controller may choose when the spec names no tree size (a chain or tree spec without
#: ``nodes``): the shipped feature draft's trees of 4-8 nodes were its best on 2-core CPUs (docs/spd.md)
AUTOTUNE_TREE_NODES = 8


class TorchPlacement(NamedTuple):
    """Where and how backend ``torch`` holds a model (``TargetSpec``'s fields): ``device``, ``dtype`` and, for an
    accel-compressed checkpoint, ``mx_weights`` (``packed``, ``decoded`` or None: the default for the device)."""

    device: str = "cpu"
    dtype: str | None = None
    mx_weights: str | None = None


#: backend torch's default placement: the CPU, the checkpoint's dtype
ON_CPU = TorchPlacement()


class GraphNeeds(NamedTuple):
    """What the proposer needs of an exported target graph (``ProposerInfo``'s ``needs_hidden`` and ``branching``):
    the hidden-state output, tree calls."""

    hidden_output: bool = False
    tree: bool = False


#: a plain graph: logits only, chain calls
PLAIN = GraphNeeds()


@dataclass
class DecodeSetup:
    """What ``build`` returns: the opened target, the proposer (None: autoregressive), the tokenizer (None: prompts
    are token ids) and the stop tokens, with the spec they came from."""

    spec: DecodeSpec
    target: Backend
    proposer: Proposer | None
    tokenizer: Any
    eos_token_id: int | list[int] | None

    @property
    def sampling(self) -> Sampling:
        """The spec's warps as an ``accel.spd.Sampling``."""
        return self.spec.sampling.sampling()

    def generate(
        self, prompt_ids: Sequence[Sequence[int]] | np.ndarray, stream: StreamCallback | None = None
    ) -> GenerationResult:
        """``accel.spd.generate`` with this setup's backends, proposer, warps, seed, token limit and stop tokens
        (one prompt: the backends run batch 1)."""
        spec = self.spec
        return generate(
            self.target,
            self.proposer,
            prompt_ids,
            max_new_tokens=spec.max_new_tokens,
            sampling=self.sampling,
            seed=spec.sampling.seed,
            eos_token_id=self.eos_token_id,
            stream=stream,
        )


def build(spec: DecodeSpec, tokenizer: Any = None) -> DecodeSetup:
    """Open what ``spec`` describes (module docstring). ``tokenizer``: one already loaded for the target (None: found
    as ``spec.tokenizer`` or beside the target). Raises the ``SpdError`` / ``BackendError`` / ``DraftError`` of the
    file or combination that fails (a draft whose vocabulary differs from the target's, heads deeper than asked)."""
    t = spec.target
    if is_gguf(t.path):  # parsing a GGUF's metadata (the tokenizer's every token and merge) takes seconds to a minute
        mb = t.path.stat().st_size / 1e6
        print(f"reading {t.path.name} ({mb:.0f} MB): GGUF metadata and tokenizer ...", file=sys.stderr, flush=True)
    eos = spec.eos_token_id if spec.eos_token_id is not None else model_config(t.path).get("eos_token_id")
    if tokenizer is None:
        tokenizer = find_tokenizer(spec.tokenizer, t.path)
    drafts: list[tuple[Backend, Path]] = []
    arms = _autotune_arms(spec, drafts) if spec.autotune else None
    proposer = AutoTune(arms) if arms is not None else _proposer(spec, drafts)
    info = proposer.info if proposer is not None else None
    target = open_backend(
        eagle3_target(spec) or t.path,  # an EAGLE-3 head's target: the export with its aux layers' states
        t.backend,
        t.ctx_len,
        t.threads,
        weights=t.weights,
        needs=GraphNeeds(bool(info and info.needs_hidden), bool(info and info.branching)),
        placement=TorchPlacement(t.device, t.dtype, t.mx_weights),
        spin=proposer is None,  # no draft session alternates with the target's calls: let its pool spin
    )
    for draft, path in drafts:
        check_compatible(target, draft, tokenizer, find_tokenizer(None, path) if tokenizer is not None else None)
    if spec.autotune and proposer is not None:
        if not isinstance(proposer, AutoTune):
            proposer = AutoTune(proposer)
        proposer.probe(target)  # the call-cost curve at every budget before the first round (SpdError if it fails)
    return DecodeSetup(spec, target, proposer, tokenizer, eos)


def _proposer(spec: DecodeSpec, drafts: list[tuple[Backend, Path]]) -> Proposer | None:
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


def _autotune_arms(spec: DecodeSpec, drafts: list[tuple[Backend, Path]]) -> list[Proposer] | None:
    """The shapes the controller chooses between for a draft model (``accel.spd.autotune``): n-gram lookup first then
    a draft chain, the chain alone, and a draft tree merged with lookup (where the target's and the draft's graphs
    take tree inputs and the target's activations are not int8), all over one draft backend. The spec's lookup,
    chain length ``k`` and tree settings size them (defaults: lookup n=3 k=4, chains of up to 4, trees of up to
    ``AUTOTUNE_TREE_NODES``). None for a proposer without a draft model (lookup alone, Hydra heads): the controller
    then sizes that one proposer."""
    parts = spec.model_parts()
    if not parts or not isinstance(parts[0], ChainSpec | TreeSpec):
        return None
    part, p = parts[0], spec.proposer
    look = p.lookup if isinstance(p, FirstOfSpec | MergeSpec) else LookupSpec()
    t = spec.target
    trees = not t.weights.int8_activations and (t.path.suffix != ".onnx" or "tree_mask" in onnx_inputs(t.path))
    draft = _open_draft(part, t, tree=trees)
    drafts.append((draft, part.draft))
    trees = trees and "tree" in draft.info.capabilities  # an .onnx draft is used as it was exported
    k = part.k if isinstance(part, ChainSpec) else min(part.nodes, 4)
    arms: list[Proposer] = [FirstOf(NgramLookup(look.n, look.k), DraftChain(draft, k=k)), DraftChain(draft, k=k)]
    if trees:
        tree = (
            DraftTree(draft, part.nodes, part.top_k, part.depth, part.min_prob, part.expand_prob)
            if isinstance(part, TreeSpec)
            else DraftTree(draft, nodes=AUTOTUNE_TREE_NODES)
        )
        arms.append(Merge(NgramLookup(look.n, look.k), tree))
    return arms


def _model_proposer(
    p: ChainSpec | TreeSpec | HydraTreeSpec | Eagle3Spec, target: TargetSpec, drafts: list[tuple[Backend, Path]]
) -> Proposer:
    if isinstance(p, HydraTreeSpec):
        return _hydra(p, target)
    if isinstance(p, Eagle3ChainSpec | Eagle3TreeSpec):
        return eagle3_proposer(p, target)
    draft = _open_draft(p, target, tree=isinstance(p, TreeSpec))
    drafts.append((draft, p.draft))
    if isinstance(p, TreeSpec):
        return DraftTree(
            draft, nodes=p.nodes, top_k=p.top_k, depth=p.depth, min_prob=p.min_prob, expand_prob=p.expand_prob
        )
    return DraftChain(draft, k=p.k, min_draft_prob=p.min_draft_prob)


def _open_draft(p: ChainSpec | TreeSpec, target: TargetSpec, tree: bool) -> Backend:
    """The draft backend: int8 for a feature draft unless told otherwise; threads by the draft's size
    (``draft_threads``), the target's on torch (torch threads are global); tree inputs for a ``DraftTree``."""
    feature = bool(model_config(p.draft).get("accel_feature_size"))
    check_draft_weights(p.draft)
    if target.backend != "ort":
        threads = target.threads
    else:
        threads = p.threads if p.threads is not None else draft_threads(p.draft, target.threads, feature)
    weights = p.weights or (WeightFormat.INT8 if feature else WeightFormat.FP32)
    return open_backend(
        p.draft,
        target.backend,
        target.ctx_len,
        threads,
        weights=weights,
        needs=GraphNeeds(tree=tree),
        placement=TorchPlacement(target.device, target.dtype),
    )


def _hydra(p: HydraTreeSpec, target: TargetSpec) -> Proposer:
    """The Hydra proposer of this part (``accel.drafts.hydra.open``: the tree shape checked against the heads first,
    then the heads exported once and cached)."""
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
    return open_hydra(p.heads, target.path, shape, ctx_len=target.ctx_len, weights=p.weights, threads=p.threads or 1)


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
    from accel.backends import OrtBackend, export_cached
    from accel.models.smollm2 import cache_root

    if path.is_dir() or is_gguf(path):  # exported once per checkpoint and settings, cached in $ACCEL_CACHE/onnx
        path = export_cached(
            path,
            cache_root() / "onnx",
            ctx_len=ctx_len,
            hidden_output=needs.hidden_output,
            weights=weights.value,
            tree=needs.tree,
            ort_ops=True,  # onnxruntime runs it: its fused RMSNorm + residual and RoPE (~5% of an fp32 step)
            accel_attention=kernel_builds(),  # one ai.accel::CacheAttention a layer, where accel's kernel builds
            say=lambda line: print(line, file=sys.stderr, flush=True),
            progress=True,
        )
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

"""``TorchBackend``: the reference decoder (``accel.models.Decoder``) in torch behind the ``Backend`` protocol, on the
CPU or a CUDA GPU.

Weights and the KV cache stay on the chosen ``device``; a call uploads its token ids, positions and (tree calls) slot
ids and mask, and downloads float32 logits (and hidden states where asked). The cache has one slot more than
``ctx_len``: a scratch slot that padding columns write and no query sees (``WriteMode`` ``"dense"``), so a call has
no data-dependent shapes and no host sync, and each call signature runs on static buffers (``StaticCalls``), captured
as a CUDA graph on a GPU (``graphs``). ``compile=True`` compiles each transformer block with ``torch.compile``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch

from accel.backends.attention_triton import use_decode_attention
from accel.backends.base import BackendInfo, ScoringBackend
from accel.backends.calls import check_extensions, check_mix, check_moves, check_step_inputs, check_tree_inputs
from accel.backends.gemv_triton import use_gemv
from accel.backends.limits import check_sizes
from accel.backends.stages import StageOutput, StageSpec, check_hidden_in
from accel.backends.torch_graphs import CallKey, StaticCalls, resolve_device, resolve_dtype
from accel.backends.torch_mx_device import DeviceMXLinear, DevicePackReport, pack_device_mx
from accel.errors import BackendError
from accel.models.decoder import Decoder, ExtraInputs, new_cache

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TorchBackend", "TorchRuntime"]


class TorchRuntime(TypedDict, total=False):
    """``TorchBackend``'s runtime settings, given as its keywords (see its docstring): ``dtype``, ``threads``,
    ``device``, ``graphs``, ``compile``, ``fuse``, ``mx``, ``gemv``, ``decode_attention``."""

    dtype: torch.dtype | str | None
    threads: int | None
    device: str | torch.device
    graphs: bool | None
    compile: bool
    fuse: bool | None
    mx: str | Sequence[str] | None
    gemv: bool | None
    decode_attention: bool | None


class TorchBackend(ScoringBackend):
    """Run a ``Decoder`` with a KV cache of ``ctx_len`` positions kept in torch tensors (written in place).

    Args:
        model: the decoder (put in eval mode and, for another ``device`` or ``dtype``, moved and cast in place).
        ctx_len: KV-cache length in tokens.
        batch_size: rows per call.
        max_seq_len: most tokens per call (default ``ctx_len``).
        stage: run only layers ``[stage.start, stage.stop)`` as a pipeline stage (``accel.backends.stages``), with
            the cache of those layers; calls go through ``forward_stage``. Default: the whole model.
        exit_head: for a stage with ``exit_logits``: a callable from residual states ``[B, N, hidden]`` to logits
            ``[B, N, V]`` (``accel.drafts.early_exit.ExitHead``); default: the model's final norm and LM head.

    The runtime settings (``TorchRuntime``, keywords; an unknown one is a BackendError naming it):
        dtype: weight, cache and compute dtype: ``float32``, ``float16`` or ``bfloat16`` (a name or torch dtype;
            default: the model's parameter dtype). Norms, RoPE and softmax compute in float32 whatever it is.
        threads: torch intra-op threads (default: leave torch's setting).
        device: ``cpu``, ``cuda`` or ``cuda:N`` (``BackendError`` where CUDA is asked for and absent).
        graphs: run each call signature on static buffers, captured as a CUDA graph on a GPU (default: on for
            CUDA, off on the CPU, where ``True`` runs the same buffers eagerly).
        compile: compile each transformer block with ``torch.compile`` (in place; regional compilation: identical
            blocks share one compilation, and the first calls of new shapes compile: S = 1, then any S). Fuses a
            block's ~50 small kernels into ~15, which a GPU needs to stream weights at its bandwidth.
        fuse: fuse each block's q/k/v and gate/up projections into one matmul each (``Block.fuse``, in place; the
            model then keeps no Hugging Face layer names). Default: on for CUDA, off on the CPU.
        mx: MX format name(s) (e.g. ``"mxfp6"``): every Linear whose weight is exactly an MX weight of one of them
            (block 32) keeps it packed on the device and decodes it inside each call
            (``accel.backends.torch_mx_device``; with ``compile`` a decode step fuses decode and matmul into one
            kernel). Checked before the cast to ``dtype``; other layers are cast as usual. Default: none.
        gemv: run the float16/bfloat16 linear layers' one-row calls (decode steps at batch 1) through accel's Triton
            matrix-vector kernel (``accel.backends.gemv_triton``) instead of cuBLAS, where triton runs (a CUDA
            device); wider calls keep cuBLAS, which served 2-8 rows faster on an H200. Default: off.
        decode_attention: run one-token calls' attention through accel's Triton kernel
            (``accel.backends.attention_triton``), which reads only the cache slots each query sees, where triton
            runs. Default: off.
    """

    def __init__(
        self,
        model: Decoder,
        *,
        ctx_len: int,
        batch_size: int = 1,
        max_seq_len: int | None = None,
        stage: StageSpec | None = None,
        exit_head=None,
        **runtime: Unpack[TorchRuntime],
    ) -> None:
        if not hasattr(getattr(model, "config", None), "num_kv_heads"):
            raise BackendError(f"TorchBackend needs an accel.models.Decoder; got {type(model).__name__}")
        unknown = sorted(set(runtime) - set(TorchRuntime.__annotations__))
        if unknown:
            raise BackendError(
                f"TorchBackend got unknown keyword(s) {', '.join(unknown)}; runtime settings: "
                f"{', '.join(TorchRuntime.__annotations__)}"
            )
        cfg = model.config
        self.device = resolve_device(runtime.get("device", "cpu"))
        self.dtype = resolve_dtype(runtime.get("dtype"), next(model.parameters()).dtype)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
        threads = runtime.get("threads")
        _check_cpu_packed(model, self.device, self.dtype)
        check_sizes(ctx_len, batch_size, threads, per_token)
        _check_device_memory(self.device, (ctx_len + 1) * batch_size * per_token)
        if cfg.positions == "learned" and ctx_len > cfg.max_position_embeddings:
            raise BackendError(f"ctx_len {ctx_len} exceeds the model's {cfg.max_position_embeddings} learned positions")
        self._stage = stage or StageSpec.whole(cfg.num_layers)
        if self._stage.total != cfg.num_layers:
            raise BackendError(f"stage {self._stage} is not a layer range of this {cfg.num_layers}-layer model")
        if exit_head is not None and not self._stage.exit_logits:
            raise BackendError("exit_head given for a stage without exit_logits")
        self.exit_head = exit_head
        self._info = _backend_info(cfg, ctx_len, batch_size, min(max_seq_len or ctx_len, ctx_len), self._stage)
        if threads is not None:
            torch.set_num_threads(threads)
        self.model = _place(model, self.device).eval()
        self.mx_report = self._prepare_weights(runtime)
        # ctx_len slots and the scratch slot that padding writes (WriteMode "dense")
        with torch.device(self.device):
            self.keys, self.values = new_cache(
                cfg.with_(num_layers=self._stage.num_layers), batch_size, ctx_len + 1, self.dtype
            )
        self._calls = self._prepare(runtime, batch_size, ctx_len + 1)

    def _prepare_weights(self, runtime: TorchRuntime) -> DevicePackReport | None:
        """Fuse the blocks' projections as ``runtime`` asks (default: on CUDA), keep exact MX weights packed
        (``mx``), then cast the remaining floating parameters to the backend's dtype."""
        fuse = runtime.get("fuse")
        if fuse if fuse is not None else self.device.type == "cuda":
            for block in self.model.blocks:
                block.fuse()
        formats = runtime.get("mx")
        report = None
        if formats:
            report = pack_device_mx(self.model, [formats] if isinstance(formats, str) else list(formats))
        _cast(self.model, self.dtype)
        self.gemv_report = use_gemv(self.model) if runtime.get("gemv") else None
        self.attention_kernels = use_decode_attention(self.model, self.device) if runtime.get("decode_attention") else 0
        return report

    def _prepare(self, runtime: TorchRuntime, batch_size: int, slots: int) -> StaticCalls | None:
        """Compile the blocks as ``runtime`` asks (default: not compiled; with packed MX weights the LM head too,
        where it is packed), and the static call runner of whole-model calls where ``graphs`` is on (default: on
        CUDA), over ``slots`` cache slots."""
        on_gpu = self.device.type == "cuda"
        graphs = runtime.get("graphs")
        if runtime.get("compile", False):
            for block in self.model.blocks:  # regional compilation: one compiled block serves every layer
                block.compile()
            if isinstance(self.model.lm_head, DeviceMXLinear):
                self.model.lm_head.compile()
        if (graphs if graphs is not None else on_gpu) and self._stage.is_whole:
            return StaticCalls(self._step, batch_size=batch_size, slots=slots, device=self.device, capture=on_gpu)
        return None

    @property
    def info(self) -> BackendInfo:
        """Static facts about this backend."""
        return self._info

    def _score(
        self, input_ids, position_ids, num_logits: int | None, features, tree, mix, *, hidden: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One validated whole-model call: logits of the last ``num_logits`` columns and, with ``hidden``, the hidden
        states of every column (else None)."""
        if not self._stage.is_whole:
            raise BackendError("this TorchBackend runs a pipeline stage: call forward_stage (or use a Pipeline)")
        ids, pos = check_step_inputs(self._info, input_ids, position_ids, num_logits)
        feats = check_extensions(self._info, ids, features, hidden)
        slots_mask = check_tree_inputs(self._info, pos, tree)
        mixed = check_mix(self._info, ids, pos, mix)
        key = CallKey(ids.shape[1], num_logits or ids.shape[1], slots_mask is not None, hidden)
        with torch.inference_mode():
            t_ids, t_pos = self._put(ids), self._put(pos)
            slots = mask = None
            if slots_mask is not None:  # the scratch slot is hidden from every token
                slots = self._put(slots_mask[0])
                mask = self._put(np.concatenate([slots_mask[1], np.zeros((*slots_mask[1].shape[:2], 1), bool)], axis=2))
            if feats is None and mixed is None and self._calls is not None:
                logits, states = self._calls(key, t_ids, t_pos, slots, mask)
            else:
                logits, states = self._step(
                    t_ids,
                    t_pos,
                    slots,
                    mask,
                    key,
                    features=None if feats is None else self._put(feats).to(self.dtype),
                    mix=None if mixed is None else (self._put(mixed[0]), self._put(mixed[1])),
                )
            out = logits.cpu().numpy()
            return out, (states.cpu().numpy() if hidden else None)

    def _put(self, array: np.ndarray) -> torch.Tensor:
        """A host array as a tensor on this backend's device."""
        return torch.from_numpy(array).to(self.device)

    def _step(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        slots: torch.Tensor | None,
        mask: torch.Tensor | None,
        key: CallKey,
        features: torch.Tensor | None = None,
        mix: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One call on device tensors: float32 logits of the last ``key.num_logits`` columns (and float32 hidden
        states of every column where ``key.hidden``); writes the cache in place."""
        extra = ExtraInputs(features=features, slot_ids=slots, tree_mask=mask, mix=mix)
        hidden, _, _ = self.model.hidden_forward(ids, pos, self.keys, self.values, inplace="dense", extra=extra)
        logits = self.model.logits(hidden[:, -key.num_logits :, :]).float()
        return logits, (hidden.float() if key.hidden else None)

    @property
    def static_calls(self) -> StaticCalls | None:
        """The static-buffer runner of whole-model calls (None where ``graphs`` is off or for a pipeline stage)."""
        return self._calls

    @property
    def stage(self) -> StageSpec:
        """The layers this backend runs (``StageSpec.whole`` unless built with ``stage=``)."""
        return self._stage

    def forward_stage(
        self,
        position_ids: np.ndarray,
        *,
        input_ids: np.ndarray | None = None,
        hidden_in: np.ndarray | None = None,
        num_logits: int | None = None,
    ) -> StageOutput:
        """Run the stage's layers (``accel.backends.stages.StageBackend``): logits of the last ``num_logits`` columns
        (last stage, or exit stage) and the residual states after the stage (all but the last stage)."""
        st = self._stage
        ids = check_hidden_in(self._info, st, position_ids, input_ids, hidden_in)
        ids, pos = check_step_inputs(self._info, ids, position_ids, num_logits)
        model = self.model
        with torch.inference_mode():
            x, self.keys, self.values = model.stage_forward(
                self._put(pos),
                self.keys,
                self.values,
                layers=(st.start, st.stop),
                input_ids=self._put(ids) if st.is_first else None,
                hidden_in=None if st.is_first else self._put(np.asarray(hidden_in, np.float32)).to(self.dtype),
                inplace=True,
            )
            head_in = x if num_logits is None else x[:, -num_logits:, :]
            logits = None
            if st.is_last:
                logits = model.logits(model.norm(head_in)).float().cpu().numpy()
            elif st.exit_logits:
                head = self.exit_head or (lambda h: model.logits(model.norm(h)))
                logits = head(head_in).float().cpu().numpy()
        return StageOutput(logits, None if st.is_last else x.float().cpu().numpy())

    def reset(self) -> None:
        """Zero the KV cache."""
        for t in (*self.keys, *self.values):
            t.zero_()

    def move_cache(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy every layer's K/V from slots ``src`` to ``dst`` (int ``[B, M]``, -1 = none; ``check_moves``)."""
        s, d = check_moves(self._info, src, dst)
        for b in np.flatnonzero((s >= 0).any(axis=1)):
            keep = s[b] >= 0
            fro, to = self._put(s[b, keep]), self._put(d[b, keep])
            with torch.inference_mode():
                for t in (*self.keys, *self.values):
                    t[b, :, to] = t[b, :, fro]  # the right side is gathered (a copy) before the write, on the device


def _backend_info(cfg, ctx_len: int, batch_size: int, max_seq_len: int, stage: StageSpec) -> BackendInfo:
    """What the backend of ``cfg``'s model tells the loop; a pipeline stage has no extensions and its own layers."""
    whole = stage.is_whole
    caps = {"hidden_states", "tree", "mix"} | ({"features"} if cfg.feature_size else set())
    return BackendInfo(
        name="torch",
        vocab_size=cfg.vocab_size,
        ctx_len=ctx_len,
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        num_layers=cfg.num_layers if whole else stage.num_layers,
        capabilities=frozenset(caps if whole else set()),
        hidden_size=cfg.hidden_size,
        feature_size=cfg.feature_size if whole else 0,
    )


def _check_cpu_packed(model: Decoder, device: torch.device, dtype: torch.dtype) -> None:
    """Packed MX layers of the CPU kernel (``accel.backends.torch_mx``) run on the CPU in float32 only."""
    torch_mx = sys.modules.get("accel.backends.torch_mx")  # no packed layer exists before that module is imported
    packed = [] if torch_mx is None else [m for m in model.modules() if isinstance(m, torch_mx.PackedLinear)]
    if packed and (device.type != "cpu" or dtype != torch.float32):
        raise BackendError(
            f"{len(packed)} layers hold packed MX weights (the CPU kernel, float32 only); for {device} / {dtype}, "
            "load the checkpoint without pack_compressed and give mx= (its MX weights then stay packed on the "
            "device), or leave them decoded once into the dtype"
        )


def _place(model: Decoder, device: torch.device) -> Decoder:
    """Move ``model`` to ``device``, in place."""
    return model.to(device=device)


def _cast(model: Decoder, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating parameters to ``dtype``, in place (buffers such as RoPE's inverse frequencies keep
    their float32, packed MX planes their bytes)."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def _check_device_memory(device: torch.device, need: int) -> None:
    """``BackendError`` where a KV cache of ``need`` bytes exceeds the free memory of a CUDA ``device``."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    if need > free:
        raise BackendError(
            f"the KV cache needs {need / 2**30:.1f} GiB; {device} has {free / 2**30:.1f} GiB free of "
            f"{total / 2**30:.1f} GiB (lower ctx_len or batch_size)"
        )

"""Devices, dtypes and captured calls of the torch backend.

``resolve_device`` turns ``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` into a ``torch.device`` with a clear error where the
device is absent; ``resolve_dtype`` does the same for ``"float32"`` / ``"float16"`` / ``"bfloat16"``.

``StaticCalls`` runs one step function per call signature (tokens per call, logits per call, chain or tree, hidden
output) on static input buffers, gpt-fast's habit: the first call of a signature allocates its buffers, runs the
function twice on *blank* inputs (every column padding, so only the cache's scratch slot is written) and, on CUDA,
captures it into a ``torch.cuda.CUDAGraph``; later calls copy their inputs into the buffers and replay. One Python
call then launches the whole step (a 7B model's ~1,000 kernels) at once. On the CPU the same buffers and signatures
run eagerly (``capture=False``), so the tests exercise everything but the capture itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from accel.errors import BackendError

__all__ = ["DTYPES", "CallKey", "StaticCalls", "resolve_device", "resolve_dtype"]

#: dtype names the torch backend accepts (``--dtype``)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: most signatures captured per backend (each holds its own graph; later ones run eagerly)
MAX_CAPTURED = 160


def resolve_device(device: str | torch.device) -> torch.device:
    """``torch.device`` of ``device``; ``BackendError`` naming the problem for an unknown name, or for CUDA asked
    for where this torch build has none or sees no GPU."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"device {device!r} is not a torch device name (use cpu, cuda or cuda:N): {exc}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise BackendError(f"device {device!r}: the torch backend runs on cpu or cuda, not {dev.type}")
    if not torch.cuda.is_available():
        why = "it was built without CUDA" if torch.version.cuda is None else "it sees no CUDA GPU"
        raise BackendError(
            f"device {device!r} asked for, but torch {torch.__version__} cannot use CUDA here ({why}); "
            "use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA GPU"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise BackendError(f"device {device!r}: this machine has {count} CUDA device(s) (cuda:0 .. cuda:{count - 1})")
    return torch.device("cuda", dev.index or 0)


def resolve_dtype(dtype: str | torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """The torch dtype of ``dtype`` (a name of ``DTYPES`` or a torch dtype; None: ``default``)."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise BackendError(f"dtype {dtype}: the torch backend computes in float32, float16 or bfloat16")
        return dtype
    if dtype not in DTYPES:
        raise BackendError(f"dtype {dtype!r}: the torch backend computes in {', '.join(DTYPES)}")
    return DTYPES[dtype]


class CallKey(NamedTuple):
    """The signature of a call: its static shapes and the outputs it returns."""

    seq: int  # tokens per call
    num_logits: int  # logits of the last num_logits columns
    tree: bool  # slot ids and a tree mask given
    hidden: bool  # hidden states returned too


#: step(ids, pos, slots, mask, key) -> (logits float32 [B, N, V], hidden float32 [B, S, H] or None)
StepFn = Callable[..., tuple]


class _Call:
    """The static buffers of one signature (and its graph, when captured)."""

    def __init__(self, inputs: list[torch.Tensor | None]) -> None:
        self.inputs = inputs
        self.outputs: tuple = ()
        self.graph: torch.cuda.CUDAGraph | None = None


class StaticCalls:
    """Runs ``step`` on static buffers per ``CallKey``, captured as CUDA graphs where ``capture``.

    Args:
        step: the step function (writes the cache in place, ``WriteMode`` ``"dense"``).
        batch_size: rows per call.
        slots: cache slots including the scratch slot (the tree mask's width).
        device: where buffers live.
        capture: capture CUDA graphs (needs a CUDA device); False runs ``step`` eagerly on the buffers.
        max_captured: signatures kept; a call of a further signature runs ``step`` on its own inputs.
    """

    def __init__(
        self,
        step: StepFn,
        *,
        batch_size: int,
        slots: int,
        device: torch.device,
        capture: bool,
        max_captured: int = MAX_CAPTURED,
    ) -> None:
        if capture and device.type != "cuda":
            raise BackendError(f"CUDA graphs need a CUDA device; this backend runs on {device}")
        self.step, self.batch, self.slots, self.device = step, batch_size, slots, device
        self.capture, self.max_captured = capture, max_captured
        self.calls: dict[CallKey, _Call] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def __call__(
        self, key: CallKey, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor | None, mask: torch.Tensor | None
    ) -> tuple:
        """Outputs of ``step`` for these inputs (device tensors ``ids``/``pos`` ``[B, S]``, tree ``slots [B, S]``
        and ``mask [B, S, slots]`` or None); valid until the next call."""
        call = self.calls.get(key)
        if call is None:
            if len(self.calls) >= self.max_captured:
                return self.step(ids, pos, slots, mask, key)
            call = self._prepare(key)
        for buf, new in zip(call.inputs, (ids, pos, slots, mask), strict=True):
            if buf is not None and new is not None:
                buf.copy_(new, non_blocking=True)
        if call.graph is not None:
            call.graph.replay()
            return call.outputs
        return self.step(*call.inputs, key)

    def graph(self, key: CallKey) -> torch.cuda.CUDAGraph | None:
        """The captured graph of ``key`` (None: not captured yet, or not capturing); replaying it reruns the last
        inputs of that signature (benchmarks time it so, without the uploads)."""
        call = self.calls.get(key)
        return None if call is None else call.graph

    def _blank(self, key: CallKey) -> list[torch.Tensor | None]:
        """All-padding inputs of ``key``: positions -1, so every column writes the scratch slot only."""
        shape = (self.batch, key.seq)
        ids = torch.zeros(shape, dtype=torch.int64, device=self.device)
        pos = torch.full(shape, -1, dtype=torch.int64, device=self.device)
        if not key.tree:
            return [ids, pos, None, None]
        slots = torch.zeros(shape, dtype=torch.int64, device=self.device)
        mask = torch.zeros((*shape, self.slots), dtype=torch.bool, device=self.device)
        return [ids, pos, slots, mask]

    def _prepare(self, key: CallKey) -> _Call:
        call = _Call(self._blank(key))
        self.calls[key] = call
        if not self.capture:
            self.step(*call.inputs, key)  # the blank run a capture warms up with
            return call
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces, lazy inits)
            for _ in range(2):
                self.step(*call.inputs, key)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            call.outputs = self.step(*call.inputs, key)
        call.graph = graph
        return call

"""``HydraRuntime``: exported Hydra heads (``accel.drafts.hydra.export``) on onnxruntime (numpy + onnxruntime only).

One ``level(i, base, paths, k)`` call runs head i on every path of every row (one tree level: head i's graph, then
the shared LM head's); ``prefix(hidden,
position_ids)`` feeds the Hydra++ prefix layer new target states and returns its base states, keeping the layer's
KV cache in a runtime buffer that the graph updates in place (as ``accel.backends.OrtBackend`` does).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from accel.backends.cpu import int8_warning
from accel.backends.limits import MAX_BATCH_SIZE, MAX_CTX_LEN
from accel.backends.ort_backend import bound_outputs
from accel.backends.ort_graph import check_inplace_cache
from accel.backends.weights import INT8_SCHEMES
from accel.errors import AccelError, CpuWarning, DraftError

__all__ = ["EMBED", "HYDRA_WEIGHTS", "META", "ExportMeta", "HydraRuntime", "read_export_meta"]

HYDRA_WEIGHTS = ("fp32", "int8")
META, EMBED = "hydra.json", "embed.npy"
_FLOAT, _INT64 = "tensor(float)", "tensor(int64)"


class ExportMeta(BaseModel):
    """``hydra.json``, what ``HydraRuntime`` needs to know of an export (``export_hydra`` writes it): read strictly
    (JSON integers, booleans and numbers as such, no unknown field) and checked for consistency."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    num_heads: int = Field(ge=1, le=64)
    prefix: bool
    hidden_size: int = Field(ge=1, le=65536)
    vocab_size: int = Field(ge=1, le=1 << 22)
    head_vocab: int = Field(ge=1)
    ctx_len: int = Field(ge=2, le=MAX_CTX_LEN)
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)
    weights: Literal["fp32", "int8"]
    int8: str | None = None  # how int8 weights are stored (INT8_SCHEMES; absent: exported before it was recorded)
    kv_shape: tuple[int, int, int, int]
    target_fingerprint: float = Field(allow_inf_nan=False)

    @model_validator(mode="after")
    def _consistent(self) -> ExportMeta:
        if self.head_vocab > self.vocab_size:
            raise ValueError(f"head_vocab {self.head_vocab} exceeds vocab_size {self.vocab_size}")
        b, kv_heads, ctx, head_dim = self.kv_shape
        if b != self.batch_size or ctx != self.ctx_len or kv_heads < 1 or head_dim < 1:
            raise ValueError(
                f"kv_shape {list(self.kv_shape)} is not [batch_size {self.batch_size}, kv heads, ctx_len "
                f"{self.ctx_len}, head dim]"
            )
        if self.int8 is not None and (self.weights != "int8" or self.int8 not in INT8_SCHEMES):
            raise ValueError(f"int8 {self.int8!r} with {self.weights} weights (int8 weights take {INT8_SCHEMES})")
        return self


def read_export_meta(directory: Path) -> ExportMeta:
    """The checked ``hydra.json`` of an export directory; ``DraftError`` naming the file and every bad field."""
    path = directory / META
    if not path.is_file():
        raise DraftError(f"{directory} is not an exported Hydra heads directory (no {META}): see export_hydra")
    try:
        return ExportMeta.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
        raise DraftError(f"{path} is not a valid Hydra export description: {problems}") from None
    except OSError as exc:
        raise DraftError(f"cannot read {path}: {exc.strerror or exc}") from exc


def read_embed(path: Path, shape: tuple[int, int]) -> np.ndarray:
    """The export's embedding table ``embed.npy`` (memory-mapped): ``DraftError`` unless it is a float32 array of
    ``shape`` with finite values (a truncated, pickled or foreign file, another dtype or shape, NaN / ±Inf)."""
    try:
        embed = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DraftError(f"{path} is not a readable .npy array ({type(exc).__name__}: {exc})") from exc
    if not isinstance(embed, np.ndarray) or embed.dtype != np.float32 or embed.shape != shape:
        got = f"{embed.dtype} {embed.shape}" if isinstance(embed, np.ndarray) else type(embed).__name__
        raise DraftError(f"{path} holds {got}; the export needs float32 {shape}")
    if not bool(np.isfinite(embed).all()):
        raise DraftError(f"{path} holds NaN or infinite values: the export is damaged (export the heads again)")
    return embed


def _session(path: Path, threads: int | None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see OrtBackend: no busy-waiting pool
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise DraftError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0]}") from exc


def check_io(session: Any, path: Path, inputs: dict[str, tuple[str, tuple]], outputs: tuple[str, ...]) -> None:
    """``DraftError`` unless ``session`` (of the graph at ``path``) has exactly ``inputs`` (name -> (type, shape;
    ``None``: any size)) and at least ``outputs``, with every fixed dimension as given."""
    got = {i.name: i for i in session.get_inputs()}
    out = {o.name for o in session.get_outputs()}
    if set(got) != set(inputs) or not set(outputs) <= out:
        raise DraftError(
            f"{path}: inputs {sorted(got)} and outputs {sorted(out)}; this graph needs inputs {sorted(inputs)} and "
            f"outputs {list(outputs)} (not the graph export_hydra writes under this name)"
        )
    for name, (kind, shape) in inputs.items():
        dims = got[name].shape
        fixed = len(dims) == len(shape) and all(
            w is None or not isinstance(d, int) or d == w for d, w in zip(dims, shape, strict=True)
        )
        if got[name].type != kind or not fixed:
            raise DraftError(f"{path}: input {name} is {got[name].type} {dims}; the export needs {kind} {list(shape)}")


class HydraRuntime:
    """Exported heads in ``export_dir`` on onnxruntime (``threads``: intra-op threads of every session).

    Attributes: ``num_heads``, ``prefix`` (Hydra++), ``hidden_size``, ``vocab_size``, ``ctx_len`` (the prefix
    cache's length), ``batch_size``, ``weights`` (``fp32``/``int8``). Every file is checked when opened:
    ``hydra.json`` (``ExportMeta``), ``embed.npy`` (``read_embed``) and each graph's inputs and outputs, and the LM
    head is called once for ``head_vocab`` tokens (``DraftError`` naming the file).
    """

    def __init__(self, export_dir: str | Path, *, threads: int | None = None) -> None:
        d = Path(export_dir)
        meta = read_export_meta(d)
        self.num_heads, self.prefix = meta.num_heads, meta.prefix
        self.hidden_size, self.vocab_size = meta.hidden_size, meta.vocab_size
        self.ctx_len, self.batch_size, self.weights = meta.ctx_len, meta.batch_size, meta.weights
        self.head_vocab = meta.head_vocab
        names = [f"head{i}.onnx" for i in range(1, self.num_heads + 1)] + ["lm_head.onnx"]
        missing = [n for n in names if not (d / n).is_file()]
        missing += ["prefix.onnx"] if self.prefix and not (d / "prefix.onnx").is_file() else []
        if missing or not (d / EMBED).is_file():
            raise DraftError(f"{d}: missing {missing or [EMBED]}")
        self.embed = read_embed(d / EMBED, (self.vocab_size, self.hidden_size))
        warning = int8_warning(meta.int8 if self.weights == "int8" else "fp32")
        if warning is not None:
            warnings.warn(f"{d.name}: {warning}", CpuWarning, stacklevel=2)
        self.heads = [_session(d / f"head{i}.onnx", threads) for i in range(1, self.num_heads + 1)]
        self.lm_head = _session(d / "lm_head.onnx", threads)
        self._check_graphs(d)
        self._cache: list[np.ndarray] | None = None
        if self.prefix:
            self._open_prefix(d, meta.kv_shape, threads)

    def _check_graphs(self, d: Path) -> None:
        """The heads' and the LM head's inputs and outputs, and one LM head call for ``head_vocab`` tokens."""
        b, h = self.batch_size, self.hidden_size
        for i, head in enumerate(self.heads, 1):
            spec: dict[str, tuple[str, tuple]] = {
                "base": (_FLOAT, (b, 1, h)),
                "path_embeds": (_FLOAT, (b, None, i * h)),
            }
            check_io(head, d / f"head{i}.onnx", spec, ("state",))
        spec = {"state": (_FLOAT, (b, None, h)), "k": (_INT64, (1,))}
        check_io(self.lm_head, d / "lm_head.onnx", spec, ("topk_logp", "topk_ids"))
        feeds = {"state": np.zeros((b, 1, h), np.float32), "k": np.array([self.head_vocab], np.int64)}
        try:
            _, ids = self.lm_head.run(["topk_logp", "topk_ids"], feeds)
        except Exception as exc:
            raise DraftError(
                f"{d / 'lm_head.onnx'} cannot score the {self.head_vocab} head tokens {META} gives: "
                f"{str(exc).splitlines()[0]}"
            ) from exc
        if ids.shape != (b, 1, self.head_vocab) or ids.min() < 0 or ids.max() >= self.vocab_size:
            raise DraftError(
                f"{d / 'lm_head.onnx'}: its token ids are not {self.head_vocab} ids below {self.vocab_size}"
            )

    def _open_prefix(self, d: Path, kv_shape: tuple[int, int, int, int], threads: int | None) -> None:
        """The Hydra++ prefix layer's session, checked, with its cache bound in place."""
        import onnxruntime as ort

        try:
            check_inplace_cache(d / "prefix.onnx", 1)  # the graph lets the cache be updated in place
        except AccelError as exc:  # the backends' BackendError: here a draft artefact is damaged
            raise DraftError(str(exc)) from exc
        self._prefix = _session(d / "prefix.onnx", threads)
        b, h = self.batch_size, self.hidden_size
        spec = {
            "hidden": (_FLOAT, (b, None, h)),
            "position_ids": (_INT64, (b, None)),
            "past_key.0": (_FLOAT, kv_shape),
            "past_value.0": (_FLOAT, kv_shape),
        }
        check_io(self._prefix, d / "prefix.onnx", spec, ("base", "past_key.0_RetainedState"))
        cache = [np.zeros(kv_shape, np.float32) for _ in range(2)]
        self._cache = cache
        io = self._prefix.io_binding()
        io.bind_output("base")
        for kv, buf in zip(("key", "value"), cache, strict=True):
            v = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(f"past_{kv}.0", v)
            io.bind_ortvalue_output(f"past_{kv}.0_RetainedState", v)
        self._binding = io

    def reset(self) -> None:
        """Zero the prefix layer's cache (a new run)."""
        for buf in self._cache or []:
            buf.fill(0.0)

    def prefix_states(self, hidden: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Feed the prefix layer the target's states ``hidden [B, S, H]`` at ``position_ids [B, S]`` (-1: padding;
        at most ``ctx_len - 1``); returns its base states ``[B, S, H]`` (garbage at padding)."""
        if not self.prefix:
            raise DraftError("these heads have no prefix layer")
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        pos = np.ascontiguousarray(position_ids, dtype=np.int64)
        if hidden.ndim != 3 or hidden.shape[0] != self.batch_size or hidden.shape[2] != self.hidden_size:
            raise DraftError(f"hidden must be [{self.batch_size}, S, {self.hidden_size}]; got {hidden.shape}")
        if pos.shape != hidden.shape[:2]:
            raise DraftError(f"position_ids {pos.shape} do not match hidden {hidden.shape[:2]}")
        if pos.max(initial=-1) >= self.ctx_len:
            raise DraftError(f"position {int(pos.max())} is beyond the prefix cache (ctx_len {self.ctx_len})")
        io = self._binding
        io.bind_cpu_input("hidden", hidden)
        io.bind_cpu_input("position_ids", pos)
        io.bind_output("base")
        self._prefix.run_with_iobinding(io)
        return bound_outputs(io, 1)[0]

    def level(self, index: int, base: np.ndarray, paths: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Head ``index`` on ``paths [B, M, index]`` (token ids from the root on) below ``base [B, H]`` (or
        ``[B, 1, H]``); returns ``(token ids [B, M, k] int64, log-probs [B, M, k] float32)``, best first."""
        if not 1 <= index <= self.num_heads:
            raise DraftError(f"head index {index} is outside 1..{self.num_heads}")
        paths = np.asarray(paths, dtype=np.int64)
        if paths.ndim != 3 or paths.shape[0] != self.batch_size or paths.shape[2] != index:
            raise DraftError(f"head {index} needs paths [{self.batch_size}, M, {index}]; got {paths.shape}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.head_vocab:
            raise DraftError(f"k must be an int in 1..{self.head_vocab} (the heads' LM head tokens); got {k!r}")
        if paths.size and (paths.min() < 0 or paths.max() >= self.vocab_size):
            raise DraftError(f"path token ids must be in [0, {self.vocab_size})")
        base = np.asarray(base, dtype=np.float32).reshape(self.batch_size, 1, self.hidden_size)
        embeds = np.asarray(self.embed[paths.reshape(-1)], dtype=np.float32)
        feeds = {"base": base, "path_embeds": embeds.reshape(paths.shape[0], paths.shape[1], -1)}
        (state,) = self.heads[index - 1].run(["state"], feeds)
        logp, ids = self.lm_head.run(["topk_logp", "topk_ids"], {"state": state, "k": np.array([k], dtype=np.int64)})
        return ids, logp

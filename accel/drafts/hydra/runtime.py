"""``HydraRuntime``: exported Hydra heads (``accel.drafts.hydra.export``) on onnxruntime (numpy + onnxruntime only).

One ``level(i, base, paths, k)`` call runs head i on every path of every row (one tree level: head i's graph, then
the shared LM head's); ``prefix(hidden,
position_ids)`` feeds the Hydra++ prefix layer new target states and returns its base states, keeping the layer's
KV cache in a runtime buffer that the graph updates in place (as ``accel.backends.OrtBackend`` does).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from accel.backends.cpu import int8_warning
from accel.errors import CpuWarning, DraftError

__all__ = ["HydraRuntime"]


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
        raise DraftError(f"onnxruntime cannot load {path}: {exc}") from exc


class HydraRuntime:
    """Exported heads in ``export_dir`` on onnxruntime (``threads``: intra-op threads of every session).

    Attributes: ``num_heads``, ``prefix`` (Hydra++), ``hidden_size``, ``vocab_size``, ``ctx_len`` (the prefix
    cache's length), ``batch_size``, ``weights`` (``fp32``/``int8``).
    """

    def __init__(self, export_dir: str | Path, *, threads: int | None = None) -> None:
        d = Path(export_dir)
        meta_path = d / "hydra.json"
        if not meta_path.is_file():
            raise DraftError(f"{d} is not an exported Hydra heads directory (no hydra.json): see export_hydra")
        try:
            meta = json.loads(meta_path.read_text())
            self.num_heads, self.prefix = int(meta["num_heads"]), bool(meta["prefix"])
            self.hidden_size, self.vocab_size = int(meta["hidden_size"]), int(meta["vocab_size"])
            self.ctx_len, self.batch_size = int(meta["ctx_len"]), int(meta["batch_size"])
            self.weights, kv_shape = str(meta["weights"]), tuple(int(v) for v in meta["kv_shape"])
            self.head_vocab = int(meta["head_vocab"])
            int8_scheme = meta.get("int8") if self.weights == "int8" else "fp32"
        except (ValueError, KeyError, TypeError) as exc:
            raise DraftError(f"{meta_path} is invalid: {exc!r}") from exc
        names = [f"head{i}.onnx" for i in range(1, self.num_heads + 1)] + ["lm_head.onnx"]
        missing = [n for n in names if not (d / n).is_file()]
        missing += ["prefix.onnx"] if self.prefix and not (d / "prefix.onnx").is_file() else []
        if missing or not (d / "embed.npy").is_file():
            raise DraftError(f"{d}: missing {missing or ['embed.npy']}")
        self.embed = np.load(d / "embed.npy", mmap_mode="r")
        if self.embed.shape != (self.vocab_size, self.hidden_size):
            raise DraftError(
                f"{d}/embed.npy has shape {self.embed.shape}; expected {(self.vocab_size, self.hidden_size)}"
            )
        warning = int8_warning(int8_scheme)
        if warning is not None:
            warnings.warn(f"{d.name}: {warning}", CpuWarning, stacklevel=2)
        self.heads = [_session(d / f"head{i}.onnx", threads) for i in range(1, self.num_heads + 1)]
        self.lm_head = _session(d / "lm_head.onnx", threads)
        self._cache = None
        if self.prefix:
            import onnxruntime as ort

            from accel.backends.ort_backend import check_inplace_cache

            check_inplace_cache(d / "prefix.onnx", 1)  # the graph lets the cache be updated in place
            self._prefix = _session(d / "prefix.onnx", threads)
            self._cache = [np.zeros(kv_shape, np.float32) for _ in range(2)]
            io = self._prefix.io_binding()
            io.bind_output("base")
            for kv, buf in zip(("key", "value"), self._cache, strict=True):
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
        return io.get_outputs()[0].numpy()

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

"""Figures (PNG) for the simulator: roofline, SpD speedup heatmap over (K, alpha), time-breakdown bars.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend change). Each function takes the output
path, writes atomically (temp file + rename) and returns the path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from accel.errors import SimError
from accel.sim.formats import compute_dtype
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.hf_config import resolve_model
from accel.sim.predict import BREAKDOWN_KEYS, ModelLike, Prediction
from accel.sim.roofline import step_time
from accel.sim.sweeps import sweep


def _figure(w: float = 7.0, h: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def check_png_path(path: str | Path) -> Path:
    """``path`` as a ``Path`` if it names a PNG file (``.png``, not an existing folder); ``SimError`` otherwise."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise SimError(f"plot path must end in .png, got {str(path)!r}")
    if path.is_dir():
        raise SimError(f"plot path {str(path)!r} is a folder; give a file name ending in .png")
    return path


def _save(fig, path: str | Path) -> Path:
    """Write ``fig`` as PNG through a temporary sibling renamed into place (no half-written file on failure)."""
    path = check_png_path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
        os.close(fd)
        fig.savefig(tmp, format="png", bbox_inches="tight")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except OSError as exc:
        raise SimError(f"cannot write plot {str(path)!r}: {exc}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    return path


def roofline(
    model: ModelLike,
    hardware: Hardware | str,
    path: str | Path,
    *,
    weight_format: str = "fp16",
    k: int = 7,
    prompt_len: int = 128,
    context_len: int = 512,
    batch_size: int = 1,
    devices: int | None = None,
) -> Path:
    """Roofline (attainable FLOP/s vs arithmetic intensity, with efficiency terms applied) and the model's decode
    (S=1), scoring (S=K+1) and prefill (S=prompt_len) calls as points (FLOPs / bytes, FLOPs / predicted time)."""
    spec, hw = resolve_model(model), _hardware(hardware)
    n = hw.num_devices if devices is None else devices
    calls = {  # (new tokens, past length, logits)
        "decode (S=1)": (1, context_len, 1),
        f"scoring (S={k + 1})": (k + 1, context_len, k + 1),
        f"prefill (S={prompt_len})": (prompt_len, 0, 1),
    }

    peak = n * hw.peak_flops(compute_dtype(weight_format)) * hw.compute_efficiency
    bw = n * hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    fig = _figure()
    ax = fig.add_subplot()
    pts = []
    for label, (S, L, NL) in calls.items():
        st = step_time(
            spec,
            hw,
            weight_format=weight_format,
            batch_size=batch_size,
            devices=devices,
            new_tokens=S,
            context_len=L,
            num_logits=NL,
        )
        nbytes = st.weight_bytes + st.kv_read_bytes + st.kv_write_bytes + st.activation_bytes
        pts.append((label, st.flops / nbytes, st.flops / st.time_s, st.bound))
    lo = min(p[1] for p in pts) / 4
    hi = max(max(p[1] for p in pts), peak / bw) * 4
    ai = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(ai, np.minimum(peak, ai * bw), "k-", label=f"{hw.name} x{n} (efficiency applied)")
    for label, x, y, bound in pts:
        ax.loglog([x], [y], "o", label=f"{label}: {y / 1e12:.3g} TFLOP/s, {bound}")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{spec.name} ({weight_format}), batch {batch_size}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def speedup_heatmap(
    target: ModelLike,
    draft: ModelLike,
    hardware: Hardware | str,
    path: str | Path,
    *,
    target_format: str = "mxfp6",
    draft_format: str = "fp16",
    k_max: int = 12,
    alpha: np.ndarray | None = None,
    batch_size: int = 1,
    context_len: int = 512,
    devices: int | None = None,
    draft_devices: int = 1,
) -> Path:
    """Heatmap of SpD decode speedup over AR (same target format) on the (K, alpha) grid; contour at 1x."""
    alpha = np.linspace(0, 1, 51) if alpha is None else np.asarray(alpha, dtype=np.float64)
    r = sweep(
        target,
        draft,
        hardware,
        k=range(1, k_max + 1),
        alpha=alpha,
        target_format=[target_format],
        batch_size=[batch_size],
        context_len=[context_len],
        draft_format=draft_format,
        devices=devices,
        draft_devices=draft_devices,
    )
    s = r.speedup[0, 0, 0]  # (K, alpha)
    fig = _figure()
    ax = fig.add_subplot()
    im = ax.pcolormesh(alpha, r.axes["k"], s, shading="nearest", cmap="RdYlGn", vmin=0, vmax=max(2.0, s.max()))
    ax.contour(alpha, r.axes["k"], s, levels=[1.0], colors="k", linewidths=1.5)
    fig.colorbar(im, ax=ax, label="SpD speedup over AR")
    ax.set_xlabel("acceptance alpha")
    ax.set_ylabel("K (draft tokens per loop)")
    ax.set_title(
        f"{resolve_model(target).name} ({target_format}) + {resolve_model(draft).name}, "
        f"{_hardware(hardware).name}, B={batch_size}, L={context_len}",
        fontsize=9,
    )
    return _save(fig, path)


def breakdown_bars(prediction: Prediction, path: str | Path) -> Path:
    """Stacked bars: seconds per generated token of the four configurations, split into target memory / compute /
    communication / overhead, draft and host time."""
    if not isinstance(prediction, Prediction):
        raise SimError("breakdown_bars needs a Prediction from predict_speedup")
    fig = _figure()
    ax = fig.add_subplot()
    names = [c.name for c in prediction.configs]
    bottom = np.zeros(len(names))
    for key in BREAKDOWN_KEYS:
        vals = np.array([c.breakdown_s[key] for c in prediction.configs]) * 1e3
        if vals.any():
            label = "target compute / decompress" if key == "target_compute" else key.replace("_", " ")
            ax.bar(names, vals, bottom=bottom, label=label)
            bottom += vals
    for i, c in enumerate(prediction.configs):
        ax.text(i, bottom[i], f"{c.decode_speedup:.2f}x", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, bottom.max() * 1.12)
    ax.set_ylabel("ms per generated token")
    ax.set_title(f"{prediction.target} + {prediction.draft} on {prediction.hardware}, K={prediction.k}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)

"""Figures (PNG) for the simulator: roofline, SpD speedup heatmap over (K, alpha), time-breakdown bars.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend change). Each function takes the output
path, writes atomically (temp file + rename) and returns the path.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from accel._legacy import Replaced, legacy_keywords
from accel.errors import SimError
from accel.sim.deployment import Deployment, HardwareLike, as_deployment
from accel.sim.formats import compute_dtype
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.hf_config import resolve_model
from accel.sim.predict import BREAKDOWN_KEYS, ModelLike, Prediction
from accel.sim.roofline import CallShape, step_time
from accel.sim.sweeps import SweepAxes, sweep


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


@dataclass(frozen=True)
class RooflinePoints:
    """The calls :func:`roofline` marks, each for ``batch_size`` sequences: a decode step (S = 1) and the scoring call
    of a chain of ``k`` drafts (S = K + 1) after ``context_len`` cached tokens, and the prefill of ``prompt_len``
    tokens (sizes in tokens)."""

    k: int = 7
    prompt_len: int = 128
    context_len: int = 512
    batch_size: int = 1

    def calls(self) -> dict[str, CallShape]:
        """The labelled calls."""
        b, k, L = self.batch_size, self.k, self.context_len
        return {
            "decode (S=1)": CallShape(b, 1, L, 1),
            f"scoring (S={k + 1})": CallShape(b, k + 1, L, k + 1),
            f"prefill (S={self.prompt_len})": CallShape(b, self.prompt_len, 0, 1),
        }


_ROOFLINE_LEGACY = (Replaced("points", RooflinePoints, {f.name: f.name for f in fields(RooflinePoints)}),)


def roofline(
    model: ModelLike,
    hardware: Hardware | str,
    path: str | Path,
    points: RooflinePoints | None = None,
    *,
    weight_format: str = "fp16",
    devices: int | None = None,
    **legacy: Any,
) -> Path:
    """Roofline (attainable FLOP/s vs arithmetic intensity, with efficiency terms applied) and the model's decode,
    scoring and prefill calls (``points``, default ``RooflinePoints()``) as points (FLOPs / bytes, FLOPs / predicted
    time), weights in ``weight_format`` on ``devices`` (default: the card's). Deprecated: ``k``, ``prompt_len``,
    ``context_len``, ``batch_size`` as keywords (use ``points=RooflinePoints(...)``)."""
    points = legacy_keywords("roofline", legacy, _ROOFLINE_LEGACY, {"points": points})[0]["points"] or RooflinePoints()
    spec, hw = resolve_model(model), _hardware(hardware)
    n = hw.num_devices if devices is None else devices
    peak = n * hw.peak_flops(compute_dtype(weight_format)) * hw.compute_efficiency
    bw = n * hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    fig = _figure()
    ax = fig.add_subplot()
    pts = []
    for label, call in points.calls().items():
        st = step_time(spec, hw, call, weight_format=weight_format, devices=devices)
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
    ax.set_title(f"{spec.name} ({weight_format}), batch {points.batch_size}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


#: the older form's defaults of ``speedup_heatmap`` (target, draft, hardware, path, **fields)
HEATMAP_DEFAULTS: dict[str, Any] = dict(target_format="mxfp6", batch_size=1, draft_format="fp16", draft_devices=1)


def speedup_heatmap(
    deployment: Deployment | ModelLike,
    draft: ModelLike | None = None,
    hardware: HardwareLike | None = None,
    path: str | Path | None = None,
    *,
    k_max: int = 12,
    alpha: np.ndarray | None = None,
    context_len: int = 512,
    **settings: Any,
) -> Path:
    """Heatmap of SpD decode speedup over AR (same target format) on the (K, alpha) grid, K = 1..``k_max``, at past
    length ``context_len`` (tokens); contour at 1x. ``deployment``: a ``Deployment`` (its target format and batch
    size are plotted; ``settings`` override its fields), or the older form ``(target, draft, hardware, path,
    **fields)`` with its defaults (``HEATMAP_DEFAULTS``: mxfp6 target, batch 1, fp16 draft on one device; the
    ``target_format`` and ``batch_size`` fields are the plotted ones, the devices chosen as for batch 1)."""
    if path is None:
        raise SimError("speedup_heatmap needs a path (a .png file)")
    if isinstance(deployment, Deployment):
        dep = as_deployment(deployment, draft, hardware, settings)
        fmt, batch = dep.target_format, dep.batch_size
    else:
        older = {**HEATMAP_DEFAULTS, **settings}
        fmt, batch = older.pop("target_format"), older.pop("batch_size")
        dep = as_deployment(deployment, draft, hardware, older)
    alpha = np.linspace(0, 1, 51) if alpha is None else np.asarray(alpha, dtype=np.float64)
    r = sweep(dep, k=range(1, k_max + 1), alpha=alpha, axes=SweepAxes([fmt], [batch], [context_len]))
    assert dep.draft is not None  # sweep refuses a deployment without one
    s = r.speedup[0, 0, 0]  # (K, alpha)
    fig = _figure()
    ax = fig.add_subplot()
    im = ax.pcolormesh(alpha, r.axes["k"], s, shading="nearest", cmap="RdYlGn", vmin=0, vmax=max(2.0, s.max()))
    ax.contour(alpha, r.axes["k"], s, levels=[1.0], colors="k", linewidths=1.5)
    fig.colorbar(im, ax=ax, label="SpD speedup over AR")
    ax.set_xlabel("acceptance alpha")
    ax.set_ylabel("K (draft tokens per loop)")
    ax.set_title(
        f"{dep.target.name} ({fmt}) + {dep.draft.name}, {dep.hardware.name}, B={batch}, L={context_len}", fontsize=9
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

"""CompressionReport: what compression did to each layer (bytes, SQNR, max error, non-finite values) and in total.

Non-finite policy (``NONFINITE_POLICIES``): a weight holding NaN or ±Inf is an error by default (``"error"``:
FormatError naming the tensor and the count, before anything is written); with ``"keep"`` it is compressed (each
block holding one decodes to NaN, OCP MX v1.0 §6.3 as in ``scaling``), a ``NonFiniteWarning`` is issued, and the
report counts the non-finite inputs and the elements that decode to NaN, per layer and in total. SQNR and max error
are computed over the elements that are finite before and after, so they stay meaningful, and the summary says how
many elements they leave out: an average never hides the damage.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from pydantic import BaseModel, Field, computed_field

from accel.errors import FormatError, NonFiniteWarning
from accel.formats.constants import BYTES_FP16, BYTES_FP32

#: what compression does with NaN / ±Inf weights: refuse (default), or keep them as NaN blocks with a warning
NONFINITE_POLICIES = ("error", "keep")


class LayerReport(BaseModel):
    """One compressed weight."""

    name: str
    shape: tuple[int, ...]
    fmt: str
    bytes_before: int = Field(description="bytes of the weight as it was stored (its own dtype)")
    bytes_after: int = Field(description="bytes of packed codes + E8M0 scales")
    sqnr_db: float = Field(description="10 log10(sum w^2 / sum (w - w_q)^2) over finite elements; inf if exact")
    max_abs_error: float = Field(description="over the elements finite before and after")
    nonfinite_in: int = Field(default=0, description="NaN / ±Inf elements of the original weight")
    nan_out: int = Field(
        default=0, description="elements that decode to NaN or ±Inf (every element of a NaN-scale block)"
    )

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class CompressionReport(BaseModel):
    """Per-layer figures and totals over the compressed layers; savings are fractions (0.609 = 60.9 %)."""

    fmt: str
    block_size: int
    layers: list[LayerReport] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="weights left uncompressed")
    nonfinite: str = Field(default="error", description="non-finite policy: 'error' or 'keep'")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nonfinite_in(self) -> int:
        """NaN / ±Inf elements over all compressed weights (non-zero only with ``nonfinite='keep'``)."""
        return sum(layer.nonfinite_in for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nan_out(self) -> int:
        """Elements that decode to NaN over all compressed weights."""
        return sum(layer.nan_out for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nonfinite_layers(self) -> list[str]:
        return [layer.name for layer in self.layers if layer.nonfinite_in or layer.nan_out]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_before(self) -> int:
        return sum(layer.bytes_before for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_after(self) -> int:
        return sum(layer.bytes_after for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_fp16(self) -> int:
        return sum(layer.numel * BYTES_FP16 for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_fp32(self) -> int:
        return sum(layer.numel * BYTES_FP32 for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def saving_vs_fp16(self) -> float:
        return 1 - self.bytes_after / self.bytes_fp16 if self.layers else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def saving_vs_fp32(self) -> float:
        return 1 - self.bytes_after / self.bytes_fp32 if self.layers else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_sqnr_db(self) -> float:
        finite = [layer.sqnr_db for layer in self.layers if math.isfinite(layer.sqnr_db)]
        return float(np.mean(finite)) if finite else math.inf

    def summary(self) -> str:
        """A few lines for a terminal (a WARNING line first when weights held non-finite values)."""
        text = (
            f"{len(self.layers)} weights compressed to {self.fmt} (block {self.block_size}), {len(self.skipped)} kept\n"
            f"compressed weights: {self.bytes_before / 1e6:.2f} MB -> {self.bytes_after / 1e6:.2f} MB; "
            f"saving {self.saving_vs_fp16:.1%} vs FP16, {self.saving_vs_fp32:.1%} vs FP32; "
            f"mean SQNR {self.mean_sqnr_db:.2f} dB"
        )
        warning = self.nonfinite_warning()
        return f"WARNING: {warning}\n{text}" if warning else text

    def nonfinite_warning(self) -> str:
        """The warning about non-finite values ('' when there were none)."""
        if not self.nonfinite_layers:
            return ""
        names = ", ".join(self.nonfinite_layers[:3]) + (" ..." if len(self.nonfinite_layers) > 3 else "")
        return (
            f"{self.nonfinite_in} non-finite value(s) in {len(self.nonfinite_layers)} weight(s) ({names}) were kept: "
            f"{self.nan_out} element(s) now decode to NaN; SQNR and max error leave them out"
        )


def check_policy(nonfinite: str) -> str:
    """``nonfinite`` if it is one of NONFINITE_POLICIES, else FormatError."""
    if nonfinite not in NONFINITE_POLICIES:
        raise FormatError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
    return nonfinite


def count_nonfinite(array: np.ndarray, chunk_elements: int = 1 << 20) -> int:
    """NaN / ±Inf elements of a float array, counted chunk by chunk (a few MB of temporaries)."""
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind != "f":
        return 0
    return sum(
        int(flat[i : i + chunk_elements].size - np.count_nonzero(np.isfinite(flat[i : i + chunk_elements])))
        for i in range(0, flat.size, chunk_elements)
    )


def check_nonfinite(name: str, count: int, size: int, nonfinite: str) -> None:
    """Apply the non-finite policy to one weight (``count`` NaN/Inf of ``size`` elements) before it is compressed."""
    if count and nonfinite == "error":
        raise FormatError(
            f"weight {name!r} holds {count} NaN/Inf value(s) of {size}: fix the checkpoint, or keep them as NaN "
            "blocks with nonfinite='keep' (--nonfinite keep)"
        )
    if count:
        warnings.warn(f"weight {name!r}: {count} NaN/Inf value(s) kept as NaN blocks", NonFiniteWarning, stacklevel=3)


def error_stats(original: np.ndarray, restored: np.ndarray, chunk_elements: int = 1 << 20) -> tuple[float, float]:
    """(SQNR in dB, max abs error) of ``restored`` against ``original`` over the elements finite in both, summed in
    float64 chunk by chunk (so the extra memory is a few MB whatever the tensor size)."""
    x_all, y_all = np.asarray(original).reshape(-1), np.asarray(restored).reshape(-1)
    signal = noise = max_err = 0.0
    for i in range(0, x_all.size, chunk_elements):
        x = x_all[i : i + chunk_elements].astype(np.float64)
        err = x - y_all[i : i + chunk_elements]
        ok = np.isfinite(err)  # NaN/Inf in either
        if not ok.all():
            x, err = x[ok], err[ok]
        signal += float(np.dot(x, x))
        noise += float(np.dot(err, err))
        max_err = max(max_err, float(np.max(np.abs(err), initial=0.0)))
    sqnr = math.inf if noise == 0 else (-math.inf if signal == 0 else 10 * math.log10(signal / noise))
    return sqnr, max_err


def layer_report(
    name: str,
    original: np.ndarray,
    restored: np.ndarray,
    fmt: str,
    bytes_before: int,
    bytes_after: int,
    nonfinite_in: int = 0,
) -> LayerReport:
    """The LayerReport of one compressed weight (``restored``: its dequantized values)."""
    sqnr, max_err = error_stats(original, restored)
    return LayerReport(
        name=name,
        shape=tuple(np.shape(original)),
        fmt=fmt,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        sqnr_db=sqnr,
        max_abs_error=max_err,
        nonfinite_in=nonfinite_in,
        nan_out=count_nonfinite(restored),
    )

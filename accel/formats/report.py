"""CompressionReport: what compression did to each layer (bytes, SQNR, max error) and in total."""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, Field, computed_field

from accel.formats.constants import BYTES_FP16, BYTES_FP32


class LayerReport(BaseModel):
    """One compressed weight."""

    name: str
    shape: tuple[int, ...]
    fmt: str
    bytes_before: int = Field(description="bytes of the weight as it was stored (its own dtype)")
    bytes_after: int = Field(description="bytes of packed codes + E8M0 scales")
    sqnr_db: float = Field(description="10 log10(sum w^2 / sum (w - w_q)^2); inf if exact")
    max_abs_error: float

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class CompressionReport(BaseModel):
    """Per-layer figures and totals over the compressed layers; savings are fractions (0.609 = 60.9 %)."""

    fmt: str
    block_size: int
    layers: list[LayerReport] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="weights left uncompressed")

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
        """A few lines for a terminal."""
        return (
            f"{len(self.layers)} weights compressed to {self.fmt} (block {self.block_size}), {len(self.skipped)} kept\n"
            f"compressed weights: {self.bytes_before / 1e6:.2f} MB -> {self.bytes_after / 1e6:.2f} MB; "
            f"saving {self.saving_vs_fp16:.1%} vs FP16, {self.saving_vs_fp32:.1%} vs FP32; "
            f"mean SQNR {self.mean_sqnr_db:.2f} dB"
        )


def error_stats(original: np.ndarray, restored: np.ndarray, chunk_elements: int = 1 << 20) -> tuple[float, float]:
    """(SQNR in dB, max abs error) of ``restored`` against ``original``, summed in float64 chunk by chunk (so the
    extra memory is a few MB whatever the tensor size)."""
    x_all, y_all = np.asarray(original).reshape(-1), np.asarray(restored).reshape(-1)
    signal = noise = max_err = 0.0
    for i in range(0, x_all.size, chunk_elements):
        x = x_all[i : i + chunk_elements].astype(np.float64)
        err = x - y_all[i : i + chunk_elements]
        signal += float(np.dot(x, x))
        noise += float(np.dot(err, err))
        max_err = max(max_err, float(np.max(np.abs(err))))
    sqnr = math.inf if noise == 0 else (-math.inf if signal == 0 else 10 * math.log10(signal / noise))
    return sqnr, max_err

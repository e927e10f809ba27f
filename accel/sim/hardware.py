"""``Hardware``: a device profile (per device/SoC), lookup in the built-in catalog, and YAML/JSON loading.

All bandwidths, capacities and rates are *per device* (one GPU, one Cloud AI 100 SoC, one TPU chip); ``num_devices``
says how many one card or node has (the Ultra: 4 SoCs). A deployment may use fewer, or more (several cards).

What the roofline does not know are explicit, documented, fittable terms (defaults and their sources:
``catalog.py``; fitting: ``calibration.py``):
- ``bandwidth_efficiency``: achieved fraction of the spec memory bandwidth when streaming weights at one row.
- ``kv_bandwidth_efficiency``: achieved fraction of the spec memory bandwidth when attention reads the KV cache
  (``None``: ``bandwidth_efficiency``). On accel's H200 the cache streams slower than the weights (attention's
  batched matrix-vector products over strided heads; docs/sim.md §6).
- ``compute_efficiency``: achieved fraction of peak FLOP/s in matrix products.
- ``call_overhead_s``: fixed seconds per model call (launch, host round trip, synchronisation).
- ``layer_overhead_s``: fixed seconds per decoder layer per call (kernel launches and their tails, per-layer
  synchronisation across cores): a per-token cost that does not shrink with weight bytes or with more devices.
- ``row_overhead_s``: seconds per decoder layer per row (batch x new tokens) of a call beyond the first: the work of
  a layer's small kernels that grows with the rows but not with the weights (attention over the cache with its
  scores, rotary, norms, residual adds, the cache write; docs/sim.md §2). 0 = none (every device but the H200 entry,
  whose value is fitted on accel's own H200 measurements).
- ``decompress_elements_per_s``: weight elements per second one device expands from a stored format to its compute
  dtype, per format (``mxfp6``, ``int4``, ``int8``, ``fp8``, ...); a format without an entry is free to expand.
  ``decompress_overlap``: ``True`` = expansion runs beside the weight stream (the slower of the two sets the pace);
  ``False`` = it adds to it.
- ``multi_token_penalty`` (beta) and ``multi_token_exponent`` (gamma): a call with r = batch * new_tokens rows
  streams weights ``1 + beta * (r - 1) ** gamma`` times slower than a single row (docs/reference.md §8: on the 2-core
  EPYC a matmul with 2-16 rows streams at ~4-5 GB/s vs ~16 GB/s for one row). 0 = the pure roofline.
  ``decompress_multi_token_penalty`` / ``decompress_multi_token_exponent``: the same factor for the decompression
  term (a kernel-bound product, e.g. onnxruntime's 8-bit ``MatMulNBits`` on a CPU, whose int8 activation quantization
  and integer GEMM grow with the rows unlike a memory stream); ``None`` = the memory terms above.
- links (tensor parallelism): one all-reduce of b bytes over n devices costs
  ``allreduce_latency_s + link_latency_s * ceil(log2 n) + 2 (n - 1) / n * b / link_bandwidth_bytes_per_s``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import decompress_key


class CalibrationReport(SimModel):
    """Result of :func:`accel.sim.calibrate`: fitted values, relative residuals (``pred / measured - 1``, in the
    order of the observations, with their labels), the terms held fixed at their prior values (``held_fixed``: term
    -> the value kept; ``not_fitted``: their names), the RMS relative residual of every term set the choice by fit
    tried (``tried``: ``"a+b"`` -> RMS; empty when ``fit`` was given), and any warning the fit raised."""

    fitted: dict[str, float]
    residuals: list[float]
    labels: list[str] = Field(default_factory=list)
    rms_relative_error: float
    max_relative_error: float
    n_observations: int
    not_fitted: list[str] = Field(default_factory=list)
    held_fixed: dict[str, float] = Field(default_factory=dict)
    tried: dict[str, float] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class Hardware(SimModel):
    """One accelerator type: per-device bandwidth (bytes/s), capacity (bytes), peak FLOP/s, plus efficiency terms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: str = Field(
        default="",
        description="device family whose fixed-cost and link defaults it carries (catalog.FAMILY_DEFAULTS): "
        "gpu-nvlink, gpu-pcie, tpu-ici, gaudi-roce, cloud-ai-100; '' = none (a custom or measured device)",
    )
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    memory_capacity_bytes: float = Field(gt=0)
    peak_flops_per_s: dict[str, float] = Field(description="dense peak FLOP/s (or OP/s) per compute dtype")
    sram_bytes: float = Field(default=0.0, ge=0)
    num_devices: int = Field(default=1, ge=1, le=4096, description="devices (GPUs / SoCs / chips) of one card/node")
    link_bandwidth_bytes_per_s: float = Field(default=16e9, gt=0, description="per-device link for all-reduces")
    link_latency_s: float = Field(default=2e-6, ge=0, description="per log2 step of an all-reduce, seconds")
    allreduce_latency_s: float = Field(default=5e-6, ge=0, description="fixed seconds per all-reduce")
    bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1.0)
    kv_bandwidth_efficiency: float | None = Field(
        default=None, gt=0, le=1.0, description="reading the KV cache; None: bandwidth_efficiency"
    )
    compute_efficiency: float = Field(default=0.6, gt=0, le=1.0)
    call_overhead_s: float = Field(default=20e-6, ge=0)
    layer_overhead_s: float = Field(default=0.0, ge=0, description="fixed seconds per decoder layer per call")
    row_overhead_s: float = Field(
        default=0.0, ge=0, description="seconds per decoder layer per row of a call beyond the first"
    )
    decompress_elements_per_s: dict[str, float] = Field(
        default_factory=dict, description="per stored weight format: elements/s one device expands"
    )
    decompress_overlap: bool = True
    multi_token_penalty: float = Field(default=0.0, ge=0)
    multi_token_exponent: float = Field(default=1.0, gt=0, le=2.0)
    decompress_multi_token_penalty: float | None = Field(default=None, ge=0, description="None: multi_token_penalty")
    decompress_multi_token_exponent: float | None = Field(
        default=None, gt=0, le=2.0, description="None: multi_token_exponent"
    )
    usable_memory_fraction: float = Field(
        default=0.9, gt=0, le=1.0, description="capacity left for weights + KV after runtime/activations"
    )
    tdp_w: float | None = None
    source: str = ""
    notes: str = ""
    calibration: CalibrationReport | None = None

    @field_validator("peak_flops_per_s")
    @classmethod
    def _positive_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("give at least one compute dtype, e.g. {'fp16': 1.2e14}")
        for k, x in v.items():
            if not x > 0:
                raise ValueError(f"peak for {k!r} must be > 0")
        return {k.lower(): float(x) for k, x in v.items()}

    @field_validator("decompress_elements_per_s")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        out = {}
        for fmt, rate in v.items():
            try:
                key = decompress_key(fmt)
            except SimError as exc:
                raise ValueError(str(exc)) from None
            if key is None:
                raise ValueError(f"{fmt!r} is computed as stored; give rates for compressed formats only")
            if not rate > 0 or rate == float("inf"):
                raise ValueError(f"decompression rate for {fmt!r} must be a finite number > 0, got {rate!r}")
            out[key] = float(rate)
        return out

    def peak_flops(self, dtype: str = "fp16") -> float:
        """Peak FLOP/s for ``dtype``; falls back fp16 -> bf16 -> fp32 when the device lists no such entry."""
        for key in (dtype, "fp16", "bf16", "fp32"):
            if key in self.peak_flops_per_s:
                return self.peak_flops_per_s[key]
        return next(iter(self.peak_flops_per_s.values()))

    def decompress_rate(self, weight_format: str) -> float | None:
        """Elements/s one device expands ``weight_format`` weights at; ``None`` = free (no entry, or fp16/bf16/fp32)."""
        key = decompress_key(weight_format)
        return None if key is None else self.decompress_elements_per_s.get(key)

    @property
    def total_memory_capacity_bytes(self) -> float:
        return self.memory_capacity_bytes * self.num_devices

    def with_(self, **changes: Any) -> Hardware:
        """A copy with fields changed (validated); ``decompress_elements_per_s`` entries are merged."""
        data = self.model_dump()
        if "decompress_elements_per_s" in changes:
            changes = {
                **changes,
                "decompress_elements_per_s": {
                    **data["decompress_elements_per_s"],
                    **changes["decompress_elements_per_s"],
                },
            }
        data.update(changes)
        return Hardware(**data)


def _key(name: str) -> str:
    key = re.sub(r"[^a-z0-9.]", "", name.lower().replace("_", ""))
    for vendor in ("qualcomm", "nvidia", "amd", "google", "instinct"):
        key = key.removeprefix(vendor)
    return key


def list_hardware() -> list[str]:
    """Names of the built-in devices."""
    # import cycle: accel.sim.catalog builds its devices as this module's Hardware
    from accel.sim.catalog import CATALOG

    return list(CATALOG)


def hardware(name: str | Hardware) -> Hardware:
    """A catalog device by name (case/format-insensitive: "cloud-ai-100-ultra", "A100 80GB", "h100_sxm")."""
    # import cycle: accel.sim.catalog builds its devices as this module's Hardware
    from accel.sim.catalog import ALIASES, CATALOG

    if isinstance(name, Hardware):
        return name
    if not isinstance(name, str):
        raise SimError(f"hardware must be a name or Hardware, got {type(name).__name__}")
    table = {_key(k): v for k, v in CATALOG.items()}
    table.update({_key(a): CATALOG[t] for a, t in ALIASES.items()})
    if _key(name) not in table:
        raise SimError(f"unknown hardware {name!r}; known: {', '.join(CATALOG)} (or load_hardware(path))")
    return table[_key(name)]


def load_hardware(path: str | Path | dict[str, Any]) -> Hardware:
    """Load a device from a YAML or JSON file, or from a mapping of the same keys. Keys are ``Hardware`` fields; an
    optional ``base: <catalog name>`` inherits every field not given (e.g. ``{base: cloud-ai-100-ultra,
    bandwidth_efficiency: 0.45}``). Types are strict: ``decompress_overlap: "false"`` is an error, not ``True``."""
    if isinstance(path, dict):
        return _from_mapping(dict(path), "hardware mapping", "custom")
    if not isinstance(path, (str, Path)):
        raise SimError(f"load_hardware takes a YAML/JSON path or a mapping, got {type(path).__name__}")
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SimError(f"cannot read hardware file {str(path)!r}: {exc}") from exc
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError
        raise SimError(f"hardware file {str(path)!r} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc
    if not isinstance(data, dict):
        raise SimError(f"hardware file {str(path)!r} must hold a mapping of Hardware fields")
    return _from_mapping(data, f"hardware file {str(path)!r}", path.stem)


def _from_mapping(data: dict[str, Any], what: str, default_name: str) -> Hardware:
    unknown = {str(k) for k in data} - set(Hardware.model_fields) - {"base"}
    if unknown:
        raise SimError(f"{what}: unknown fields {sorted(unknown)}; allowed: {', '.join(Hardware.model_fields)}, base")
    base = data.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise SimError(f"{what}: base must be a catalog name, got {base!r}")
        merged = hardware(base).model_dump()
        merged.update(data)
        data = merged
    data.setdefault("name", default_name)
    return Hardware(**data)

"""``Deployment``: one typed description of what runs where, shared by ``predict_speedup``, ``best_k``,
``break_even_alpha``, ``sweep`` and whole-run observations.

It holds the models (a draft is optional: without one the prediction is autoregressive only), the device profile(s),
the weight formats (a compressed ``target_format`` compared against the ``baseline_format``, by default the
checkpoint's dtype), the KV format, batch, prompt and generation lengths, the cache layout (a ``growing`` cache, or a
``fixed`` one of ``ctx_len`` slots that attention reads in full, as QEfficient compiles it), host time, and the
tensor-parallel device counts. Every number that sizes work is bounded (``accel.sim._base``), and a context beyond a
model's ``max_position_embeddings`` is refused.

Devices (``devices``; ``None`` = chosen per model size, within one card or node): the fewest devices (a power of two)
whose memory holds the model's weights in the baseline format and its KV cache, then more of the card's devices only
while each still streams at least ``MIN_TP_SHARD_BYTES`` of weights per step (a 135M model on an Ultra stays on one
SoC; a 2.7B or 7B model spreads over its four). Any count up to 4096 may be given explicitly (several cards or GPUs);
a model too big for one card is reported as not fitting, with the count it needs.

Draft placement (``draft_shares_devices``, ``draft_devices``): by default the draft runs on the target's devices
(``draft_shares_devices=True`` unless a separate ``draft_hardware`` is given), tensor-parallel over all of them - at
most one attention head per device, so ``min(devices, draft.n_heads)`` - and its weights and KV cache share the
target's memory. ``draft_shares_devices=False`` puts it on devices of its own (its own memory; ``draft_devices``
chosen per its size on ``draft_hardware``, or the target's hardware). Either way draft and target calls run one
after the other (a round drafts, then verifies). ``predict_speedup`` warns when a placement makes speculative decoding
slower than autoregressive decoding.

Deployed dtype (``dtype``): what is deployed, independent of the checkpoint's ``torch_dtype``. ``DeployedDtype``
holds the weight format (``weights``: fp16/bf16/fp32, or a compressed format such as ``mxfp6``/``int8``), the KV-cache
format (``kv_cache``, MX formats included) and the dtype of the parts never compressed (``dense``: norms, biases,
embeddings, the LM head unless ``compress_lm_head``; default the weights' dtype when it is a float one, else fp16).
A string ``"fp16"`` means weights fp16, KV cache fp16 (a compressed string: its compute dtype, fp16, for the KV cache).
With a ``dtype``, both models are priced with ``dense`` for their uncompressed parts (a float32 HF config deployed as
fp16 costs 2 bytes per norm weight, not 4), ``baseline_format`` defaults to ``weights`` and ``kv_format`` to
``kv_cache`` (giving a different ``kv_format`` too is an error). Without one, everything follows the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, field_validator, model_validator

from accel.errors import SimError
from accel.sim._base import MAX_BATCH, MAX_DEVICES, MAX_TOKENS, SimModel, check_int, check_seconds
from accel.sim.formats import FLOAT_FORMATS, KV_FORMATS, compute_dtype, normalize_format
from accel.sim.hardware import Hardware, hardware, load_hardware
from accel.sim.hf_config import resolve_model
from accel.sim.models import ModelSpec

ModelLike = ModelSpec | str | dict[str, Any] | Path
HardwareLike = Hardware | str | Path
MIN_TP_SHARD_BYTES = 0.5e9  # tensor parallelism beyond what memory needs only while each device streams >= 0.5 GB
MAX_DECODE_POINTS = 2048  # past lengths at which a generation's decode steps are evaluated (then averaged)


def resolve_hardware(hw: HardwareLike) -> Hardware:
    """A ``Hardware``, a catalog name, or a YAML/JSON hardware file."""
    if isinstance(hw, Path) or (isinstance(hw, str) and Path(hw).suffix.lower() in (".yaml", ".yml", ".json")):
        return load_hardware(hw)
    return hardware(hw)


def devices_to_fit(hw: Hardware, nbytes: float) -> int:
    """The fewest devices (a power of two, at most 4096) of ``hw`` whose usable memory holds ``nbytes``."""
    usable = hw.memory_capacity_bytes * hw.usable_memory_fraction
    n = 1
    while n < MAX_DEVICES and nbytes > n * usable:
        n *= 2
    return n


def auto_devices(spec: ModelSpec, hw: Hardware, weight_bytes: float, kv_bytes: float) -> int:
    """Tensor-parallel devices of one card/node for a model of ``weight_bytes`` + ``kv_bytes`` (module docstring);
    a model that does not fit on the whole card gets the whole card (the fit check then says how many it needs)."""
    n = min(devices_to_fit(hw, weight_bytes + kv_bytes), hw.num_devices)
    while 2 * n <= hw.num_devices and weight_bytes / (2 * n) >= MIN_TP_SHARD_BYTES:
        n *= 2
    return n


class DeployedDtype(SimModel):
    """What a deployment stores (module docstring): linear-layer ``weights`` (``WEIGHT_FORMATS``), ``kv_cache``
    (``KV_FORMATS``) and ``dense`` (fp16/bf16/fp32: norms, biases, embeddings, LM head; ``None`` = the weights' float
    dtype, or fp16 for a compressed format)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: str
    kv_cache: str
    dense: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            d = dict(data)
            if isinstance(d.get("weights"), str):
                d["weights"] = normalize_format(d["weights"], what="deployed weight format")
                d.setdefault("kv_cache", compute_dtype(d["weights"]))
            if isinstance(d.get("kv_cache"), str):
                d["kv_cache"] = normalize_format(d["kv_cache"], allowed=KV_FORMATS, what="deployed KV-cache format")
            if isinstance(d.get("dense"), str):
                d["dense"] = normalize_format(d["dense"], allowed=DENSE_DTYPES, what="deployed dense dtype")
            return d
        return data

    @property
    def dense_dtype(self) -> str:
        """The dtype of the uncompressed parts."""
        return self.dense or (self.weights if self.weights in FLOAT_FORMATS else "fp16")


DENSE_DTYPES = ("fp16", "bf16", "fp32")


class Deployment(SimModel):
    """What runs where (module docstring). Sizes in tokens, times in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: ModelSpec
    draft: ModelSpec | None = None
    hardware: Hardware
    draft_hardware: Hardware | None = None
    target_format: str = "mxfp6"
    baseline_format: str | None = None
    draft_format: str | None = None
    kv_format: str = "fp16"
    batch_size: int = 1
    prompt_len: int = 128
    gen_len: int = 896
    devices: int | None = None
    draft_devices: int | None = None
    draft_shares_devices: bool | None = None
    dtype: DeployedDtype | None = None
    cache: Literal["growing", "fixed"] = "growing"
    ctx_len: int | None = None
    host_s: float = 0.0
    host_s_per_step: float = 0.0
    compress_lm_head: bool = False

    @field_validator("target", "draft", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        if isinstance(v, dict) and "n_layers" in v:  # a ModelSpec dumped to JSON
            return ModelSpec(**v)
        return v if v is None or isinstance(v, ModelSpec) else resolve_model(v)

    @field_validator("hardware", "draft_hardware", mode="before")
    @classmethod
    def _hw(cls, v: Any) -> Any:
        if isinstance(v, dict):  # a Hardware dumped to JSON, or {base: <catalog name>, <field>: value, ...}
            return load_hardware(v)
        return v if v is None or isinstance(v, Hardware) else resolve_hardware(v)

    @model_validator(mode="before")
    @classmethod
    def _numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        d = dict(data)
        for name, lo, hi in (("batch_size", 1, MAX_BATCH), ("prompt_len", 1, MAX_TOKENS), ("gen_len", 1, MAX_TOKENS)):
            if name in d:
                d[name] = check_int(name, d[name], lo, hi)
        for name in ("devices", "draft_devices", "ctx_len"):
            if d.get(name) is not None:
                d[name] = check_int(name, d[name], 1, MAX_DEVICES if "devices" in name else MAX_TOKENS)
        for name in ("host_s", "host_s_per_step"):
            if name in d:
                d[name] = check_seconds(name, d[name])
        for name in ("target_format", "baseline_format", "draft_format"):
            if d.get(name) is not None:
                d[name] = normalize_format(d[name])
        if "kv_format" in d:
            d["kv_format"] = normalize_format(d["kv_format"], allowed=KV_FORMATS, what="KV-cache format")
        if isinstance(d.get("dtype"), str):
            d["dtype"] = DeployedDtype(**{"weights": d["dtype"]})  # the KV cache follows (class docstring)
        elif isinstance(d.get("dtype"), dict):
            d["dtype"] = DeployedDtype(**d["dtype"])
        return d

    def _deploy_dtype(self) -> None:
        """Price both models' uncompressed parts at the deployed dense dtype; default the baseline and KV formats."""
        if self.dtype is None:
            return
        dense = self.dtype.dense_dtype
        for role in ("target", "draft"):
            spec = getattr(self, role)
            if spec is not None and spec.dtype != dense:
                object.__setattr__(self, role, spec.model_copy(update={"dtype": dense}))
        if self.baseline_format is None:
            object.__setattr__(self, "baseline_format", self.dtype.weights)
        if "kv_format" in self.model_fields_set and self.kv_format != self.dtype.kv_cache:
            raise SimError(
                f"kv_format={self.kv_format!r} contradicts dtype.kv_cache={self.dtype.kv_cache!r}: give one of them"
            )
        object.__setattr__(self, "kv_format", self.dtype.kv_cache)

    def _place_draft(self) -> None:
        """Draft placement (module docstring): shared devices by default, tensor-parallel over the target's."""
        if self.draft is None:
            return
        shares = self.draft_hardware is None if self.draft_shares_devices is None else self.draft_shares_devices
        if shares and self.draft_hardware is not None and self.draft_hardware != self.hardware:
            raise SimError(
                "draft_shares_devices=True puts the draft on the target's devices, but draft_hardware names other "
                f"ones ({self.draft_hardware.name!r}): drop draft_hardware or give draft_shares_devices=False"
            )
        object.__setattr__(self, "draft_shares_devices", shares)
        if shares and self.draft_devices is not None and self.devices is not None and self.draft_devices > self.devices:
            raise SimError(
                f"draft_devices={self.draft_devices} exceeds the {self.devices} device(s) the draft shares with the "
                "target: give draft_devices <= devices, or draft_shares_devices=False for devices of its own"
            )
        if shares and self.draft_devices is None:
            object.__setattr__(self, "draft_devices", min(self.n_devices, self.draft.n_heads))

    @model_validator(mode="after")
    def _resolve(self) -> Deployment:
        self._deploy_dtype()
        tokens = self.prompt_len + self.gen_len
        if self.cache == "fixed":
            ctx = self.ctx_len if self.ctx_len is not None else tokens
            if ctx < tokens:
                raise SimError(f"ctx_len {ctx} is shorter than prompt_len + gen_len = {tokens}")
            object.__setattr__(self, "ctx_len", ctx)
        elif self.ctx_len is not None:
            raise SimError("ctx_len sizes a fixed cache: give cache='fixed' with it (a growing cache has no ctx_len)")
        for role, spec in (("target", self.target), ("draft", self.draft)):
            if spec is not None and spec.max_context is not None and self.context_tokens > spec.max_context:
                what = "ctx_len" if self.cache == "fixed" else "prompt_len + gen_len"
                raise SimError(
                    f"{self.context_tokens} tokens of context ({what}) "
                    f"exceed {role} {spec.name!r}'s maximum context of {spec.max_context} (max_position_embeddings); "
                    "shorten the request, or pass a ModelSpec with max_context=None to predict beyond it"
                )
        for field, spec, hw in (("devices", self.target, self.hardware), ("draft_devices", self.draft, self.draft_hw)):
            if spec is not None and getattr(self, field) is None:
                fmt = self.baseline if field == "devices" else self.draft_fmt
                kv = self.batch_size * spec.kv_cache_bytes(self.context_tokens, self.kv_format)
                n = auto_devices(spec, hw, spec.weight_bytes(fmt, compress_lm_head=self.compress_lm_head), kv)
                object.__setattr__(self, field, n)
            if field == "devices":
                self._place_draft()
        return self

    # --- resolved views --------------------------------------------------------------------------------------------
    @property
    def baseline(self) -> str:
        """The baseline weight format (default: the target checkpoint's dtype)."""
        return self.baseline_format or self.target.dtype

    @property
    def draft_fmt(self) -> str:
        """The draft's weight format (default: its checkpoint's dtype)."""
        if self.draft is None:
            raise SimError("this deployment has no draft")
        return self.draft_format or self.draft.dtype

    @property
    def draft_hw(self) -> Hardware:
        """The draft's device profile (default: the target's)."""
        return self.draft_hardware or self.hardware

    @property
    def n_devices(self) -> int:
        assert self.devices is not None  # resolved by the validator
        return self.devices

    @property
    def n_draft_devices(self) -> int:
        return self.draft_devices or 1

    @property
    def context_tokens(self) -> int:
        """Tokens of KV cache per sequence: ``ctx_len`` for a fixed cache, else prompt + generation."""
        return self.ctx_len if self.cache == "fixed" and self.ctx_len else self.prompt_len + self.gen_len

    @property
    def kv_slots(self) -> int | None:
        """Slots attention reads per call for a fixed cache; ``None`` for a growing cache."""
        return self.ctx_len if self.cache == "fixed" else None

    def formats(self) -> list[str]:
        """The target formats compared: the baseline, then the compressed one (once if they are the same)."""
        return [self.baseline] if self.target_format == self.baseline else [self.baseline, self.target_format]

    def decode_contexts(self) -> np.ndarray:
        """Past lengths of the decode steps (prompt_len .. prompt_len + gen_len - 2), at most ``MAX_DECODE_POINTS``
        evenly spread ones for long generations (their mean is what the predictions use)."""
        n = max(self.gen_len - 1, 1)
        if n <= MAX_DECODE_POINTS:
            return self.prompt_len + np.arange(n, dtype=np.float64)
        return self.prompt_len + (np.arange(MAX_DECODE_POINTS) + 0.5) * (n / MAX_DECODE_POINTS) - 0.5

    def with_(self, **changes: Any) -> Deployment:
        """A copy with fields changed (validated again; auto device counts are chosen again unless given)."""
        data = {k: getattr(self, k) for k in type(self).model_fields}
        for auto in ("devices", "draft_devices", "draft_shares_devices", "baseline_format"):
            if auto not in changes:
                data[auto] = None if self._auto(auto) else data[auto]
        if "kv_format" not in changes and self.dtype is not None and self._auto("kv_format"):
            data.pop("kv_format")
        if "ctx_len" not in changes and self.cache == "fixed" and self._auto("ctx_len"):
            data["ctx_len"] = None
        data.update(changes)
        return Deployment(**data)

    def _auto(self, field: str) -> bool:
        return field not in self.model_fields_set


def as_deployment(
    deployment: Deployment | ModelLike | None,
    draft: ModelLike | None = None,
    hardware: HardwareLike | None = None,
    settings: dict[str, Any] | None = None,
) -> Deployment:
    """A ``Deployment`` from one, or from the older call form ``(target, draft, hardware, **settings)``; with a
    ``Deployment``, ``settings`` override its fields."""
    settings = dict(settings or {})
    if isinstance(deployment, Deployment):
        if draft is not None or hardware is not None:
            raise SimError("give either a Deployment or (target, draft, hardware), not both")
        return deployment.with_(**settings) if settings else deployment
    if deployment is None or hardware is None:
        raise SimError("need a Deployment, or a target model and a hardware profile")
    return Deployment(**{"target": deployment, "draft": draft, "hardware": hardware, **settings})

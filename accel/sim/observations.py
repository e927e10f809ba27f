"""Measurements to calibrate against: one model call (``Observation``) or a whole autoregressive run
(``RunObservation``: prompt, generation length, batch, devices, cache layout, measured tokens/s), each with the
model's prediction on a ``Hardware``.

``dtype`` (both kinds): the deployed dtype of the parts never compressed (norms, biases, embeddings, the LM head) and
the default weight format, independent of the checkpoint's ``torch_dtype`` (a float32 HF config measured as an fp16
deployment: ``dtype="fp16"``). A run's prompt and generation lengths set its KV-cache traffic: omitting them is
allowed but warned (``SimWarning`` naming the ``DEFAULT_RUN_TOKENS`` assumed), never silent.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, field_validator, model_validator

from accel.errors import SimError
from accel.sim._base import MAX_BATCH, MAX_DEVICES, MAX_TOKENS, SimModel, SimWarning, check_int, check_seconds
from accel.sim.deployment import Deployment
from accel.sim.formats import KV_FORMATS, kv_bytes_per_element, normalize_format
from accel.sim.hardware import Hardware
from accel.sim.hf_config import resolve_model
from accel.sim.models import ModelSpec
from accel.sim.roofline import CallShape, format_arrays, resolve_devices, step_arrays
from accel.sim.rounds import ar_step_s, prefill_s

DEFAULT_RUN_TOKENS = 128  # prompt and generation length a RunObservation assumes when not given (with a warning)


class _Measured(SimModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="after")
    def _deployed_dtype(self) -> Any:
        dtype = getattr(self, "dtype", None)
        model: ModelSpec = getattr(self, "model")  # noqa: B009
        if dtype is not None and model.dtype != dtype:
            object.__setattr__(self, "model", model.model_copy(update={"dtype": dtype}))
        return self

    @field_validator("model", mode="before", check_fields=False)
    @classmethod
    def _model(cls, v: Any) -> Any:
        return v if isinstance(v, ModelSpec) else resolve_model(v)

    @model_validator(mode="before")
    @classmethod
    def _formats(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if data.get("weight_format") is not None:
                data["weight_format"] = normalize_format(data["weight_format"])
            if data.get("kv_format") is not None:
                data["kv_format"] = normalize_format(data["kv_format"], allowed=KV_FORMATS, what="KV-cache format")
        return data


class Observation(_Measured):
    """One measured model call: ``seconds_per_call``, or ``tokens_per_s`` of an AR run (= batch / seconds per
    call). ``weight_format`` defaults to the model's dtype; ``kv_slots``: a fixed-size cache read in full."""

    model: ModelSpec
    dtype: Literal["fp16", "bf16", "fp32"] | None = None
    weight_format: str | None = None
    kv_format: str = "fp16"
    batch_size: int = 1
    new_tokens: int = 1
    context_len: int = 0
    num_logits: int = 1
    devices: int | None = None
    kv_slots: int | None = None
    seconds_per_call: float | None = None
    tokens_per_s: float | None = None
    label: str = ""

    @model_validator(mode="after")
    def _check(self) -> Observation:
        check_int("batch_size", self.batch_size, 1, MAX_BATCH)
        check_int("new_tokens", self.new_tokens, 1, MAX_TOKENS)
        check_int("context_len", self.context_len, 0, MAX_TOKENS)
        check_int("num_logits", self.num_logits, 1, self.new_tokens)
        if self.devices is not None:
            check_int("devices", self.devices, 1, MAX_DEVICES)
        if self.kv_slots is not None:
            check_int("kv_slots", self.kv_slots, self.context_len + self.new_tokens, MAX_TOKENS)
        if (self.seconds_per_call is None) == (self.tokens_per_s is None):
            raise SimError("Observation: give exactly one of seconds_per_call, tokens_per_s")
        v = self.seconds_per_call if self.seconds_per_call is not None else self.tokens_per_s
        if v is None or not np.isfinite(v) or v <= 0:
            raise SimError(f"Observation: the measurement must be a finite number > 0, got {v!r}")
        if self.tokens_per_s is not None and self.new_tokens != 1:
            raise SimError("Observation: tokens_per_s describes AR calls (new_tokens = 1); give seconds_per_call")
        return self

    @property
    def call(self) -> CallShape:
        """The call's shape (batch, new tokens, past length, logits, fixed-cache slots)."""
        return CallShape(self.batch_size, self.new_tokens, self.context_len, self.num_logits, self.kv_slots)

    @property
    def measured_s(self) -> float:
        """Seconds per call."""
        if self.seconds_per_call is not None:
            return self.seconds_per_call
        assert self.tokens_per_s is not None
        return self.batch_size / self.tokens_per_s

    def predicted_s(self, hw: Hardware) -> float:
        """Model seconds per call on ``hw``."""
        return float(
            step_arrays(
                self.model,
                hw,
                self.call,
                fmt=format_arrays(hw, self.weight_format or self.model.dtype),
                kv_bpe=kv_bytes_per_element(self.kv_format),
                devices=resolve_devices(hw, self.devices),
            )["time_s"]
        )


def calls_s(hw: Hardware, calls: list[Observation]) -> np.ndarray:
    """Model seconds of several calls of one model and setting (format, KV format, devices, cache kind) on ``hw``,
    in one vectorized evaluation (what calibration does many times)."""
    o = calls[0]
    arr = lambda name: np.array([getattr(c, name) for c in calls], dtype=np.float64)  # noqa: E731
    shape = CallShape(
        arr("batch_size"), arr("new_tokens"), arr("context_len"), arr("num_logits"),
        None if o.kv_slots is None else arr("kv_slots"),
    )  # fmt: skip
    return step_arrays(
        o.model,
        hw,
        shape,
        fmt=format_arrays(hw, o.weight_format or o.model.dtype),
        kv_bpe=kv_bytes_per_element(o.kv_format),
        devices=resolve_devices(hw, o.devices),
    )["time_s"]


class RunObservation(_Measured):
    """A whole autoregressive run: prompt ``prompt_len``, ``gen_len`` generated tokens, ``batch_size`` sequences,
    measured ``tokens_per_s`` (``rate="decode"``: batch / time per decode step, prefill excluded; ``"end_to_end"``:
    batch * gen_len / the whole run). The prediction prices the run exactly as ``predict_speedup`` prices AR (the
    decode steps at their past lengths, the prefill for end-to-end rates). ``devices=None``: chosen per model size."""

    model: ModelSpec
    dtype: Literal["fp16", "bf16", "fp32"] | None = None
    weight_format: str | None = None
    kv_format: str = "fp16"
    batch_size: int = 1
    prompt_len: int = DEFAULT_RUN_TOKENS  # required in effect: omitted -> this default, with a SimWarning
    gen_len: int = DEFAULT_RUN_TOKENS
    devices: int | None = None
    cache: Literal["growing", "fixed"] = "growing"
    ctx_len: int | None = None
    compress_lm_head: bool = False
    host_s_per_step: float = 0.0
    tokens_per_s: float
    rate: Literal["decode", "end_to_end"] = "decode"
    label: str = ""
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _lengths(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        missing = [f for f in ("prompt_len", "gen_len") if data.get(f) is None]
        if missing:
            label = f" {data.get('label')!r}" if data.get("label") else ""
            warnings.warn(
                f"RunObservation{label}: {' and '.join(missing)} not given; assuming {DEFAULT_RUN_TOKENS} tokens "
                f"(with a {data.get('cache', 'growing')} cache). The lengths set the KV-cache reads of every step: "
                "give the measured run's",
                SimWarning,
                stacklevel=4,
            )
            data = {**data, **{f: DEFAULT_RUN_TOKENS for f in missing}}
        return data

    @model_validator(mode="after")
    def _check(self) -> RunObservation:
        check_int("batch_size", self.batch_size, 1, MAX_BATCH)
        check_int("prompt_len", self.prompt_len, 1, MAX_TOKENS)
        check_int("gen_len", self.gen_len, 1, MAX_TOKENS)
        check_seconds("host_s_per_step", self.host_s_per_step)
        if self.devices is not None:
            check_int("devices", self.devices, 1, MAX_DEVICES)
        tokens = self.prompt_len + self.gen_len
        if self.ctx_len is not None:
            if self.cache != "fixed":
                raise SimError("RunObservation: ctx_len sizes a fixed cache: give cache='fixed' with it")
            check_int("ctx_len", self.ctx_len, tokens, MAX_TOKENS)  # at least prompt_len + gen_len
        if not np.isfinite(self.tokens_per_s) or self.tokens_per_s <= 0:
            raise SimError(f"RunObservation: tokens_per_s must be a finite number > 0, got {self.tokens_per_s!r}")
        return self

    def deployment(self, hw: Hardware) -> Deployment:
        """The run as a ``Deployment`` on ``hw`` (AR only; its weight format is the compared one)."""
        fmt = self.weight_format or self.model.dtype
        return Deployment(
            target=self.model,
            hardware=hw,
            target_format=fmt,
            baseline_format=fmt,
            kv_format=self.kv_format,
            batch_size=self.batch_size,
            prompt_len=self.prompt_len,
            gen_len=self.gen_len,
            devices=self.devices,
            cache=self.cache,
            ctx_len=self.ctx_len,
            compress_lm_head=self.compress_lm_head,
            host_s_per_step=self.host_s_per_step,
        )

    @property
    def measured_s(self) -> float:
        """Seconds per decode step (decode rate) or of the whole run (end-to-end rate)."""
        return self.batch_size * (1 if self.rate == "decode" else self.gen_len) / self.tokens_per_s

    def predicted_s(self, hw: Hardware, dep: Deployment | None = None) -> float:
        """Model seconds (as ``measured_s``) on ``hw``; ``dep``: this run's deployment built once (its hardware is
        replaced by ``hw``; device counts stay)."""
        d = self.deployment(hw) if dep is None else dep.model_copy(update={"hardware": hw})
        tpot = ar_step_s(d, d.baseline)
        if self.rate == "decode":
            return tpot
        return prefill_s(d, d.baseline, False) + (self.gen_len - 1) * tpot

    def predicted_tokens_per_s(self, hw: Hardware) -> float:
        return self.batch_size * (1 if self.rate == "decode" else self.gen_len) / self.predicted_s(hw)


AnyObservation = Observation | RunObservation

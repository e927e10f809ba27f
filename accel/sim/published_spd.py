"""Published speculative-decoding points, priced as a band over the acceptance the sources do not state.

Qualcomm's SpD blog (``SPD_BLOG``) gives MXFP6 + SpD against its FP16 autoregressive baseline on Cloud AI 100, batch
1, K = 7, greedy: Figure 7, Llama 2 7B on an Ultra (bars read off the chart, +-1 tok/s: FP16 22, MX6 40, MX6 + SpD
77), and Figure 8, the range of that speedup over the blog's prompts on the Standard and Pro (bars read off the
charts, +-0.1x). The configurations are the blog's table: targets in MXFP6 (every MatMul, the LM head included, as in
the MX blog), drafts in FP16 (Llama 2: Qualcomm's 115M draft; CodeGen 1-7B: a ~350M CodeGen), prompt 128 /
generation 896 (Llama 2) and 32 / 224 (CodeGen), a fixed KV cache of prompt + generation slots.

No source gives the draft's acceptance, so a point is not one prediction: ``validate_spd`` prices each at per-token
acceptance alpha spread uniformly over ``SPD_PRIOR`` (a planner's range for a draft 20-60x smaller than its target,
not read off these points) and reports the speedup band (10th / 50th / 90th percentile), the error of the band's
median, whether the published value lies in the band, and the alpha that reproduces it (``implied_acceptance``).
Speedups are MXFP6 + SpD over FP16 AR on the same card, the ratio the blog publishes, so the pages' disagreement on
the FP16 rate itself (docs/sim.md §8) does not enter; the catalog's stock entries price both.
"""

from __future__ import annotations

from pydantic import ConfigDict

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.band import predict_band
from accel.sim.deployment import Deployment
from accel.sim.hardware import hardware
from accel.sim.predict import predict_speedup
from accel.sim.presets import preset

SPD_BLOG = (
    "Qualcomm, 'Quadruple LLM Decoding Performance with Speculative Decoding (SpD) and Microscaling (MX) Formats' "
    "(N. Vaidhyanathan, A. Gokhale), https://quic.github.io/cloud-ai-sdk-pages/latest/blogs/Speculative_Decode/"
    "spec_decode_ai100/ , 2024-03-06"
)
SPD_PRIOR = (0.5, 0.9)  # per-token acceptance alpha, uniform: the planner's range when the draft is unknown
QUANTILES = (0.1, 0.5, 0.9)
CONFIG = "mxfp6 + SpD"  # the configuration of predict_speedup that the blog measures


class SpdPoint(SimModel):
    """A published MXFP6 + SpD speedup over FP16 AR: one value (``lo == hi``) or a range over prompts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str
    label: str
    target: str
    draft: str
    prompt_len: int
    gen_len: int
    k: int = 7
    speedup_lo: float
    speedup_hi: float
    where: str
    source: str = SPD_BLOG


class SpdRow(SimModel):
    """One point's band: speedups at ``QUANTILES`` of ``SPD_PRIOR``, the median's error against the published value
    (the range's midpoint for a range), whether the published value (both ends of a range) lies in [p10, p90], and
    the alpha at which the prediction equals each end (None where no alpha in [0, 1] reaches it)."""

    device: str
    label: str
    measured: tuple[float, float]
    band: list[float]
    acceptance: list[float]
    median_error: float
    inside: bool
    implied_acceptance: tuple[float | None, float | None]
    where: str


_FIG8 = "Figure 8, range of speedups over the blog's prompts (read off the chart, +-0.1x)"
_LLAMA = ("llama-2-7b", "qualcomm-llama2-draft-115m", 128, 896)
_CODEGEN = ("codegen-6b-mono", "codegen-350m-mono", 32, 224)


def _pt(device: str, model: tuple[str, str, int, int], lo: float, hi: float, where: str) -> SpdPoint:
    target, draft, prompt, gen = model
    short = device.removeprefix("cloud-ai-100-")
    return SpdPoint(
        device=device,
        label=f"{target} mxfp6 + {draft} fp16, K 7 ({short})",
        target=target,
        draft=draft,
        prompt_len=prompt,
        gen_len=gen,
        speedup_lo=lo,
        speedup_hi=hi,
        where=where,
    )


SPD_POINTS: list[SpdPoint] = [
    _pt("cloud-ai-100-ultra", _LLAMA, 77 / 22, 77 / 22, "Figure 7, MX6 + SpD bar 77 tok/s over the FP16 bar 22"),
    _pt("cloud-ai-100-standard", _LLAMA, 3.45, 5.55, _FIG8),
    _pt("cloud-ai-100-pro", _LLAMA, 4.05, 6.4, _FIG8),
    _pt("cloud-ai-100-standard", _CODEGEN, 3.55, 5.55, _FIG8),
    _pt("cloud-ai-100-pro", _CODEGEN, 3.7, 5.75, _FIG8),
]


def spd_deployment(p: SpdPoint) -> Deployment:
    """The blog's configuration of ``p`` on the catalog's stock entry for its card."""
    return Deployment(
        target=preset(p.target),
        draft=preset(p.draft),
        hardware=hardware(p.device),
        target_format="mxfp6",
        baseline_format="fp16",
        draft_format="fp16",
        prompt_len=p.prompt_len,
        gen_len=p.gen_len,
        cache="fixed",
        ctx_len=p.prompt_len + p.gen_len,
        compress_lm_head=True,
    )


def _speedup(dep: Deployment, k: int, alpha: float) -> float:
    pred = predict_speedup(dep, k=k, acceptance=alpha)
    return next(c.speedup for c in pred.configs if c.name == CONFIG)


def implied_acceptance(dep: Deployment, speedup: float, k: int = 7, tol: float = 1e-4) -> float | None:
    """The per-token acceptance alpha at which the predicted ``CONFIG`` speedup equals ``speedup`` (bisection: the
    speedup is nondecreasing in alpha); None when it lies outside the speedups of alpha = 0 .. 1."""
    if not speedup > 0:
        raise SimError(f"a speedup must be > 0, got {speedup}")
    lo, hi = 0.0, 1.0
    if _speedup(dep, k, lo) > speedup or _speedup(dep, k, hi) < speedup:
        return None
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _speedup(dep, k, mid) < speedup:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def validate_spd(
    points: list[SpdPoint] | None = None, acceptance_range: tuple[float, float] = SPD_PRIOR
) -> list[SpdRow]:
    """Every SpD point priced as a band over ``acceptance_range`` (module docstring)."""
    rows = []
    for p in SPD_POINTS if points is None else points:
        dep = spd_deployment(p)
        band = predict_band(dep, acceptance_range=acceptance_range, quantiles=QUANTILES, k=p.k)
        sp = band.speedup[CONFIG]
        mid = 0.5 * (p.speedup_lo + p.speedup_hi)
        rows.append(
            SpdRow(
                device=p.device,
                label=p.label,
                measured=(p.speedup_lo, p.speedup_hi),
                band=sp,
                acceptance=band.acceptance,
                median_error=sp[1] / mid - 1,
                inside=sp[0] <= p.speedup_lo and p.speedup_hi <= sp[-1],
                implied_acceptance=(
                    implied_acceptance(dep, p.speedup_lo, p.k),
                    implied_acceptance(dep, p.speedup_hi, p.k),
                ),
                where=p.where,
            )
        )
    return rows


__all__ = ["SPD_POINTS", "SPD_PRIOR", "SpdPoint", "SpdRow", "implied_acceptance", "spd_deployment", "validate_spd"]

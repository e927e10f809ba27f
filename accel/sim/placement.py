"""Whether a draft placement makes speculative decoding slower than autoregressive decoding, and what would help.

``predict_speedup`` calls :func:`placement_warning` after pricing: when a speculative configuration's time per token
exceeds the autoregressive one in the same target format, it prices the same round with the draft on one device and
tensor-parallel over the target's devices (``min(devices, draft heads)``) and names the placement that would beat
autoregressive decoding, or says that none does (then the draft is too slow for the acceptance: fewer draft tokens, a
smaller draft or a better one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accel.sim.deployment import Deployment
from accel.sim.rounds import RoundShape, price_round


def placement_warning(dep: Deployment, shape: RoundShape, configs: list[Any]) -> str | None:
    """A message when speculative decoding is slower than AR on ``dep`` (module docstring); ``None`` otherwise.
    ``configs``: the prediction's ``ConfigResult`` rows."""
    assert dep.draft is not None
    ar = {c.target_format: c for c in configs if not c.speculative}
    slow = [c for c in configs if c.speculative and c.tpot_s > ar[c.target_format].tpot_s]
    if not slow:
        return None
    c = slow[0]
    ar_tpot = ar[c.target_format].tpot_s
    where = "sharing" if dep.draft_shares_devices else "beside"
    msg = (
        f"speculative decoding is slower than autoregressive decoding here ({c.name}: {ar_tpot / c.tpot_s:.2f}x of AR) "
        f"with the draft on {dep.n_draft_devices} device(s) {where} the target's {dep.n_devices}"
    )
    L = dep.decode_contexts()
    better: dict[int, float] = {}
    for n in sorted({1, min(dep.n_devices, dep.draft.n_heads)} - {dep.n_draft_devices}):
        alt = dep.with_(draft_devices=n)
        tpot = float(np.mean(price_round(alt, c.target_format, shape, L)["loop"])) / shape.tokens
        if tpot < ar_tpot:
            better[n] = ar_tpot / tpot
    if better:
        n = max(better, key=lambda k: better[k])
        return msg + f"; draft_devices={n} would make it {better[n]:.2f}x faster than AR"
    return msg + (
        "; no other draft placement beats AR: the draft is too slow for this acceptance (fewer draft tokens, a "
        "smaller draft, or a better acceptance)"
    )

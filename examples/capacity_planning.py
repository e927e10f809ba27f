"""Capacity planning: Llama 2 7B with a 115M draft on Cloud AI 100 Ultra vs an A100, FP16 vs MXFP6, with plots.

Run: .venv/bin/python examples/capacity_planning.py [--out results/capacity]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from accel import sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/capacity", help="folder for the PNG plots")
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-token acceptance alpha of the draft")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    for hw in ("cloud-ai-100-ultra", "a100-80gb"):
        k, _ = sim.best_k("llama-2-7b", "qualcomm-llama2-draft-115m", hw, args.acceptance, target_format="mxfp6")
        pred = sim.predict_speedup(
            "llama-2-7b",
            "qualcomm-llama2-draft-115m",
            hw,
            target_format="mxfp6",
            k=k,
            acceptance=args.acceptance,
            prompt_len=128,
            gen_len=896,
        )
        print(pred.table())
        alpha0 = sim.break_even_alpha("llama-2-7b", "qualcomm-llama2-draft-115m", hw, k, target_format="mxfp6")
        where = f"below alpha = {alpha0:.2f}" if alpha0 is not None else "at no alpha in [0, 1]"
        print(f"best K = {k}; speculation stops paying {where}\n")
        sim.plots.breakdown_bars(pred, out / f"breakdown_{hw}.png")
        sim.plots.speedup_heatmap("llama-2-7b", "qualcomm-llama2-draft-115m", hw, out / f"speedup_{hw}.png")
        sim.plots.roofline("llama-2-7b", hw, out / f"roofline_{hw}.png", weight_format="mxfp6")
    print(f"plots saved in {out}/")


if __name__ == "__main__":
    main()

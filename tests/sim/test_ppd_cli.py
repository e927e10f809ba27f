"""`accel predict --ppd`: the PPD section prices every placement with what predict_ppd gives, in the table and the
JSON, and bad PPD options are clear errors."""

import json

import pytest

from accel.cli import EXIT_ERROR, main
from accel.sim import predict_ppd
from accel.sim.ppd import PPDRun
from accel.sim.ppd_stages import PPDPlacement

ARGS = ["predict", "--target", "llama-2-13b", "--hardware", "cloud-ai-100-ultra", "--devices", "2", "--gen-len", "256"]
PPD = ["--ppd", "20", "--ppd-k", "3", "--ppd-p", "0.47"]


def test_ppd_section_matches_predict_ppd(capsys):
    assert main([*ARGS, *PPD, "--json", "--ppd-concurrency", "1.5", "--host-s-per-step", "0.001"]) == 0
    rows = json.loads(capsys.readouterr().out)["ppd"]
    assert [r["placement"] for r in rows] == ["paper", "same-device", "per-stage"]
    run = PPDRun(dbar=20, k=3, p=0.47, gen_len=256, context_len=128 + 128)
    place = PPDPlacement(kind="same-device", concurrency=1.5, host_s=0.001)
    same = predict_ppd("llama-2-13b", "cloud-ai-100-ultra", run, weight_format="mxfp6", devices=2, placement=place)
    assert rows[1]["per_token_s"] == pytest.approx(same.per_token_s)
    assert rows[1]["stage_times"]["front_s"] == pytest.approx(same.stage_times.front_s)
    split = rows[2]
    assert split["devices"] == 2 and split["tensor_parallel_speedup"] > split["speedup"] > 1
    assert rows[0]["speedup"] == pytest.approx(1.30, abs=0.01)  # Theorem 4.1 at dbar = d/2, p = 0.47

    assert main([*ARGS, *PPD]) == 0
    out = capsys.readouterr().out
    assert "PPD: llama-2-13b on cloud-ai-100-ultra, exit layer 20 of 40, k 3, p 0.47" in out
    assert "per-stage" in out and "AR in TP over both" in out


def test_ppd_section_errors(capsys):
    assert main([*ARGS, "--ppd", "20"]) == EXIT_ERROR
    assert "--ppd needs --ppd-p" in capsys.readouterr().err
    assert main([*ARGS, *PPD, "--batch", "4"]) == EXIT_ERROR
    assert "batch 1" in capsys.readouterr().err
    assert main([*ARGS, "--ppd", "40", "--ppd-p", "0.3"]) == EXIT_ERROR
    assert "exit layer must be an integer in [1, 39]" in capsys.readouterr().err
    assert main([*ARGS, *PPD, "--ppd-concurrency", "3"]) == EXIT_ERROR
    assert "concurrency" in capsys.readouterr().err

"""`accel predict` through accel.cli.main, the plots, and the import rules."""

import json
import subprocess
import sys

import pytest

from accel.cli import main
from accel.sim import plots, predict_speedup

ARGS = [
    "predict",
    "--target",
    "llama-2-7b",
    "--draft",
    "qualcomm-llama2-draft-115m",
    "--hardware",
    "cloud-ai-100-ultra",
    "--k",
    "7",
    "--acceptance",
    "0.8",
]
PNG = b"\x89PNG\r\n\x1a\n"


def test_cli_table(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    for word in ("fp16 AR", "mxfp6 AR", "fp16 + SpD", "mxfp6 + SpD", "TPOT ms", "best K", "fits"):
        assert word in out


def test_cli_json_and_plot(capsys, tmp_path):
    png = tmp_path / "bars.png"
    assert main([*ARGS, "--json", "--target-format", "mxfp4", "--batch", "2", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batch_size"] == 2 and data["configs"][3]["name"] == "mxfp4 + SpD"
    assert png.read_bytes()[:8] == PNG


def test_cli_errors(capsys, tmp_path):
    assert main([*ARGS[:2], "no-such-model", *ARGS[3:]]) != 0
    assert "known presets" in capsys.readouterr().err
    assert main([*ARGS, "--acceptance", "1.3"]) != 0
    assert (
        main(
            [
                "predict",
                "--target",
                "chinchilla-70b",
                "--draft",
                "chinchilla-4b-draft",
                "--hardware",
                "cloud-ai-100-standard",
                "--strict",
            ]
        )
        != 0
    )
    assert "DOES NOT FIT" in capsys.readouterr().err
    hw = tmp_path / "dev.yaml"
    hw.write_text("base: cloud-ai-100-ultra\nbandwidth_efficiency: 0.4\n")
    assert main([*ARGS[:6], str(hw), *ARGS[7:]]) == 0


def test_plots(tmp_path):
    p = predict_speedup("llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra")
    outs = [
        plots.roofline("llama-2-7b", "cloud-ai-100-ultra", tmp_path / "roof.png", weight_format="mxfp6"),
        plots.speedup_heatmap(
            "llama-2-7b",
            "qualcomm-llama2-draft-115m",
            "cloud-ai-100-ultra",
            tmp_path / "heat.png",
            k_max=6,
            alpha=[0.0, 0.5, 0.9, 1.0],
        ),
        plots.breakdown_bars(p, tmp_path / "sub" / "bars.png"),
    ]
    for o in outs:
        assert o.read_bytes()[:8] == PNG
    assert sorted(x.name for x in tmp_path.rglob("*") if x.is_file()) == ["bars.png", "heat.png", "roof.png"]
    from accel.errors import SimError

    with pytest.raises(SimError, match="png"):
        plots.breakdown_bars(p, tmp_path / "x.pdf")


def test_import_needs_neither_torch_nor_matplotlib():
    code = (
        "import sys; import accel.sim as s; s.predict_speedup('llama-2-7b', 'gpt2', 'l4'); "
        "s.sweep('llama-2-7b', 'gpt2', 'l4', k=[2], alpha=[0.5]); "
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_cli_measured_loop_statistics(capsys):
    base = ARGS[:-2]  # no --acceptance: derived from the measured loops
    assert main([*base, "--tokens-per-loop", "2.1", "--drafts-per-loop", "3.4", "--all-accepted", "0.2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["loop_stats"] == {
        "tokens_per_loop": 2.1,
        "drafts_per_loop": 3.4,
        "all_accepted_fraction": 0.2,
        "draft_calls_per_loop": None,
        "lookup_fraction": 0.0,
        "draft_tokens_per_call": 1.0,
    }
    assert data["configs"][3]["expected_tokens_per_loop"] == 2.1
    p = predict_speedup(
        "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra", k=7, loop_stats=data["loop_stats"]
    )
    assert data["configs"][3]["tpot_s"] == p.config("mxfp6 + SpD").tpot_s
    assert main([*base, "--tokens-per-loop", "2.1"]) != 0
    assert "go together" in capsys.readouterr().err
    assert main([*base, "--tokens-per-loop", "5", "--drafts-per-loop", "2"]) != 0
    assert "exceeds drafts_per_loop" in capsys.readouterr().err
    assert main([*base, "--all-accepted", "0.5"]) != 0
    assert "need --tokens-per-loop" in capsys.readouterr().err
    assert main([*base, "--lookup-fraction", "0.5"]) != 0
    assert "need --tokens-per-loop" in capsys.readouterr().err
    # n-gram lookup loops: fewer draft-model calls than drafts, so a faster loop than the same shape without lookup
    assert (
        main(
            [
                *base,
                "--tokens-per-loop",
                "2.1",
                "--drafts-per-loop",
                "3.4",
                "--draft-calls-per-loop",
                "1.5",
                "--lookup-fraction",
                "0.5",
                "--json",
            ]
        )
        == 0
    )
    look = json.loads(capsys.readouterr().out)
    assert look["loop_stats"]["draft_calls_per_loop"] == 1.5 and look["loop_stats"]["lookup_fraction"] == 0.5
    assert look["configs"][3]["tpot_s"] < data["configs"][3]["tpot_s"]


def test_cli_autoregressive_fixed_cache_and_refused_sizes(capsys):
    base = ["predict", "--target", "llama-2-7b", "--hardware", "cloud-ai-100-standard"]
    fixed = ["--cache", "fixed", "--ctx-len", "2048", "--prompt-len", "1024", "--gen-len", "1024"]
    assert main([*base, *fixed, "--compress-lm-head"]) == 0
    out = capsys.readouterr().out
    assert "autoregressive only" in out and "fixed cache of 2048" in out and "mxfp6 AR" in out and "SpD" not in out
    full = [
        "predict",
        "--target",
        "llama-2-7b",
        "--draft",
        "qualcomm-llama2-draft-115m",
        "--hardware",
        "cloud-ai-100-ultra",
    ]
    for bad, words in (
        (["--k", "1000000"], "[1, 64]"),  # once allocated 24 GB and was killed
        (["--host-s", "inf"], "host_s"),
        (["--batch", "0"], "batch_size"),
        (["--prompt-len", "4000", "--gen-len", "1000"], "maximum context of 4096"),
        (["--devices", "100000"], "devices"),
    ):
        assert main([*full, *bad]) != 0, bad
        assert words in capsys.readouterr().err, bad


def test_cli_plot_paths_are_checked_before_any_work(capsys, tmp_path):
    assert main([*ARGS, "--plot", str(tmp_path / "bars.txt")]) != 0
    out, err = capsys.readouterr()
    assert out == "" and "must end in .png" in err  # refused before the table is printed
    (tmp_path / "folder.png").mkdir()
    assert main([*ARGS, "--plot", str(tmp_path / "folder.png")]) != 0
    assert "is a folder" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*ARGS, "--plot", str(blocker / "bars.png")]) != 0  # its parent is a file
    assert "cannot write plot" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.png"]  # nothing half-written

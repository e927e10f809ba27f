"""The CLI's error boundary: one line and exit status 2 for expected failures, tracebacks only with --debug."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from pydantic import BaseModel, Field

from accel.cli import EXIT_BUG, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM, main, run_command
from accel.errors import FormatError


class _Spec(BaseModel):
    k: int = Field(gt=0)


def _raise(exc: BaseException):
    def func() -> int:
        raise exc

    return func


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        (FormatError("tensor 'w': block_size must be a positive int"), "block_size must be a positive int"),
        (FileNotFoundError(2, "No such file or directory", "/nowhere/x"), "No such file or directory: /nowhere/x"),
        (PermissionError(13, "Permission denied", "/ro/out"), "Permission denied: /ro/out"),
        (IsADirectoryError(21, "Is a directory", "a.tmp", None, "out"), "Is a directory: a.tmp -> out"),
        (ValueError("line one\n  line two"), "line one line two"),
        (MemoryError(), "out of memory"),
    ],
)
def test_expected_failures_are_one_line_with_status_2(capsys, exc, needle):
    assert run_command("accel x", _raise(exc)) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accel x: error: ") and needle in err
    assert "Traceback" not in err


def test_pydantic_errors_name_the_field(capsys):
    def func() -> int:
        _Spec(k=0)
        return 0

    assert run_command("accel x", func) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "k: Input should be greater than 0" in err


def test_bugs_are_one_line_with_their_own_status_and_debug_shows_the_traceback(capsys):
    assert run_command("accel x", _raise(KeyError("oops"))) == EXIT_BUG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" in err and "--debug" in err
    assert run_command("accel x", _raise(FormatError("bad")), debug=True) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("accel x: error: bad")


def test_interrupts(capsys):
    assert run_command("accel x", _raise(KeyboardInterrupt())) == EXIT_SIGINT
    assert "interrupted" in capsys.readouterr().err

    def terminated() -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # the boundary turns it into an exception raised right here
        return 0

    previous = signal.getsignal(signal.SIGTERM)
    assert run_command("accel x", terminated) == EXIT_SIGTERM
    assert "terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is previous  # restored


def test_main_debug_anywhere_and_real_subcommand(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["compress", str(src), "-o", str(target / "out"), "--quiet"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accel compress: error:")
    assert main(["compress", str(src), "-o", str(target / "out"), "--quiet", "--debug"]) == EXIT_ERROR
    assert "Traceback" in capsys.readouterr().err


def test_console_script_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "compress", str(tmp_path / "missing"), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_ERROR
    assert proc.stderr.count("\n") == 1 and "not a directory" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_error_after_an_open_progress_bar_starts_its_own_line(capsys):
    """A failure inside a loop with a progress bar: the bar is closed first, so the error line is not glued to it."""
    from tqdm.auto import tqdm

    def failing() -> int:
        bar = tqdm(total=10, desc="working")
        bar.update(3)
        raise FormatError("bad block")

    assert run_command("accel x", failing) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "\naccel x: error: bad block\n" in err or err.startswith("accel x: error: bad block")
    assert not any(line.endswith("bad block") and "working" in line for line in err.splitlines())


def test_ctrl_c_while_the_subcommands_load(monkeypatch, capsys):
    """Ctrl-C before the command runs (the parser imports the subcommands): one line and 130, no traceback."""
    import accel.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["generate"]) == EXIT_SIGINT
    err = capsys.readouterr().err
    assert err.strip() == "accel: error: interrupted (Ctrl-C)"

"""The examples of docs/sim.md run and print what the page says (the page is the simulator's reference)."""

import doctest
import warnings
from pathlib import Path

from accel import sim

DOC = Path(__file__).resolve().parents[2] / "docs" / "sim.md"


def _blocks() -> list[str]:
    parts = DOC.read_text().split("```python\n")[1:]
    return [p.split("```", 1)[0] for p in parts]


def test_the_usage_example_prints_what_the_page_shows():
    block = next(b for b in _blocks() if b.startswith(">>>"))
    test = doctest.DocTestParser().get_doctest(block, {}, "docs/sim.md §1", str(DOC), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_the_calibration_example_runs():
    block = next(b for b in _blocks() if "sim.calibrate(" in b)
    scope: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sim.SimWarning)  # three points, two terms: residuals are expected
        exec(compile(block, "docs/sim.md §7", "exec"), scope)
    hw = scope["hw"]
    assert isinstance(hw, sim.Hardware) and hw.calibration is not None and len(hw.calibration.residuals) == 3

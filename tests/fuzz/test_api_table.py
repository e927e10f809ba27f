"""The bad-input table (tests/fuzz/cases.py) against the real API: each case ends as the table says, and a failed
call leaves no temporary or partial file behind."""

from __future__ import annotations

import pytest

from tests.fuzz.cases import OK, World, all_cases
from tests.helpers.decoders import backend, random_model
from tests.helpers.drafts import write_target

CASES = all_cases()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from accel.backends import export_onnx

    root = tmp_path_factory.mktemp("fuzz")
    model = random_model(0)
    onnx = export_onnx(model, root / "m.onnx", ctx_len=32, progress=False)
    (root / "notes.txt").write_text("not a model\n")
    work = root / "work"
    work.mkdir()
    return World(
        tmp=work,
        model=model,
        target=backend(model, 1),
        draft=backend(random_model(1), 1),
        checkpoint=write_target(root / "ckpt"),
        onnx=onnx,
        file=root / "notes.txt",
    )


def _leftovers(root) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.endswith((".tmp", ".accel-partial")) or ".tmp" in p.name
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_table(world, case, recwarn):
    before = set(world.tmp.iterdir())
    if case.expect is OK:
        case.call(world)
        return
    with pytest.raises(case.expect) as info:
        case.call(world)
    message = str(info.value)
    assert message.strip() and "Traceback" not in message
    assert type(info.value).__name__ not in ("AssertionError", "KeyError", "IndexError", "ZeroDivisionError")
    assert _leftovers(world.tmp) == []
    assert set(world.tmp.iterdir()) == before, "a failed call left output behind"


def test_table_is_broad():
    """Every subpackage's entry points have cases, most of them bad input."""
    bad = [c for c in CASES if c.expect is not OK]
    assert len(CASES) >= 150 and len(bad) >= 0.8 * len(CASES)
    assert len({c.name for c in CASES}) == len(CASES)

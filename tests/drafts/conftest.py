"""Fixtures of the draft tests (helpers live in ``tests.helpers.drafts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tests.helpers.drafts import write_target


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return write_target(tmp_path_factory.mktemp("target") / "tiny-target")


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    import inspect
    import json

    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(inspect.getsource(json.decoder) * 2, encoding="utf-8")
    return path

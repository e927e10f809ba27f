"""Fixtures of the formats tests (helpers live in ``tests.helpers.formats``)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

"""``sample_prompts``: prompts the target writes itself (tiny random target, byte-level tokenizer)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accel.drafts.checkpoint import load_model, load_text_tokenizer
from accel.drafts.data import PromptSampling, sample_prompts
from accel.errors import DraftError


@pytest.fixture(scope="module")
def model_and_tok(tiny_target):
    return load_model(tiny_target, "target"), load_text_tokenizer(tiny_target)


def test_prompts_are_distinct_continuations_of_the_starts(model_and_tok):
    model, tok = model_and_tok
    starts = ["Q: ", "def "]
    sampling = PromptSampling(stop="\n", max_tokens=24, temperature=1.5, batch_size=8, seed=3, partial=True)
    out = sample_prompts(model, tok, starts, 6, sampling, progress=False)
    assert 0 < len(out) <= 6 and len(set(out)) == len(out)
    assert all(any(p.startswith(s) for s in starts) for p in out)
    # a kept sample either closed with the stop string (appended) or was cut after a sentence end
    assert all(p.endswith("\n") or p.rstrip()[-1] in ".?!" for p in out)
    again = sample_prompts(model, tok, starts, 6, sampling, progress=False)
    assert again == out  # seeded


def test_exclude_and_wrap(model_and_tok):
    model, tok = model_and_tok
    sampling = PromptSampling(
        stop="\n", max_tokens=24, temperature=1.5, batch_size=8, seed=4, partial=True, wrap=lambda s: f"<{s}>"
    )
    first = sample_prompts(model, tok, ["Q: "], 3, sampling, progress=False)
    assert first and all(p.startswith("<Q: ") and p.endswith(">") for p in first)
    second = sample_prompts(model, tok, ["Q: "], 3, replace(sampling, exclude=(first[0],)), progress=False)
    assert first[0] not in second
    assert second[: len(first) - 1] == first[1:]  # same seed: the same samples, minus the excluded one


def test_bad_arguments(model_and_tok):
    model, tok = model_and_tok
    with pytest.raises(DraftError, match="at least one start"):
        sample_prompts(model, tok, [], 2, PromptSampling(stop="\n"), progress=False)
    with pytest.raises(DraftError, match="single token"):
        sample_prompts(model, tok, ["Q: "], 2, PromptSampling(stop="\n\n\n"), progress=False)
    with pytest.raises(TypeError, match="needs sampling="):
        sample_prompts(model, tok, ["Q: "], 2, progress=False)


def test_deprecated_keywords_still_work(model_and_tok):
    """The keywords of the old signature fold into a ``PromptSampling`` with one DeprecationWarning naming it."""
    model, tok = model_and_tok
    sampling = PromptSampling(stop="\n", max_tokens=24, temperature=1.5, batch_size=8, seed=3, partial=True)
    with pytest.warns(DeprecationWarning, match=r"stop=, max_tokens=.*PromptSampling\("):
        old = sample_prompts(
            model,
            tok,
            ["Q: "],
            2,
            stop="\n",
            max_tokens=24,
            temperature=1.5,
            batch_size=8,
            seed=3,
            partial=True,
            progress=False,
        )
    assert old == sample_prompts(model, tok, ["Q: "], 2, sampling, progress=False)
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*temprature"):
        sample_prompts(model, tok, ["Q: "], 2, temprature=1.0)
    with pytest.raises(TypeError, match="give sampling alone"):
        sample_prompts(model, tok, ["Q: "], 2, sampling, seed=1)

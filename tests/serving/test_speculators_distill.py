"""An EAGLE-3 head distilled by accel (``accel.drafts.eagle3``) and written in the speculators format
(``accel.serving.speculators_write``): the ``speculators`` package's own loaders take the folder unchanged, its torch
forward gives accel's logits, and accel runs the head on onnxruntime exact (greedy SpD == AR) with the acceptance the
package's forward predicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from accel.backends import OrtBackend  # noqa: E402
from accel.drafts.eagle3 import (  # noqa: E402
    Eagle3Draft,
    Eagle3TrainConfig,
    default_layer_ids,
    distill_eagle3,
    target_aux_states,
)
from accel.errors import DraftError  # noqa: E402
from accel.models import save_pretrained  # noqa: E402
from accel.serving.aux_target import export_eagle3_target  # noqa: E402
from accel.serving.eagle3_graph import export_eagle3_draft  # noqa: E402
from accel.serving.speculators_format import read_speculators  # noqa: E402
from accel.serving.speculators_write import write_speculators  # noqa: E402
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar  # noqa: E402
from tests.serving.speculators_env import import_speculators, load_eagle3  # noqa: E402
from tests.serving.test_speculators import (  # noqa: E402
    ATOL,
    LAYER_IDS,
    NEW,
    PROMPTS,
    export_onnx_plain,
    package_predictions,
    package_steps,
    predicted_rounds,
    tiny_target,
)

import_speculators()
STEPS = 300


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """The tiny target, its greedy continuations of PROMPTS (the training data), the distilled head, its losses and
    its speculators folder."""
    tmp = tmp_path_factory.mktemp("distilled")
    target = tiny_target()
    verifier = save_pretrained(target, tmp / "target")
    plain = OrtBackend(export_onnx_plain(target, tmp / "plain.onnx"), threads=1)
    ar = [generate_ar(plain, [p], max_new_tokens=NEW, sampling=GREEDY).tokens[0] for p in PROMPTS]
    sequences = [p + a for p, a in zip(PROMPTS, ar, strict=True)]
    cfg = Eagle3TrainConfig(layer_ids=tuple(LAYER_IDS), steps=STEPS, lr=3e-3)
    head, losses = distill_eagle3(target, sequences, cfg, progress=False)
    out = write_speculators(head.speculators_tensors(), head.config, head.layer_ids, tmp / "eagle3", verifier=verifier)
    return target, sequences, head, losses, out


def _top1(target, head: Eagle3Draft, sequences) -> float:
    """Step-0 top-1 agreement of ``head`` with the target over ``sequences`` (teacher-forced)."""
    hits = total = 0
    for s in sequences:
        seq = torch.tensor(s)
        aux = target_aux_states(target, seq[None], head.layer_ids)[:, :-1]
        with torch.no_grad():
            mine = head(aux, seq[None, 1:])[0].argmax(-1)
            want = target.causal_forward(seq[None])[0, 1:].argmax(-1)
        hits, total = hits + int((mine == want).sum()), total + len(s) - 1
    return hits / total


def test_the_package_loads_the_folder_and_computes_accels_logits(distilled):
    """speculators' own config and model loaders take the folder as written; the package's step-0 logits equal the
    torch head's (which trained them) and accel's reader validates the same folder."""
    target, sequences, head, _, out = distilled
    raw = json.loads((out / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and raw["eagle_aux_hidden_state_layer_ids"] == LAYER_IDS
    model = load_eagle3(out)
    assert type(model).__name__ == "Eagle3DraftModel" and model.d2t is None
    for s in sequences[:2]:
        seq = torch.tensor(s)
        aux = target_aux_states(target, seq[None], LAYER_IDS)[0, :-1]
        package = package_steps(model, aux, seq[1:], 1)[0]
        with torch.no_grad():
            mine = head(aux[None], seq[None, 1:])[0]
        np.testing.assert_allclose(package.numpy(), mine.numpy(), atol=ATOL, rtol=0)
    h = read_speculators(out)
    assert h.layer_ids == tuple(LAYER_IDS) and h.config.num_layers == 1 and h.speculative_tokens == 3


def test_every_drafting_step_equals_the_package_forward(distilled):
    """The training-time-test steps the head is trained on (``Eagle3Draft.steps``: step t drafts from its own state)
    are the package's own TTT forward of the saved folder, step by step."""
    target, sequences, head, _, out = distilled
    model = load_eagle3(out)
    seq = torch.tensor(sequences[0])
    aux = target_aux_states(target, seq[None], LAYER_IDS)[0, :-1]
    package = package_steps(model, aux, seq[1:], 3)
    with torch.no_grad():
        mine = head.steps(aux[None], seq[None, 1:], 3)
    for t in range(3):
        np.testing.assert_allclose(package[t].numpy(), mine[t][0].numpy(), atol=ATOL, rtol=0)


def test_training_moves_the_head_towards_the_target(distilled):
    target, sequences, head, losses, _ = distilled
    assert len(losses) == STEPS and np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    untrained = Eagle3Draft.for_target(target, LAYER_IDS).eval()
    assert _top1(target, head, sequences) > max(0.8, _top1(target, untrained, sequences) + 0.2)


@pytest.fixture(scope="module")
def onnx_pair(distilled, tmp_path_factory):
    target, _, _, _, out = distilled
    tmp = tmp_path_factory.mktemp("distilled_onnx")
    head = read_speculators(out)
    t_path = export_eagle3_target(target, tmp / "t.onnx", head, ctx_len=64, tree=True, progress=False)
    return t_path, export_eagle3_draft(head, tmp / "d.onnx", ctx_len=64, tree=True)


@pytest.mark.parametrize("proposer", ["chain-3", "tree"])
def test_greedy_spd_with_the_distilled_head_equals_ar(distilled, onnx_pair, proposer):
    _, sequences, _, _, _ = distilled
    t_path, d_path = onnx_pair
    draft = OrtBackend(d_path, threads=1)
    prop = DraftTree(draft, nodes=6, top_k=3) if proposer == "tree" else DraftChain(draft, k=3)
    for prompt, sequence in zip(PROMPTS, sequences, strict=True):
        sd = generate(OrtBackend(t_path, threads=1), prop, [prompt], max_new_tokens=NEW, sampling=GREEDY)
        assert prompt + sd.tokens[0] == sequence
        assert sd.stats.accepted_drafts > 0


@pytest.mark.parametrize("k", [1, 3])
def test_tokens_per_call_are_what_the_package_predicts(distilled, onnx_pair, k):
    """Greedy chain SpD in accel accepts, round by round, what the package's own forward of the saved folder
    predicts on the same sequence; the tokens per target call agree."""
    target, sequences, _, _, out = distilled
    model = load_eagle3(out)
    t_path, d_path = onnx_pair
    for prompt, sequence in zip(PROMPTS, sequences, strict=True):
        rounds = predicted_rounds(package_predictions(model, target, sequence, k), sequence, len(prompt), k, NEW)
        sd = generate(OrtBackend(t_path, threads=1), DraftChain(OrtBackend(d_path, threads=1), k=k), [prompt],
                      max_new_tokens=NEW, sampling=GREEDY)  # fmt: skip
        assert sd.stats.accepted_histogram == np.bincount(rounds, minlength=k + 1).tolist()
        assert sd.stats.tokens_per_target_call == pytest.approx(NEW / len(rounds))


def test_bad_input_is_refused_by_name(distilled, tmp_path):
    target, sequences, head, _, out = distilled
    tensors = head.speculators_tensors()
    with pytest.raises(DraftError, match=r"missing \['fc.weight'\]"):
        write_speculators({k: v for k, v in tensors.items() if k != "fc.weight"}, head.config, LAYER_IDS,
                          tmp_path / "a", verifier="t")  # fmt: skip
    bad = {**tensors, "norm.weight": np.full_like(tensors["norm.weight"], np.nan)}
    with pytest.raises(DraftError, match=r"norm\.weight: need finite floats"):
        write_speculators(bad, head.config, LAYER_IDS, tmp_path / "b", verifier="t")
    with pytest.raises(DraftError, match="speculative_tokens"):
        write_speculators(tensors, head.config, LAYER_IDS, tmp_path / "c", verifier="t", speculative_tokens=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    with pytest.raises(DraftError, match="at least 3 tokens"):
        distill_eagle3(target, [[1, 2]], progress=False)
    with pytest.raises(DraftError, match="token ids must be in"):
        distill_eagle3(target, [[1, 2, 10**6]], progress=False)
    with pytest.raises(DraftError, match="distinct layers"):
        distill_eagle3(target, sequences, Eagle3TrainConfig(layer_ids=(0, 0, 1)), progress=False)
    with pytest.raises(DraftError, match="steps must be"):
        distill_eagle3(target, sequences, Eagle3TrainConfig(steps=0), progress=False)
    assert default_layer_ids(30) == (2, 15, 27) and default_layer_ids(4) == (0, 2, 4)
    assert Path(out / "model.safetensors").is_file()


def test_cli_distills_a_head_the_package_loads(tmp_path, capsys):
    """``accel distill-eagle3``: the target continues prompts, the head is trained and written; the package loads the
    folder; a second run to the same folder and bad layer ids are one-line errors."""
    from accel.cli import main
    from tests.helpers.drafts import write_target

    target = write_target(tmp_path / "target")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat sat\n")
    out = tmp_path / "e3"
    args = ["distill-eagle3", str(target), "-o", str(out), "--prompts", str(prompts), "--gen-tokens", "12"]
    assert main([*args, "--steps", "20", "--layer-ids", "0,1,2"]) == 0
    said = capsys.readouterr().out
    assert "speculators format" in said and "'method': 'eagle3'" in said
    model = load_eagle3(out)
    assert model.config.eagle_aux_hidden_state_layer_ids == [0, 1, 2]
    assert main([*args, "--steps", "1"]) == 2 and "exists" in capsys.readouterr().err
    assert main([*args[:3], str(tmp_path / "e3b"), *args[4:], "--layer-ids", "0,x"]) == 2
    assert "--layer-ids takes" in capsys.readouterr().err
    assert main([*args[:3], str(tmp_path / "e3c"), *args[4:], "--layer-ids", "0,99"]) == 2
    assert "distinct layers" in capsys.readouterr().err and not (tmp_path / "e3c").exists()
    assert main([*args[:3], str(tmp_path / "e3d"), *args[4:], "--speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens must be >= 1" in capsys.readouterr().err and not (tmp_path / "e3d").exists()

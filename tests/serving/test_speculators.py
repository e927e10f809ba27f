"""EAGLE-3 heads saved by the ``speculators`` package (0.9.0) run in accel on onnxruntime: ``read_speculators``,
``export_eagle3_draft`` and ``export_eagle3_target``.

The heads are built and saved by the package itself (random weights, a tiny Llama verifier), read back by accel, and
compared with the package's own torch forward: its teacher-forced TTT steps are what accel's drafting chain computes
when the drafts are the sequence's tokens, so every step's logits must agree (ATOL, float32 summation order). Greedy
SpD with the imported head (chain and tree) must equal greedy AR token for token, and its per-round acceptances must
be what the package's forward predicts on the same sequence.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from accel.backends import OrtBackend  # noqa: E402
from accel.models import MASKED_LOGIT, Decoder, ModelConfig, save_pretrained  # noqa: E402
from accel.models.decoder import new_cache  # noqa: E402
from accel.serving.aux_target import export_eagle3_target  # noqa: E402
from accel.serving.eagle3_graph import export_eagle3_draft  # noqa: E402
from accel.serving.speculators_format import read_speculators  # noqa: E402
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar  # noqa: E402
from tests.serving.speculators_env import build_eagle3, import_speculators, load_eagle3  # noqa: E402

import_speculators()
ATOL = 1e-4  # float32 summation orders (torch eager vs onnxruntime) on logits of ~15: observed at most 3.4e-5
VOCAB, HIDDEN, TARGET_LAYERS = 96, 64, 4


def tiny_target(seed: int = 0) -> Decoder:
    config = ModelConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=TARGET_LAYERS, num_heads=4, num_kv_heads=2,
        intermediate_size=96,
    )  # fmt: skip
    return Decoder(config).init_weights(seed, 0.5).eval()


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> tuple[Decoder, Path]:
    target = tiny_target()
    return target, save_pretrained(target, tmp_path_factory.mktemp("verifier") / "target")


def package_steps(model, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The package's logits ``[S, draft_vocab]`` of each TTT step: row q of step t reads token ``tokens[q + t]`` at
    position ``q + 1 + t`` (step 0: with the target state ``features[q]``; later: with its own previous state)."""
    seen: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out[0].detach().clone()))
    try:
        with torch.no_grad():
            model(
                hidden_states=features[None],
                input_ids=tokens[None],
                document_ids=torch.zeros(1, len(tokens), dtype=torch.long),
                ttt_steps=steps,
            )
    finally:
        hook.remove()
    return seen


def accel_chain(draft: OrtBackend, features: np.ndarray, tokens: np.ndarray, q: int, steps: int) -> list[np.ndarray]:
    """accel's logits ``[vocab]`` of a drafting chain from row q: the catch-up over positions 0..q+1 (token ``x_0 = 0``
    at 0 with zero features, token ``tokens[p-1]`` at p with the target state ``features[p-1]``), then ``steps - 1``
    drafting calls feeding ``tokens[q + t]`` with the head's own state, as ``DraftChain`` does."""
    width = draft.info.feature_size
    feats = np.zeros((1, q + 2, width), np.float32)
    feats[0, 1:, : features.shape[1]] = features[: q + 1]
    ids = np.concatenate([[0], tokens[: q + 1]])[None]
    draft.reset()
    logits, hidden = draft.forward_hidden(ids, np.arange(q + 2)[None], features=feats, num_logits=1)
    out = [logits[0, -1]]
    for t in range(1, steps):
        pos = np.array([[q + 1 + t]])
        logits, hidden = draft.forward_hidden(tokens[q + t].reshape(1, 1), pos, features=hidden[:, -1:], num_logits=1)
        out.append(logits[0, -1])
    return out


VARIANTS = {
    "default": {},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "full_vocab": {"draft_vocab": VOCAB},
    "two_layers": {"layers": 2},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_logits_equal_the_package_forward(verifier, tmp_path, variant):
    options = {"draft_vocab": 40, **VARIANTS[variant]}
    path = build_eagle3(verifier[1], tmp_path / "eagle3", layer_ids=[1, 2, TARGET_LAYERS], seed=3, **options)
    model = load_eagle3(path)
    head = read_speculators(path)
    draft = OrtBackend(export_eagle3_draft(head, tmp_path / "d.onnx", ctx_len=32), threads=1)
    assert draft.info.feature_size == head.feature_width == 4 * HIDDEN == draft.info.hidden_size
    gen = torch.Generator().manual_seed(7)
    length, steps = 12, 3
    features = torch.randn(length, 3 * HIDDEN, generator=gen)
    tokens = torch.randint(0, VOCAB, (length,), generator=gen)
    theirs = package_steps(model, features, tokens, steps)
    mapped = np.arange(VOCAB) if model.d2t is None else (torch.arange(len(model.d2t)) + model.d2t).numpy()
    assert sorted(mapped) == list(head.tensors.get("lm_head_token_ids", np.arange(VOCAB)))
    others = np.setdiff1d(np.arange(VOCAB), mapped)
    worst = 0.0
    for q in range(length - steps):
        ours = accel_chain(draft, features.numpy(), tokens.numpy(), q, steps)
        for t in range(steps):
            diff = np.abs(ours[t][mapped] - theirs[t][q].numpy()).max()
            worst = max(worst, float(diff))
            assert np.all(ours[t][others] == MASKED_LOGIT)
    assert worst < ATOL, worst


LAYER_IDS = [1, 2, TARGET_LAYERS]  # the last: after the last layer, before the final norm
PROMPTS = [[5, 17, 3, 60, 22, 8], [9, 41]]
NEW = 24


def aux_states(target: Decoder, tokens: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """``[L, n H]``: the residual stream entering each layer of ``layer_ids`` at every position (torch reference:
    ``Decoder.stage_forward`` over layers ``[0, l)``, the embedding for ``l = 0``)."""
    ids, pos = tokens[None], torch.arange(len(tokens))[None]
    parts = []
    with torch.no_grad():
        for layer in layer_ids:
            if layer == 0:
                parts.append(target.embed(ids, pos))
                continue
            keys, values = new_cache(target.config, 1, len(tokens))
            parts.append(target.stage_forward(pos, keys[:layer], values[:layer], layers=(0, layer), input_ids=ids)[0])
    return torch.cat(parts, dim=-1)[0]


@pytest.mark.parametrize(("weights", "ort_ops"), [("fp32", False), ("fp32", True), ("fp16", False)])
def test_target_outputs_the_aux_states(verifier, tmp_path, weights, ort_ops):
    """The rewritten target graph's ``hidden_states`` are the residual streams at the head's layers (then zeros);
    its logits are the plain export's, bit for bit (fp16: weights stored as float16, reached through a Cast)."""
    from accel.backends import export_onnx

    target, path = verifier
    head = read_speculators(build_eagle3(path, tmp_path / "e", layer_ids=[0, 2, TARGET_LAYERS], draft_vocab=40))
    options = {"ctx_len": 32, "weights": weights, "ort_ops": ort_ops, "progress": False}
    plain = OrtBackend(export_onnx(target, tmp_path / "p.onnx", **options))
    aux = OrtBackend(export_eagle3_target(target, tmp_path / "t.onnx", head, **options))
    assert aux.info.hidden_size == head.feature_width and aux.metadata["accel.aux_layer_ids"] == "0,2,4"
    tokens = torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(4))
    ids, pos = tokens.numpy()[None], np.arange(10)[None]
    logits, hidden = aux.forward_hidden(ids, pos)
    np.testing.assert_array_equal(logits, plain.forward(ids, pos))
    # against float64: the random target's residuals reach ~300 and float32 torch is itself ~1e-3 off there
    reference = copy.deepcopy(target)
    if weights == "fp16":  # the weights as stored; buffers (RoPE frequencies) stay float32, as in the graph
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(p.half().float())
    want = aux_states(reference.double(), tokens, [0, 2, TARGET_LAYERS]).numpy()
    assert np.abs(hidden[0, :, : 3 * HIDDEN] - want).max() < 1e-5 * np.abs(want).max()
    assert np.all(hidden[0, :, 3 * HIDDEN :] == 0)


def test_target_layers_must_exist(verifier, tmp_path):
    """Aux layers beyond the target's, or a head of another width, are refused before anything is written."""
    from accel.errors import DraftError

    target, path = verifier
    head = read_speculators(build_eagle3(path, tmp_path / "e", layer_ids=[1, 2, TARGET_LAYERS + 1], draft_vocab=40))
    with pytest.raises(DraftError, match=r"must be in 0\.\.4"):
        export_eagle3_target(target, tmp_path / "t.onnx", head, ctx_len=32, progress=False)
    wide = Decoder(target.config.with_(hidden_size=2 * HIDDEN)).init_weights(0).eval()
    head = read_speculators(build_eagle3(path, tmp_path / "f", layer_ids=[1, 2, 3], draft_vocab=40))
    with pytest.raises(DraftError, match="hidden width is 128"):
        export_eagle3_target(wide, tmp_path / "w.onnx", head, ctx_len=32, progress=False)
    assert not list(tmp_path.glob("*.onnx*"))


def package_predictions(model, target: Decoder, sequence: list[int], steps: int) -> np.ndarray:
    """``[steps, L - 1]``: the target token the package's head predicts at TTT step t for row q (token
    ``sequence[q + 1 + t]`` at position ``q + 1 + t``, predicting ``sequence[q + 2 + t]``)."""
    seq = torch.tensor(sequence)
    logits = package_steps(model, aux_states(target, seq, LAYER_IDS)[:-1], seq[1:], steps)
    d2t = torch.zeros(logits[0].shape[-1], dtype=torch.long) if model.d2t is None else model.d2t
    return np.stack([(step.argmax(-1) + d2t[step.argmax(-1)]).numpy() for step in logits])


def predicted_rounds(pred: np.ndarray, sequence: list[int], prompt_len: int, k: int, new: int) -> list[int]:
    """Accepted drafts per round of greedy chain SpD (``k`` drafts, ``new`` tokens) as the package's forward
    predicts them: a round at committed length n drafts from row n - 2; draft t is accepted while it equals the
    sequence's next token (after accepted drafts the package's teacher-forced input is the draft itself)."""
    rounds, n = [], prompt_len
    while n < prompt_len + new:
        k_round = min(k, prompt_len + new - n - 1)
        accepted = 0
        while accepted < k_round and pred[accepted, n - 2] == sequence[n + accepted]:
            accepted += 1
        rounds.append(accepted)
        n += accepted + 1
    return rounds


def fit_head(target: Decoder, sequences: list[list[int]], steps: int = 3):
    """``fit(model)`` for ``build_eagle3``: least-squares ``lm_head`` rows so that the head's ``steps`` TTT steps give
    the target's logits on ``sequences`` (a head that is often right, so the SpD runs accept drafts, and at every
    depth: step t of row q predicts ``sequence[q + 2 + t]``)."""

    def fit(model) -> None:
        states, wants = [], []
        hook = model.lm_head.register_forward_hook(lambda mod, args, out: states.append(args[0][0].detach()))
        for sequence in sequences:
            seq = torch.tensor(sequence)
            package_steps(model, aux_states(target, seq, LAYER_IDS)[:-1], seq[1:], steps)
            with torch.no_grad():
                logits = target.causal_forward(seq[None])[0].float()
            rows = len(sequence) - 1
            for t in range(steps):  # row q of step t predicts position q + 2 + t: the last t + 1 rows have none
                states[-steps + t] = states[-steps + t][: rows - 1 - t]
                wants.append(logits[1 + t : rows])
        hook.remove()
        rows = torch.arange(model.config.transformer_layer_config.vocab_size)
        rows = rows[model.t2d] if model.t2d is not None else rows
        solution = torch.linalg.lstsq(torch.cat(states), torch.cat(wants)[:, rows]).solution
        with torch.no_grad():
            model.lm_head.weight.copy_(solution.T)

    return fit


@pytest.fixture(scope="module")
def spd_setup(verifier, tmp_path_factory):
    """The target (aux export, batch 1 and 2), its greedy continuations of PROMPTS, and a head fitted to them."""
    target, path = verifier
    tmp = tmp_path_factory.mktemp("spd")
    plain = OrtBackend(export_onnx_plain(target, tmp / "plain.onnx"), threads=1)
    ar = [generate_ar(plain, [p], max_new_tokens=NEW, sampling=GREEDY).tokens[0] for p in PROMPTS]
    sequences = [p + a for p, a in zip(PROMPTS, ar, strict=True)]
    used = sorted({t for s in sequences for t in s})
    fill = [t for t in range(VOCAB) if t not in used][: max(0, 40 - len(used))]
    head_dir = build_eagle3(
        path, tmp / "eagle3", layer_ids=LAYER_IDS, draft_vocab=max(40, len(used)), draft_ids=torch.tensor(used + fill),
        seed=5, fit=fit_head(target, sequences),
    )  # fmt: skip
    head = read_speculators(head_dir)
    files = {}
    for batch in (1, 2):
        files[batch] = (
            export_eagle3_target(target, tmp / f"t{batch}.onnx", head, ctx_len=64, batch_size=batch, tree=True,
                                 progress=False),
            export_eagle3_draft(head, tmp / f"d{batch}.onnx", ctx_len=64, batch_size=batch, tree=True),
        )  # fmt: skip
    return target, sequences, head_dir, files


def export_onnx_plain(target: Decoder, path: Path) -> Path:
    from accel.backends import export_onnx

    return export_onnx(target, path, ctx_len=64, progress=False)


@pytest.mark.parametrize("proposer", ["chain-1", "chain-3", "tree"])
def test_greedy_spd_with_the_head_equals_ar(spd_setup, proposer):
    _, sequences, _, files = spd_setup
    t_path, d_path = files[2]
    draft = OrtBackend(d_path, threads=1)
    prop = DraftTree(draft, nodes=6, top_k=3) if proposer == "tree" else DraftChain(draft, k=int(proposer[-1]))
    sd = generate(OrtBackend(t_path, threads=1), prop, PROMPTS, max_new_tokens=NEW, sampling=GREEDY)
    assert [p + t for p, t in zip(PROMPTS, sd.tokens, strict=True)] == sequences
    assert sd.stats.accepted_drafts > 0 and sd.stats.tokens_per_target_call > 1


@pytest.mark.parametrize("k", [1, 3])
def test_acceptance_is_what_the_package_predicts(spd_setup, k):
    """Per prompt, greedy chain SpD in accel accepts, round by round, what the package's own forward predicts on the
    same sequence: the same rounds, accepted drafts and tokens per target call."""
    target, sequences, head_dir, files = spd_setup
    model = load_eagle3(head_dir)
    t_path, d_path = files[1]
    deepest = 0
    for prompt, sequence in zip(PROMPTS, sequences, strict=True):
        pred = package_predictions(model, target, sequence, k)
        rounds = predicted_rounds(pred, sequence, len(prompt), k, NEW)
        deepest = max(deepest, *rounds)
        draft = DraftChain(OrtBackend(d_path, threads=1), k=k)
        sd = generate(OrtBackend(t_path, threads=1), draft, [prompt], max_new_tokens=NEW, sampling=GREEDY)
        assert prompt + sd.tokens[0] == sequence
        assert sd.stats.accepted_histogram == np.bincount(rounds, minlength=k + 1).tolist(), (rounds, sd.stats)
        assert sd.stats.row_calls == len(rounds) and sd.stats.accepted_drafts == sum(rounds)
        assert sd.stats.tokens_per_target_call == pytest.approx(NEW / len(rounds))
    assert deepest == min(k, 2)  # some round accepted a draft made from the head's own state (k = 3)


# ----------------------------------------------------------------------------------------------- validation


@pytest.fixture(scope="module")
def saved_head(verifier, tmp_path_factory) -> Path:
    return build_eagle3(verifier[1], tmp_path_factory.mktemp("head") / "eagle3", layer_ids=[1, 2, 4], draft_vocab=40)


def _edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if key == "layer_model_type":
            config["transformer_layer_config"]["model_type"] = value
        elif value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def _edit_tensors(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _unpicklable_only(path: Path) -> None:
    (path / "model.safetensors").rename(path / "pytorch_model.bin")


BROKEN = {
    "model type": (lambda p: _edit_config(p, speculators_model_type="mtp"), "speculators_model_type='mtp'"),
    "qwen3 layers": (lambda p: _edit_config(p, layer_model_type="qwen3"), "qwen3"),
    "no aux layers": (lambda p: _edit_config(p, eagle_aux_hidden_state_layer_ids=None), "is missing"),
    "bad aux layers": (lambda p: _edit_config(p, eagle_aux_hidden_state_layer_ids=[1, 1]), "distinct"),
    "draft vocab": (lambda p: _edit_config(p, draft_vocab_size=0), "draft_vocab_size"),
    "target hidden": (lambda p: _edit_config(p, target_hidden_size=32), "target_hidden_size"),
    "flag type": (lambda p: _edit_config(p, norm_output="yes"), "norm_output"),
    "nan weight": (lambda p: _edit_tensors(p, lambda t: t["fc.weight"].__setitem__((0, 0), float("nan"))), "NaN"),
    "head shape": (lambda p: _edit_tensors(p, lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:-1]})),
                   "shape"),
    "int weight": (lambda p: _edit_tensors(p, lambda t: t.update({"norm.weight": t["norm.weight"].long()})), "I64"),
    "missing t2d": (lambda p: _edit_tensors(p, lambda t: t.pop("t2d")), "'t2d' is missing"),
    "d2t twice": (lambda p: _edit_tensors(p, lambda t: t["d2t"].__setitem__(1, t["d2t"][0] - 1)), "two draft tokens"),
    "d2t range": (lambda p: _edit_tensors(p, lambda t: t["d2t"].__setitem__(0, -1)), "outside"),
    "t2d disagrees": (lambda p: _edit_tensors(p, lambda t: t.update({"t2d": t["t2d"].roll(1)})), "disagree"),
    "extra tensor": (lambda p: _edit_tensors(p, lambda t: t.update({"medusa.0.weight": t["norm.weight"].clone()})),
                     "unexpected tensors"),
    "no embedding": (lambda p: _edit_tensors(p, lambda t: t.pop("embed_tokens.weight")), "embed_tokens="),
    "pickle only": (_unpicklable_only, "no model.safetensors"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoints_are_refused_by_name(saved_head, tmp_path, case):
    import shutil

    from accel.errors import DraftError

    path = Path(shutil.copytree(saved_head, tmp_path / "head"))
    breaks, named = BROKEN[case]
    breaks(path)
    with pytest.raises(DraftError, match=named.replace("(", r"\(").replace("[", r"\[")):
        read_speculators(path)


def test_missing_embedding_comes_from_the_target(verifier, saved_head, tmp_path):
    """A head saved without ``embed_tokens`` (the package then loads the verifier's) reads with the target's."""
    import shutil

    path = Path(shutil.copytree(saved_head, tmp_path / "head"))
    _edit_tensors(path, lambda t: t.pop("embed_tokens.weight"))
    embed = verifier[0].embed_tokens.weight.detach().numpy()
    head = read_speculators(path, embed_tokens=embed)
    np.testing.assert_array_equal(head.tensors["embed_tokens.weight"], embed)
    np.testing.assert_array_equal(head.tensors["fc.weight"], read_speculators(saved_head).tensors["fc.weight"])


def test_bfloat16_checkpoint_is_widened_exactly(verifier, tmp_path):
    """A head saved in bfloat16 (as published heads are) reads as the float32 values of its bfloat16 weights."""
    path = build_eagle3(verifier[1], tmp_path / "e", layer_ids=[1, 2, 4], draft_vocab=40)
    model = load_eagle3(path).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    head = read_speculators(tmp_path / "bf16")
    state = model.state_dict()
    for name in ("fc.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"):
        np.testing.assert_array_equal(head.tensors[name], state[name].float().numpy())

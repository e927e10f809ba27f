"""The table of bad inputs per public entry point: each case is a call and the outcome it must have.

``OK`` means correct behaviour (the call succeeds); an error class means that class (an ``AccelError`` subclass, or
``OSError`` for the operating system's own refusals) with a message naming the problem. Nothing else is allowed: no
bare ``ValueError``/``TypeError``/``AttributeError`` from inside numpy, torch, onnx or pydantic, no ``MemoryError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import BackendError, DraftError, FormatError, ModelError, SimError, SpdError

OK = None


@dataclass(frozen=True)
class World:
    """The real objects the cases act on (built once per module)."""

    tmp: Path
    model: Any  # a tiny random accel.models.Decoder
    target: Any  # TorchBackend over it, batch 1, ctx 64
    draft: Any
    checkpoint: Path  # a tiny checkpoint directory (config.json, weights, tokenizer.json)
    onnx: Path  # an exported ONNX file of ``model`` (ctx 32)
    file: Path  # a plain text file


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[World], Any]
    expect: type[BaseException] | None  # OK or the error class


X = np.linspace(-3, 3, 64, dtype=np.float32)
CFG = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _formats() -> list[Case]:
    from accel.formats import (
        MXTensor,
        decode_elements,
        dequantize,
        encode_elements,
        get_format,
        load_tensors,
        pack_codes,
        quantize,
        save_tensors,
        unpack_codes,
    )

    q = lambda *a, **k: lambda w: quantize(*a, **k)  # noqa: E731
    cases = [
        Case("quantize ok", q(X, "mxfp6"), OK),
        Case("quantize empty", q(np.zeros(0, np.float32), "mxfp6"), OK),
        Case("quantize nan stays nan", q(np.array([np.nan, 1.0], np.float32), "mxfp6"), OK),
        Case("quantize block 0", q(X, "mxfp6", block_size=0), FormatError),
        Case("quantize block -32", q(X, "mxfp6", block_size=-32), FormatError),
        Case("quantize block 2**28", q(X, "mxfp6", block_size=2**28), FormatError),
        Case("quantize block 1.5", q(X, "mxfp6", block_size=1.5), FormatError),
        Case("quantize block True", q(X, "mxfp6", block_size=True), FormatError),
        Case("quantize block '32'", q(X, "mxfp6", block_size="32"), FormatError),
        Case("quantize unknown format", q(X, "mxfp7"), FormatError),
        Case("quantize format None", q(X, None), FormatError),
        Case("quantize format 6", q(X, 6), FormatError),
        Case("quantize str array", q(np.array(["a"]), "mxfp6"), FormatError),
        Case("quantize None", q(None, "mxfp6"), FormatError),
        Case("quantize list", q([1.0, 2.0], "mxfp6"), OK),
        Case("quantize 0-d", q(np.float32(1.0), "mxfp6"), FormatError),
        Case("quantize int32", q(np.arange(4, dtype=np.int32), "mxfp6"), FormatError),
        Case("quantize complex", q(np.ones(4, np.complex64), "mxfp6"), FormatError),
        Case("quantize bool", q(np.ones(4, bool), "mxfp6"), FormatError),
        Case("quantize axis 5", q(np.ones((4, 4), np.float32), "mxfp6", axis=5), FormatError),
        Case("quantize axis 'x'", q(np.ones((4, 4), np.float32), "mxfp6", axis="x"), FormatError),
        Case("quantize f64 beyond E8M0", q(np.array([2.0**140, 1.0]), "mxfp6"), FormatError),
        Case("quantize padding blow-up", q(np.ones((4096, 1)), "mxfp6", block_size=65536, axis=1), FormatError),
        Case("encode by name", lambda w: encode_elements(X, "mxfp6"), OK),
        Case("encode unknown name", lambda w: encode_elements(X, "fp6"), FormatError),
        Case("decode code 64 in 6 bits", lambda w: decode_elements(np.array([64]), "mxfp6"), FormatError),
        Case("decode negative code", lambda w: decode_elements(np.array([-1]), "mxfp4"), FormatError),
        Case("decode float codes", lambda w: decode_elements(np.array([1.5]), "mxfp6"), FormatError),
        Case("get_format ''", lambda w: get_format(""), FormatError),
        Case("pack codes out of range", lambda w: pack_codes(np.array([70], np.uint8), 6), FormatError),
        Case("pack bits 0", lambda w: pack_codes(np.array([1], np.uint8), 0), FormatError),
        Case("unpack short buffer", lambda w: unpack_codes(np.zeros(2, np.uint8), 6, 100), FormatError),
        Case("MXTensor.from_bytes junk", lambda w: MXTensor.from_bytes(b"junk"), FormatError),
        Case("dequantize a list", lambda w: dequantize([1, 2]), FormatError),
        Case("dequantize to int", lambda w: quantize(X, "mxfp6").dequantize(np.int32), FormatError),
        Case("save_tensors ok", lambda w: save_tensors(w.tmp / "ok.safetensors", {"a": X}), OK),
        Case("save_tensors to a dir", lambda w: save_tensors(w.tmp, {"a": X}), FormatError),
        Case("save_tensors bad name", lambda w: save_tensors(w.tmp / "b.safetensors", {1: X}), FormatError),
        Case("save_tensors object", lambda w: save_tensors(w.tmp / "c.safetensors", {"a": "x"}), FormatError),
        Case("save_tensors nan", lambda w: save_tensors(w.tmp / "n.safetensors", {"a": np.array([np.nan])}), OK),
        Case("load_tensors missing", lambda w: load_tensors(w.tmp / "nope.safetensors"), FormatError),
        Case("load_tensors text file", lambda w: load_tensors(w.file), FormatError),
        Case("load_tensors a dir", lambda w: load_tensors(w.tmp), FormatError),
    ]
    return cases


def _compress() -> list[Case]:
    from accel import compress, load_compressed, save_compressed
    from accel.formats import CompressSettings, compress_checkpoint

    def compress_copy(**kw):
        def call(w: World):
            import copy

            return compress(copy.deepcopy(w.model), **kw)

        return call

    return [
        Case("compress ok", compress_copy(fmt="mxfp6"), OK),
        Case("compress None", lambda w: compress(None), FormatError),
        Case("compress unknown fmt", compress_copy(fmt="mxfp7"), FormatError),
        Case("compress block 0", compress_copy(block_size=0), FormatError),
        Case("compress block 10**9", compress_copy(block_size=10**9), FormatError),
        Case("compress nonfinite 'maybe'", compress_copy(nonfinite="maybe"), FormatError),
        Case("save_compressed to a dir", lambda w: save_compressed(w.model, w.tmp), FormatError),
        Case("load_compressed missing", lambda w: load_compressed(w.tmp / "nope.safetensors", w.model), FormatError),
        Case("load_compressed text", lambda w: load_compressed(w.file, w.model), FormatError),
        Case("load_compressed no skeleton", lambda w: load_compressed(w.file, None), FormatError),
        Case(
            "ckpt src missing", lambda w: compress_checkpoint(w.tmp / "nope", w.tmp / "o1", progress=False), FormatError
        ),
        Case("ckpt src is a file", lambda w: compress_checkpoint(w.file, w.tmp / "o2", progress=False), FormatError),
        Case("ckpt out is a file", lambda w: compress_checkpoint(w.checkpoint, w.file, progress=False), FormatError),
        Case("ckpt out = src", lambda w: compress_checkpoint(w.checkpoint, w.checkpoint, progress=False), FormatError),
        Case(
            "ckpt block 0",
            lambda w: compress_checkpoint(w.checkpoint, w.tmp / "o3", CompressSettings(block_size=0), progress=False),
            FormatError,
        ),
        Case(
            "ckpt unknown nonfinite",
            lambda w: compress_checkpoint(
                w.checkpoint, w.tmp / "o4", CompressSettings(nonfinite="drop"), progress=False
            ),
            FormatError,
        ),
    ]


def _models() -> list[Case]:
    from accel.models import ModelConfig, load_checkpoint

    def cfg(**changes):
        return lambda w: ModelConfig.from_hf({**CFG, **changes})

    def drop(field):
        return lambda w: ModelConfig.from_hf({k: v for k, v in CFG.items() if k != field})

    return [
        Case("config ok", cfg(), OK),
        Case("config tie 'false'", cfg(tie_word_embeddings="false"), ModelError),
        Case("config tie 0", cfg(tie_word_embeddings=0), ModelError),
        Case("config hidden '16'", cfg(hidden_size="16"), ModelError),
        Case("config hidden 16.0", cfg(hidden_size=16.0), ModelError),
        Case("config hidden True", cfg(hidden_size=True), ModelError),
        Case("config vocab 0", cfg(vocab_size=0), ModelError),
        Case("config vocab 10**12", cfg(vocab_size=10**12), ModelError),
        Case("config layers 10**6", cfg(num_hidden_layers=10**6), ModelError),
        Case("config heads 3", cfg(num_attention_heads=3), ModelError),
        Case("config kv heads 3", cfg(num_key_value_heads=3), ModelError),
        Case("config rms eps -1", cfg(rms_norm_eps=-1.0), ModelError),
        Case("config rope theta nan", cfg(rope_theta=float("nan")), ModelError),
        Case("config eos 'x'", cfg(eos_token_id="x"), ModelError),
        Case("config model_type bert", cfg(model_type="bert"), ModelError),
        Case("config rope_scaling list", cfg(rope_scaling=[1]), ModelError),
        Case("config no hidden_size", drop("hidden_size"), ModelError),
        Case("config no vocab_size", drop("vocab_size"), ModelError),
        Case("config no model_type", drop("model_type"), ModelError),
        Case("config a list", lambda w: ModelConfig.from_hf([CFG]), ModelError),
        Case("config None", lambda w: ModelConfig.from_hf(None), ModelError),
        Case("load_checkpoint ok", lambda w: load_checkpoint(w.checkpoint), OK),
        Case("load_checkpoint missing", lambda w: load_checkpoint(w.tmp / "nope"), ModelError),
        Case("load_checkpoint text file", lambda w: load_checkpoint(w.file), ModelError),
    ]


def _backends() -> list[Case]:
    from accel.backends import OrtBackend, QaicOptions, TorchBackend, export_onnx, write_qaic_files

    def export(**kw):
        return lambda w: export_onnx(w.model, w.tmp / "e.onnx", **{"ctx_len": 16, "progress": False, **kw})

    def qaic(**kw):
        return lambda w: write_qaic_files(w.onnx, w.tmp / "q", **{"prompt_len": 8, "k": 3, "ctx_len": 32, **kw})

    def torch_backend(**kw):
        return lambda w: TorchBackend(w.model, **{"ctx_len": 16, **kw})

    return [
        Case("export ok", export(), OK),
        Case("export ctx 1.5", export(ctx_len=1.5), BackendError),
        Case("export ctx 0", export(ctx_len=0), BackendError),
        Case("export ctx 10**9", export(ctx_len=10**9), BackendError),
        Case("export ctx True", export(ctx_len=True), BackendError),
        Case("export batch 10**7", export(batch_size=10**7), BackendError),
        Case("export num_logits 99", export(num_logits=99), BackendError),
        Case("export weights 'fp8'", export(weights="fp8"), BackendError),
        Case("export opset 13", export(opset=13), BackendError),
        Case("export to a dir", lambda w: export_onnx(w.model, w.tmp, ctx_len=16, progress=False), BackendError),
        Case("export None", lambda w: export_onnx(None, w.tmp / "n.onnx", ctx_len=16, progress=False), BackendError),
        Case("ort ok", lambda w: OrtBackend(w.onnx), OK),
        Case("ort missing file", lambda w: OrtBackend(w.tmp / "nope.onnx"), BackendError),
        Case("ort text file", lambda w: OrtBackend(w.file), BackendError),
        Case("ort threads 0", lambda w: OrtBackend(w.onnx, threads=0), BackendError),
        Case("ort threads 1.5", lambda w: OrtBackend(w.onnx, threads=1.5), BackendError),
        Case("ort batch 2 of a batch-1 graph", lambda w: OrtBackend(w.onnx, batch_size=2), BackendError),
        Case("torch ok", torch_backend(), OK),
        Case("torch ctx 10**11", torch_backend(ctx_len=10**11), BackendError),
        Case("torch ctx 0", torch_backend(ctx_len=0), BackendError),
        Case("torch ctx '16'", torch_backend(ctx_len="16"), BackendError),
        Case("torch batch 10**6", torch_backend(batch_size=10**6), BackendError),
        Case("torch threads -1", torch_backend(threads=-1), BackendError),
        Case("torch cache beyond memory", torch_backend(ctx_len=1 << 20, batch_size=4096), BackendError),
        Case("torch no model", lambda w: TorchBackend(None, ctx_len=16), BackendError),
        Case("forward ids out of vocab", lambda w: w.target.forward(np.array([[99]]), np.array([[0]])), BackendError),
        Case(
            "forward position beyond ctx", lambda w: w.target.forward(np.array([[1]]), np.array([[64]])), BackendError
        ),
        Case("forward float ids", lambda w: w.target.forward(np.array([[1.5]]), np.array([[0]])), BackendError),
        Case("forward shapes differ", lambda w: w.target.forward(np.array([[1, 2]]), np.array([[0]])), BackendError),
        Case("qaic ok", qaic(), OK),
        Case("qaic k 0", qaic(k=0), BackendError),
        Case("qaic k beyond ctx", qaic(k=64), BackendError),
        Case("qaic ctx differs from the graph", qaic(ctx_len=64), BackendError),
        Case("qaic cores -1", qaic(options=QaicOptions(num_cores=-1)), BackendError),
        Case(
            "qaic out is a file",
            lambda w: write_qaic_files(w.onnx, w.file, prompt_len=8, k=3, ctx_len=32),
            BackendError,
        ),
        Case(
            "qaic onnx missing",
            lambda w: write_qaic_files(w.tmp / "x.onnx", w.tmp / "q2", prompt_len=8, k=3, ctx_len=32),
            BackendError,
        ),
    ]


def _spd() -> list[Case]:
    from accel.spd import DraftChain, DraftTree, NgramLookup, Sampling, generate, generate_ar

    def gen(k=2, sampling=None, **kw):
        args = {"prompt_ids": [[1, 2, 3]], "max_new_tokens": 4, **kw}
        return lambda w: generate(w.target, DraftChain(w.draft, k=k), sampling=sampling, **args)

    def warped(**kw):
        return gen(sampling=Sampling(**kw))

    def ar(**kw):
        args = {"prompt_ids": [[1, 2, 3]], "max_new_tokens": 4, **kw}
        return lambda w: generate_ar(w.target, **args)

    return [
        Case("generate ok", gen(), OK),
        Case("generate greedy ok", warped(greedy=True), OK),
        Case("generate max_new 0", gen(max_new_tokens=0), OK),
        Case("generate max_new 10**9 stops at ctx", gen(max_new_tokens=10**9), OK),
        Case("generate max_new -1", gen(max_new_tokens=-1), SpdError),
        Case("generate max_new 1.5", gen(max_new_tokens=1.5), SpdError),
        Case("generate k 0", gen(k=0), SpdError),
        Case("generate k True", gen(k=True), SpdError),
        Case("generate k 10**6", gen(k=10**6), SpdError),
        Case("generate k '2'", gen(k="2"), SpdError),
        Case("generate empty prompt", gen(prompt_ids=[[]]), SpdError),
        Case("generate prompt out of vocab", gen(prompt_ids=[[99]]), SpdError),
        Case("generate prompt negative", gen(prompt_ids=[[-1]]), SpdError),
        Case("generate prompt floats", gen(prompt_ids=[[1.5]]), SpdError),
        Case("generate prompt a str", gen(prompt_ids="hello"), SpdError),
        Case("generate prompt beyond ctx", gen(prompt_ids=[[1] * 100]), SpdError),
        Case("generate batch 2 on batch-1", gen(prompt_ids=[[1], [2]]), SpdError),
        Case("generate temperature 0", warped(temperature=0.0), SpdError),
        Case("generate temperature nan", warped(temperature=float("nan")), SpdError),
        Case("generate temperature inf", warped(temperature=float("inf")), SpdError),
        Case("generate top_p 2", warped(top_p=2.0), SpdError),
        Case("generate top_p 0", warped(top_p=0.0), SpdError),
        Case("generate top_k 0", warped(top_k=0), SpdError),
        Case("generate top_k True", warped(top_k=True), SpdError),
        Case(
            "generate sampling a dict",
            lambda w: generate(w.target, None, [[1]], max_new_tokens=2, sampling={}),
            SpdError,
        ),
        Case("generate seed -1", gen(seed=-1), SpdError),
        Case("generate seed 1.5", gen(seed=1.5), SpdError),
        Case("generate eos 'x'", gen(eos_token_id="x"), SpdError),
        Case("generate eos -3", gen(eos_token_id=-3), SpdError),
        Case("generate target None", lambda w: generate(None, DraftChain(w.draft), [[1]], max_new_tokens=2), SpdError),
        Case("generate proposer a path", lambda w: generate(w.target, "d.onnx", [[1]], max_new_tokens=2), SpdError),
        Case("DraftChain of a path", lambda w: DraftChain("d.onnx", k=2), SpdError),
        Case("DraftChain min_draft_prob 2", lambda w: DraftChain(w.draft, k=2, min_draft_prob=2.0), SpdError),
        Case("DraftTree of None", lambda w: DraftTree(None), SpdError),
        Case("NgramLookup n 0", lambda w: NgramLookup(0, 2), SpdError),
        Case("generate eos 10**30", gen(eos_token_id=10**30), SpdError),
        Case("generate eos beyond vocab", gen(eos_token_id=32), SpdError),
        Case("generate eos [5, 10**30]", gen(eos_token_id=[5, 10**30]), SpdError),
        *_proposer_contract(),
        Case("generate_ar ok", ar(), OK),
        Case("generate_ar seed -1", ar(seed=-1), SpdError),
        Case("generate_ar max_new -5", ar(max_new_tokens=-5), SpdError),
        Case("generate_ar eos [1, None]", ar(eos_token_id=[1, None]), SpdError),
    ]


class _Returns:
    """A custom proposer whose ``propose`` returns ``make(run)`` (the contract: one TokenTree or None per row)."""

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make = make

    @property
    def info(self):
        from accel.spd import ProposerInfo

        return ProposerInfo("custom", 2, 2)

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        return self.make(run)

    def update(self, run, outcomes) -> None:
        pass


def _proposer_contract() -> list[Case]:
    """A custom proposer that breaks the contract (docs/spd.md, "A custom proposer"): a named SpdError, never a
    TypeError/IndexError from inside the loop or a sample from the wrong law."""
    from accel.spd import TokenTree, generate, speculative_accept, verify_greedy, verify_sampled

    q = np.full(32, 1 / 32)

    def tree(dist=None, parents=(-1, 0), token=3):
        return TokenTree(np.array([0, token]), np.array(parents), None if dist is None else np.stack([q, dist]))

    def sampled(t):
        return lambda w: verify_sampled(t, lambda i: q, np.random.default_rng(0))

    def custom(make):
        return lambda w: generate(w.target, _Returns(make), [[1, 2, 3]], max_new_tokens=3)

    def root(run):
        return int(run.tokens[0, run.n[0] - 1])

    def rng():
        return np.random.default_rng(0)

    return [
        Case("verify_sampled ok", sampled(tree(q)), OK),
        Case("verify_sampled rows sum to 2", sampled(tree(2 * q)), SpdError),
        Case("verify_sampled rows sum to 0.5", sampled(tree(q / 2)), SpdError),
        Case("verify_sampled nan proposal", sampled(tree(np.r_[np.nan, q[1:]])), SpdError),
        Case("verify_sampled negative proposal", sampled(tree(np.r_[-q[0], q[0] * 2, q[2:]])), SpdError),
        Case("verify_sampled token of probability 0", sampled(tree(np.eye(32)[0])), SpdError),
        Case("verify_sampled token 99", sampled(tree(q, token=99)), SpdError),
        Case("verify_greedy ok", lambda w: verify_greedy(tree(), lambda i: 3), OK),
        Case(
            "verify_greedy parent 5 of 2 nodes", lambda w: verify_greedy(tree(parents=(-1, 5)), lambda i: 3), SpdError
        ),
        Case("verify_greedy parent cycle", lambda w: verify_greedy(tree(parents=(-1, 1)), lambda i: 3), SpdError),
        Case("verify_greedy two roots", lambda w: verify_greedy(tree(parents=(-1, -1)), lambda i: 3), SpdError),
        Case("verify_greedy a list", lambda w: verify_greedy([0, 3], lambda i: 3), SpdError),
        Case(
            "speculative_accept ok",
            lambda w: speculative_accept(np.zeros((1, 1), np.int64), q[None, None], np.tile(q, (1, 2, 1)), rng()),
            OK,
        ),
        Case(
            "speculative_accept p sums to 2",
            lambda w: speculative_accept(np.zeros((1, 1), np.int64), 2 * q[None, None], np.tile(q, (1, 2, 1)), rng()),
            SpdError,
        ),
        Case("custom proposer ok", custom(lambda run: [TokenTree.chain(root(run), [3])]), OK),
        Case("custom proposer returns None", custom(lambda run: None), SpdError),
        Case("custom proposer returns []", custom(lambda run: []), SpdError),
        Case("custom proposer returns a tree", custom(lambda run: TokenTree.chain(root(run), [3])), SpdError),
        Case(
            "custom proposer unnormalised",
            custom(lambda run: [TokenTree.chain(root(run), [3], dists=2 * q[None])]),
            SpdError,
        ),
    ]


def _sim() -> list[Case]:
    from accel.sim import predict_speedup

    def predict(**kw):
        return lambda w: predict_speedup("llama-2-7b", "qualcomm-llama2-draft-115m", "h100-sxm", **kw)

    return [
        Case("predict devices 8", predict(devices=8), OK),
        Case("predict devices 32 (one head each)", predict(devices=32), OK),
        Case("predict devices 99", predict(devices=99), SimError),
        Case("predict devices 4096", predict(devices=4096), SimError),
        Case("predict draft_devices 99", predict(draft_devices=99), SimError),
    ]


def _artefacts(w: World, damage: str) -> Path:
    """A draft artefact for ``w.model``, damaged as ``damage`` says, outside ``w.tmp`` (whose contents the table
    checks): Hydra heads with a NaN / +Inf weight, or an exit head whose weights are cut in half."""
    import torch

    from accel.drafts.early_exit import ExitHead, save_exit_head
    from accel.drafts.hydra.model import build_hydra, save_hydra

    out = w.tmp.parent / "artefacts" / damage
    if damage.startswith("exit"):
        path = save_exit_head(ExitHead(w.model, 1, width=8), w.model, out)
        weights = path / "exit_head.safetensors"
        if damage == "exit truncated":
            weights.write_bytes(weights.read_bytes()[:100])
        return path
    heads = build_hydra(w.model, num_heads=2)
    if damage != "heads ok":
        with torch.no_grad():
            next(heads.heads.parameters()).view(-1)[0] = float("nan" if damage == "heads nan" else "inf")
    return save_hydra(heads, out)


def _drafts() -> list[Case]:
    from accel.drafts import DistillConfig, evaluate_draft
    from accel.drafts.early_exit import load_exit_head
    from accel.drafts.hydra.model import load_hydra

    text = ["def add(a, b):\n    return a + b\n" * 4]
    return [
        Case("eval-draft ok", lambda w: evaluate_draft(w.checkpoint, w.checkpoint, text, max_k=3), OK),
        Case(
            "eval-draft max_k 10**8",
            lambda w: evaluate_draft(w.checkpoint, w.checkpoint, text, max_k=10**8),
            DraftError,
        ),
        Case("eval-draft max_k 0", lambda w: evaluate_draft(w.checkpoint, w.checkpoint, text, max_k=0), DraftError),
        Case(
            "eval-draft temperature -1",
            lambda w: evaluate_draft(w.checkpoint, w.checkpoint, text, temperature=-1),
            DraftError,
        ),
        Case("eval-draft draft missing", lambda w: evaluate_draft(w.checkpoint, w.tmp / "nope", text), DraftError),
        Case("load_hydra ok", lambda w: load_hydra(_artefacts(w, "heads ok"), w.model), OK),
        Case("load_hydra nan weight", lambda w: load_hydra(_artefacts(w, "heads nan"), w.model), DraftError),
        Case("load_hydra inf weight", lambda w: load_hydra(_artefacts(w, "heads inf"), w.model), DraftError),
        Case("load_exit_head ok", lambda w: load_exit_head(_artefacts(w, "exit ok"), w.model), OK),
        Case(
            "load_exit_head truncated", lambda w: load_exit_head(_artefacts(w, "exit truncated"), w.model), DraftError
        ),
        Case("distill batch 10**8", lambda w: DistillConfig(batch_size=10**8), ValueError),
        Case("distill steps 0", lambda w: DistillConfig(max_steps=0), ValueError),
        Case("distill lr nan", lambda w: DistillConfig(lr=float("nan")), ValueError),
    ]


#: a folder where nothing can be created, even by root (sysfs refuses new entries): the "read-only folder" rows run
#: on Linux only, and without /sys they are left out rather than creating a folder at the file system's root
READ_ONLY = Path("/sys/accel-read-only") if Path("/sys/kernel").is_dir() else None


PLACES = ("under a file", "in a read-only folder") if READ_ONLY is not None else ("under a file",)


def _place(w: World, where: str) -> Path:
    """An output path no writer can use: under a regular file, or (on Linux) in a read-only folder."""
    return w.file / "out" if where == "under a file" else READ_ONLY / "out"  # type: ignore[operator]


def _blocked(w: World, name: str, inside: str) -> Path:
    """An existing output folder (outside ``w.tmp``) whose entry ``inside`` is a folder: a writer replacing that
    file fails after writing the others unless it checks first."""
    out = w.tmp.parent / "blocked" / name
    (out / inside).mkdir(parents=True, exist_ok=True)
    return out


def _outputs() -> list[Case]:
    """Every public writer into a path it cannot write: before, a raw ``NotADirectoryError``/``PermissionError``/
    ``IsADirectoryError`` from deep inside (and sometimes a half-written folder); now the writer's own error naming
    the path and what was being written, and nothing left behind."""
    from accel import save_compressed
    from accel.drafts import DistillConfig, distill
    from accel.drafts.checkpoint import save_torch_state
    from accel.drafts.early_exit import ExitHead, save_exit_head
    from accel.drafts.export_hf import export_hf_draft
    from accel.drafts.hydra.export import export_hydra
    from accel.drafts.hydra.model import build_hydra, save_hydra
    from accel.formats import compress_checkpoint, save_tensors
    from accel.models import load_tokenizer, save_pretrained
    from accel.superposed import NgramError, build_store
    from accel.superposed.corpus import self_written_texts

    def texts(w: World, cache: Path) -> Any:
        return self_written_texts(w.checkpoint, load_tokenizer(w.checkpoint), 2, gen_tokens=2, cache_dir=cache)

    writers: list[tuple[str, Callable[[World, Path], Any], type[BaseException]]] = [
        ("save_tensors", lambda w, p: save_tensors(p, {"a": X}), FormatError),
        ("save_compressed", lambda w, p: save_compressed(w.model, p), FormatError),
        ("compress_checkpoint", lambda w, p: compress_checkpoint(w.checkpoint, p, progress=False), FormatError),
        ("save_pretrained", lambda w, p: save_pretrained(w.model, p), ModelError),
        ("export_hf_draft", lambda w, p: export_hf_draft(w.model, p), DraftError),
        ("save_exit_head", lambda w, p: save_exit_head(ExitHead(w.model, 1, width=8), w.model, p), DraftError),
        ("save_hydra", lambda w, p: save_hydra(build_hydra(w.model, num_heads=2), p), DraftError),
        ("export_hydra", lambda w, p: export_hydra(build_hydra(w.model, num_heads=2), p, ctx_len=16), DraftError),
        ("save_torch_state", lambda w, p: save_torch_state({"step": 1}, p), DraftError),
        ("build_store", lambda w, p: build_store([np.arange(9)], 32, p), NgramError),
        ("self_written_texts cache", texts, NgramError),
        ("distill", lambda w, p: distill(w.checkpoint, p, DistillConfig(max_steps=1, progress=False)), DraftError),
    ]
    cases = [
        Case(f"{name} {where}", _write_to(write, where), error)
        for name, write, error in writers
        for where in PLACES
        if (name, where) != ("compress_checkpoint", "under a file")  # a FormatError already before
    ]
    return [
        *cases,
        Case("save_torch_state to a dir", lambda w: save_torch_state({"step": 1}, w.tmp), DraftError),
        Case("build_store to a dir", lambda w: build_store([np.arange(9)], 32, w.tmp), NgramError),
        Case(
            "save_pretrained over a config.json dir",
            lambda w: save_pretrained(w.model, _blocked(w, "ckpt", "config.json")),
            ModelError,
        ),
        Case(
            "save_exit_head over an exit_head.json dir",
            lambda w: save_exit_head(ExitHead(w.model, 1, width=8), w.model, _blocked(w, "exit", "exit_head.json")),
            DraftError,
        ),
        Case(
            "export_hydra over a folder of other files",
            lambda w: export_hydra(build_hydra(w.model, num_heads=2), _blocked(w, "mine", "notes"), ctx_len=16),
            DraftError,
        ),
    ]


def _write_to(write: Callable[[World, Path], Any], where: str) -> Callable[[World], Any]:
    """A table call: ``write`` into the unwritable place named ``where``."""
    return lambda w: write(w, _place(w, where))


_BUILT: dict[tuple[str, str], Path] = {}


def _built(w: World, kind: str, make: Callable[[Path], Path]) -> Path:
    """The intact artefact ``kind`` of ``w`` (made once, outside ``w.tmp``)."""
    key = (str(w.tmp), kind)
    if key not in _BUILT:
        _BUILT[key] = make(w.tmp.parent / "intact" / kind)
    return _BUILT[key]


def _damaged(w: World, kind: str, make: Callable[[Path], Path], damage: str, edit: Callable[[Path], Any]) -> Path:
    """A copy of the intact artefact ``kind`` (outside ``w.tmp``) with ``edit(copy)`` applied."""
    import shutil

    src = _built(w, kind, make)
    out = w.tmp.parent / "damaged" / kind / damage.replace(" ", "_")
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, out) if src.is_dir() else shutil.copyfile(src, out)
    edit(out)
    return out


def _edit_json(name: str, **changes: Any) -> Callable[[Path], None]:
    """An edit: set ``changes`` in the JSON file ``name`` of an artefact folder."""
    import json

    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        data.update(changes)
        (folder / name).write_text(json.dumps(data))

    return edit


def _edit_npy(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    """An edit: replace ``embed.npy`` of a Hydra export by ``change(its array)``."""

    def edit(folder: Path) -> None:
        np.save(folder / "embed.npy", change(np.load(folder / "embed.npy")))

    return edit


def _hydra_runtime_cases() -> list[Case]:
    """Exported Hydra heads (``HydraRuntime``) with a damaged ``embed.npy``, ``hydra.json`` or graph: before, a raw
    ``ValueError``/``EOFError`` from numpy, NaN log-probabilities, or fields cast without a word (``1.7`` heads ->
    1, ``"no"`` prefix -> True, an unknown weight mode); now a ``DraftError`` naming the file."""
    import shutil

    import torch

    from accel.drafts.hydra.export import export_hydra
    from accel.drafts.hydra.model import build_hydra
    from accel.drafts.hydra.runtime import HydraRuntime

    def make(w: World) -> Callable[[Path], Path]:
        heads = lambda: build_hydra(w.model, num_heads=2, prefix=True, head_ids=torch.arange(8))  # noqa: E731
        return lambda out: export_hydra(heads(), out, ctx_len=16)

    def run(damage: str, edit: Callable[[Path], Any]) -> Callable[[World], Any]:
        return lambda w: HydraRuntime(_damaged(w, "hydra", make(w), damage, edit), threads=1)

    def nan(e: np.ndarray) -> np.ndarray:
        e = e.copy()
        e[3, 5] = np.nan
        return e

    return [
        Case("HydraRuntime ok", run("ok", lambda d: None), OK),
        Case(
            "HydraRuntime embed truncated",
            run("truncated", lambda d: (d / "embed.npy").write_bytes((d / "embed.npy").read_bytes()[:200])),
            DraftError,
        ),
        Case("HydraRuntime embed empty", run("empty", lambda d: (d / "embed.npy").write_bytes(b"")), DraftError),
        Case("HydraRuntime embed nan", run("nan", _edit_npy(nan)), DraftError),
        Case("HydraRuntime embed float16", run("f16", _edit_npy(lambda e: e.astype(np.float16))), DraftError),
        Case("HydraRuntime meta num_heads 1.7", run("heads", _edit_json("hydra.json", num_heads=1.7)), DraftError),
        Case("HydraRuntime meta prefix 'no'", run("prefix", _edit_json("hydra.json", prefix="no")), DraftError),
        Case("HydraRuntime meta weights fp16", run("weights", _edit_json("hydra.json", weights="fp16")), DraftError),
        Case(
            "HydraRuntime meta head_vocab beyond its LM head",
            run("head_vocab", _edit_json("hydra.json", head_vocab=16)),
            DraftError,
        ),
        Case(
            "HydraRuntime meta kv_shape of another ctx",
            run("kv", _edit_json("hydra.json", kv_shape=[1, 2, 8, 8])),
            DraftError,
        ),
        Case(
            "HydraRuntime head1 is the LM head graph",
            run("swap", lambda d: shutil.copyfile(d / "lm_head.onnx", d / "head1.onnx")),
            DraftError,
        ),
    ]


def _readers() -> list[Case]:
    """Loaded artefacts through their checked readers: damaged Hydra exports, exit head cards, n-gram store headers,
    draft checkpoints holding NaN / Inf, and MX kernel graphs accel did not write."""
    return [*_hydra_runtime_cases(), *_card_store_draft_cases(), *_kernel_graph_cases()]


def _card_store_draft_cases() -> list[Case]:
    """Exit head cards with fields that were cast (``1.7`` -> layer 1), n-gram stores with an edited header (counts
    off without a word), and draft checkpoints with a NaN / +Inf weight (figures reported for them)."""
    import torch

    from accel.drafts import evaluate_draft
    from accel.drafts.early_exit import ExitHead, load_exit_head, save_exit_head
    from accel.drafts.export_hf import export_hf_draft
    from accel.models import load_checkpoint, save_pretrained
    from accel.superposed import NgramError, NgramStore, build_store

    def exit_head(damage: str, **card: Any) -> Callable[[World], Any]:
        def call(w: World) -> Any:
            make = lambda out: save_exit_head(ExitHead(w.model, 1, width=8), w.model, out)  # noqa: E731
            return load_exit_head(_damaged(w, "exit", make, damage, _edit_json("exit_head.json", **card)), w.model)

        return call

    def store(damage: str, **header: Any) -> Callable[[World], Any]:
        def call(w: World) -> Any:
            make = lambda out: build_store([np.arange(20) % 7, np.arange(9)], 32, out, max_order=3)  # noqa: E731
            return NgramStore.load(_damaged(w, "store", make, damage, lambda p: _edit_header(p, header)))

        return call

    def poisoned(w: World, value: float) -> Path:
        def make(out: Path) -> Path:
            model = load_checkpoint(w.checkpoint)
            with torch.no_grad():
                model.layers[0].mlp.up_proj.weight[0, 0] = value
            save_pretrained(model, out)
            (out / "tokenizer.json").write_bytes((w.checkpoint / "tokenizer.json").read_bytes())
            return out

        return _built(w, f"draft {value}", make)

    text = ["def add(a, b):\n    return a + b\n" * 4]
    return [
        Case("load_exit_head card ok", exit_head("ok"), OK),
        Case("load_exit_head layer 1.7", exit_head("layer", layer=1.7), DraftError),
        Case("load_exit_head layer true", exit_head("bool", layer=True), DraftError),
        Case("load_exit_head width '8'", exit_head("width", width="8"), DraftError),
        Case("load_exit_head width 10**9", exit_head("huge", width=10**9), DraftError),
        Case("NgramStore header ok", store("ok"), OK),
        Case("NgramStore vocab_size edited", store("vocab", vocab_size=16), NgramError),
        Case("NgramStore max_order edited", store("order", max_order=2), NgramError),
        Case(
            "eval-draft a nan draft",
            lambda w: evaluate_draft(w.checkpoint, poisoned(w, float("nan")), text, max_k=3),
            DraftError,
        ),
        Case(
            "export_hf_draft an inf draft",
            lambda w: export_hf_draft(poisoned(w, float("inf")), w.tmp / "hf"),
            DraftError,
        ),
    ]


def _edit_header(path: Path, changes: dict[str, Any]) -> None:
    """Set ``changes`` in the JSON header of the n-gram store at ``path`` (padding redone, checksums left as they
    were: what an edit by hand gives)."""
    import json

    from accel.superposed.store import ALIGN, MAGIC, read_header

    header, offset = read_header(path)
    data = path.read_bytes()[offset:]
    header.update(changes)
    text = json.dumps(header, sort_keys=True).encode()
    pad = -(-(16 + len(text)) // ALIGN) * ALIGN - 16 - len(text)
    path.write_bytes(MAGIC + len(text).to_bytes(8, "little") + text + b"\0" * pad + data)


def _kernel_graph_cases() -> list[Case]:
    """ONNX graphs with accel's fused MX kernel (``ai.accel::MXLinear``) that accel did not write: an unknown opset
    version, a format code that disagrees with the bit width, another format's value table. Before, onnxruntime ran
    them (logits off by ~8, or NaN); now ``OrtBackend`` refuses them. Left out where the kernel cannot be built."""
    from accel.backends import OrtBackend, export_onnx
    from accel.formats.mxkernel_build import load_kernel

    if load_kernel() is None:
        return []

    def graph(damage: str, edit: Callable[[Any], Any]) -> Callable[[World], Any]:
        def call(w: World) -> Any:
            import onnx

            def make(out: Path) -> Path:
                out.mkdir(parents=True)
                return export_onnx(w.model, out / "k.onnx", ctx_len=16, weights="mxfp6-kernel", progress=False).parent

            def damage_file(folder: Path) -> None:
                proto = onnx.load(str(folder / "k.onnx"))
                edit(proto)
                onnx.save(proto, str(folder / "k.onnx"))

            return OrtBackend(_damaged(w, "kernel", make, damage, damage_file) / "k.onnx")

        return call

    def opset(proto: Any) -> None:
        next(o for o in proto.opset_import if o.domain == "ai.accel").version = 2

    def attribute(name: str, value: int) -> Callable[[Any], None]:
        def edit(proto: Any) -> None:
            node = next(n for n in proto.graph.node if n.domain == "ai.accel")
            next(a for a in node.attribute if a.name == name).i = value

        return edit

    def table(proto: Any) -> None:
        from onnx import numpy_helper

        from accel.formats import get_format
        from accel.formats.mxkernel import code_table

        node = next(n for n in proto.graph.node if n.domain == "ai.accel")
        init = next(t for t in proto.graph.initializer if t.name == node.input[3])
        init.CopyFrom(numpy_helper.from_array(code_table(get_format("mxfp4")), init.name))

    return [
        Case("OrtBackend kernel graph ok", graph("ok", lambda p: None), OK),
        Case("OrtBackend kernel opset version 2", graph("opset", opset), BackendError),
        Case("OrtBackend kernel fast 2 on 6-bit codes", graph("fast", attribute("fast", 2)), BackendError),
        Case("OrtBackend kernel block 16", graph("block", attribute("block", 16)), BackendError),
        Case("OrtBackend kernel MXFP4 value table", graph("table", table), BackendError),
    ]


def all_cases() -> list[Case]:
    """Every case of the table, grouped by subpackage, then the output and artefact families."""
    return [
        *_formats(),
        *_compress(),
        *_models(),
        *_backends(),
        *_spd(),
        *_sim(),
        *_drafts(),
        *_outputs(),
        *_readers(),
    ]

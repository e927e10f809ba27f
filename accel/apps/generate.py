"""``accel generate``: speculative decoding from the command line (see docs/spd.md).

The flags are parsed into one ``DecodeSpec`` (``accel.apps.generate_flags``), or ``--spec FILE`` gives it whole (JSON or
YAML); ``accel.decode.build`` opens what it describes and ``accel.spd.generate`` decodes ``--prompt``.

``--target`` / ``--draft`` are HF-style checkpoint directories or llama.cpp ``.gguf`` files (``accel.models``), or,
with ``--backend ort``, ``.onnx`` files written by ``accel export`` (a checkpoint given with ``--backend ort`` is
exported once, streamed tensor by tensor, and cached in ``$ACCEL_CACHE/onnx``). The tokenizer is the target's:
``tokenizer.json`` next to it, or the ``.gguf`` file's own. Without ``--draft`` the target decodes autoregressively.
The text is streamed as rounds complete; tokens that were accepted from the draft are shown in green on a terminal,
in ``[brackets]`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from accel.apps.generate_flags import spec_from_args
from accel.apps.generate_options import check_generate_options
from accel.apps.ppd import add_arguments as add_ppd_arguments
from accel.apps.ppd import run_ppd
from accel.apps.printing import StreamPrinter, summary
from accel.backends.weights import WEIGHT_MODES
from accel.decode.build import WIDE_DRAFT_PARAMS, build
from accel.decode.files import find_tokenizer, model_config
from accel.decode.spec import ARSpec, ChainSpec, DecodeSpec, SamplingSpec, TargetSpec, load_spec
from accel.errors import SpdError

__all__ = ["register", "run"]

#: the flags a DecodeSpec holds (``--spec FILE`` replaces them all), and PPD's (not part of a spec yet)
_DECODE_FLAGS = (
    "target", "draft", "hydra", "eagle3", "k", "min_draft_prob", "ngram", "ngram_k", "ngram_merge", "tree_nodes",
    "tree_top_k", "tree_depth", "tree_min_prob", "tree_expand_prob", "max_new_tokens", "temperature", "top_k", "top_p",
    "greedy", "seed", "backend", "device", "dtype", "mx_weights", "ctx_len", "threads", "draft_threads",
    "draft_weights", "target_weights", "tokenizer", "ppd", "ppd_k", "exit_head", "autotune",
)  # fmt: skip


def _default(model: type[BaseModel], field: str) -> Any:
    """The spec's default of ``field``: the flag's default, so that flags and specs agree."""
    return model.model_fields[field].default


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``generate`` subcommand."""
    p = subparsers.add_parser(
        "generate", help="speculative decoding with a draft and a target model", description=__doc__
    )
    p.add_argument(
        "--spec",
        default=None,
        metavar="FILE",
        help="the whole decode as a DecodeSpec in a JSON or YAML file (accel.decode; docs/spd.md) instead of the "
        "flags below; --prompt and --json still apply",
    )
    p.add_argument(
        "--target", default=None, help="target checkpoint directory or .gguf file (or .onnx with --backend ort)"
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft checkpoint directory, .gguf file or .onnx (omit: autoregressive); a "
        "feature draft (accel.drafts.feature) is fed the target's hidden states",
    )
    p.add_argument("--prompt", required=True, help="prompt text (token ids separated by spaces if no tokenizer)")
    p.add_argument(
        "--k",
        type=int,
        default=None,
        help="draft tokens per round of a chain (--draft without a tree) or of lookup "
        f"(default {_default(ChainSpec, 'k')})",
    )
    p.add_argument(
        "--min-draft-prob",
        type=float,
        default=None,
        help="dynamic draft length: end a round's drafting after a proposal the draft gave less than "
        "this probability (--k is then the cap; default: always --k)",
    )
    p.add_argument(
        "--ngram",
        type=int,
        default=None,
        help="n-gram lookup drafts: when the last N tokens (or a shorter suffix, down to 2) occurred earlier "
        "in the text, propose what followed them instead of calling the draft (exact; default off; "
        "without --draft: lookup drafts only)",
    )
    p.add_argument("--ngram-k", type=int, default=None, help="tokens proposed from a lookup match (default --k)")
    p.add_argument(
        "--ngram-merge",
        action="store_true",
        help="with --ngram and a tree (--tree-nodes or --hydra): join lookup's chain into the tree every round "
        "(Merge; one target call verifies both) instead of using lookup instead of the tree where it matches",
    )
    p.add_argument(
        "--autotune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="size each round from this machine's measured costs and the run's acceptance (accel.spd.autotune): "
        "chain length or tree nodes up to --k / --tree-nodes, or no speculation where it loses; exact. Default: on "
        "with a draft, --hydra or --ngram unless --k, --tree-nodes, --tree-depth, --min-draft-prob or --ngram-k "
        "pins the shape; --no-autotune runs the given (or default) shape every round",
    )
    p.add_argument(
        "--tree-nodes",
        type=int,
        default=None,
        help="propose a dynamic token tree of up to N nodes per round (EAGLE-2 style; exact; default: a chain of "
        "--k). The target and draft are exported with tree inputs",
    )
    p.add_argument(
        "--hydra",
        default=None,
        metavar="DIR",
        help="Hydra heads directory (accel distill-hydra) instead of --draft: trees from the heads, one head call "
        "per level (shaped by --tree-nodes, default 4 (3 on a *-kernel target), --tree-top-k, --tree-min-prob and "
        "--tree-expand-prob; depth: the heads, at most 4). Add --ngram 3 --ngram-k 7 for lookup drafts where the "
        "text repeats (the most tokens per call measured with the shipped heads; --ngram-merge joins them into the "
        "heads' tree)",
    )
    p.add_argument(
        "--eagle3",
        default=None,
        metavar="DIR",
        help="an EAGLE-3 head in the speculators format (vLLM's draft library; docs/serving.md) instead of --draft: "
        "a chain of --k tokens (default 3), or a tree with --tree-nodes (and the --tree-* flags). The target must "
        "be the checkpoint it was trained for (directory or .gguf, --backend ort): it is exported once with the "
        "hidden states of the head's aux layers, and the head as an ONNX draft, both cached in $ACCEL_CACHE/onnx",
    )
    p.add_argument("--tree-top-k", type=int, default=None, help="candidates per expanded tree node (default 4)")
    p.add_argument("--tree-depth", type=int, default=None, help="most tree levels (default min(nodes, 8))")
    p.add_argument(
        "--tree-min-prob",
        type=float,
        default=None,
        help="dynamic tree: leave out (and do not expand) candidates whose cumulative draft probability is below "
        "this (default 0: always --tree-nodes nodes)",
    )
    p.add_argument(
        "--tree-expand-prob",
        type=float,
        default=None,
        help="dynamic tree: expand only candidates whose cumulative draft probability is at least this (default: "
        "--tree-min-prob)",
    )
    p.add_argument("--max-new-tokens", type=int, default=_default(DecodeSpec, "max_new_tokens"))
    p.add_argument("--temperature", type=float, default=_default(SamplingSpec, "temperature"))
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores temperature/top-k/top-p)")
    p.add_argument("--seed", type=int, default=_default(SamplingSpec, "seed"))
    p.add_argument("--backend", choices=("ort", "torch"), default=_default(TargetSpec, "backend"))
    p.add_argument(
        "--device",
        default=None,
        help="--backend torch: where weights and KV caches live (cpu, cuda or cuda:N; default cpu). On CUDA every "
        "call signature is captured once as a CUDA graph",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="--backend torch: weight and compute dtype (default: the checkpoint's; MX weights are decoded once)",
    )
    p.add_argument(
        "--mx-weights",
        choices=("packed", "decoded"),
        default=None,
        help="--backend torch, an accel-compressed target: keep its MX weights packed (6.25 bits a weight for MXFP6; "
        "on a GPU about 1/3 the speed of decoded weights) or decode them once at load (default: packed on the CPU in "
        "float32, where the fused CPU kernel runs them, decoded elsewhere)",
    )
    p.add_argument(
        "--ctx-len",
        type=int,
        default=None,
        help=f"KV-cache length in tokens of a checkpoint directory or .gguf target (default "
        f"{_default(TargetSpec, 'ctx_len')}; an .onnx file keeps its own)",
    )
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the target (torch: both models)")
    p.add_argument(
        "--draft-threads",
        type=int,
        default=None,
        help="onnxruntime intra-op threads of the draft (default: chosen from its size: 1 below "
        f"{WIDE_DRAFT_PARAMS // 10**6} M parameters, whose calls are too short to split; the target's --threads "
        "for a larger draft or a feature draft, whose matmuls are wide)",
    )
    p.add_argument(
        "--draft-weights",
        choices=WEIGHT_MODES,
        default=None,
        help="onnxruntime export of a draft checkpoint (the choices of accel export --weights), e.g. int8 or "
        "mxint8-nbits matmuls (an approximate draft; SpD stays exact). Default: int8 for a feature draft (~40%% "
        "cheaper calls) and Hydra heads (fp32 or int8 only), fp32 for a standalone draft (its narrow matmuls "
        "gain nothing)",
    )
    p.add_argument(
        "--target-weights",
        choices=WEIGHT_MODES,
        default=None,
        help="onnxruntime export of a target checkpoint (the choices of accel export --weights): fp32 "
        "(default; a .gguf file: gguf-kernel, its own Q8_0/Q4_0/Q4_1/K-quant/Q5 blocks on accel's fused kernel, "
        "exact), or "
        "e.g. mxint8-nbits / mxfp6-nbits / mxfp4-nbits (exact MX weights run by onnxruntime's "
        "8-bit MatMulNBits with int8 activations per block: about half the step time on CPU) or mxfp6-kernel / "
        "mxfp4-kernel / mxint8-kernel (the same weights packed, on accel's fused kernel with float32 activations; "
        "needs a C compiler), gguf-kernel-q8 (a .gguf file's blocks with int8 activations, as llama.cpp); see "
        "docs/backends.md",
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer.json, directory or .gguf (default: the target's)")
    add_ppd_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result (tokens and statistics) as JSON")
    p.set_defaults(func=run, flag_defaults={dest: p.get_default(dest) for dest in _DECODE_FLAGS})


def _spec_from_file(args: argparse.Namespace) -> DecodeSpec:
    """``--spec FILE``'s DecodeSpec; the flags it replaces must be left out."""
    given = [f"--{d.replace('_', '-')}" for d, v in args.flag_defaults.items() if getattr(args, d) != v]
    if given:
        raise SpdError(f"--spec {args.spec} holds the whole decode: drop {', '.join(given)} (or edit the spec)")
    return load_spec(args.spec)


def _prompt_ids(text: str, tokenizer, target: Path) -> list[int]:
    """``text`` encoded by ``tokenizer``, or read as token ids separated by spaces when there is none."""
    if tokenizer is not None:
        ids = tokenizer.encode(text).ids
    else:
        try:
            ids = [int(x) for x in text.split()]
        except ValueError:
            raise SpdError(f"no tokenizer found for {target}: give --tokenizer, or the prompt as token ids") from None
    if not ids:
        raise SpdError("the prompt encodes to no tokens")
    return ids


def _run_ppd(args: argparse.Namespace) -> int:
    """``accel generate --ppd E`` (``accel.apps.ppd``: PPD is not a proposer of a DecodeSpec yet)."""
    check_generate_options(args)
    if args.target is None:
        raise SpdError("give --target (a checkpoint directory for --ppd)")
    target = Path(args.target)
    tokenizer = find_tokenizer(Path(args.tokenizer) if args.tokenizer else None, target)
    prompt = _prompt_ids(args.prompt, tokenizer, target)
    eos = model_config(target).get("eos_token_id")
    with tempfile.TemporaryDirectory(prefix="accel-generate-") as tmp:
        return run_ppd(args, prompt, tokenizer, eos, Path(tmp))


def autotune_line(spec: DecodeSpec, proposer: object) -> str:
    """What the controller chose and why (e.g. ``"autotune: 4 nodes: 2.31 tokens/call, 1.21x call cost"``), or
    why it was off; empty for autoregressive decoding."""
    describe = getattr(proposer, "describe", None)
    if spec.autotune and describe is not None:
        return f"autotune: {describe()}"
    if isinstance(spec.proposer, ARSpec):
        return ""
    pinned = spec.pinned_shape()
    why = f"{', '.join(pinned)} pins the shape" if pinned else "--no-autotune"
    return f"autotune: off ({why}; every round proposes the same shape)"


def run(args: argparse.Namespace) -> int:
    """Run ``accel generate``; returns the exit code."""
    if args.spec is not None:
        spec = _spec_from_file(args)
    elif args.ppd is not None:
        return _run_ppd(args)
    elif args.target is None:
        raise SpdError("give --target (a checkpoint directory, .gguf or .onnx file) or --spec FILE")
    else:
        spec = spec_from_args(args)
    tokenizer = find_tokenizer(spec.tokenizer, spec.target.path)
    prompt = _prompt_ids(args.prompt, tokenizer, spec.target.path)
    setup = build(spec, tokenizer)
    printer = None if args.json else StreamPrinter(tokenizer)
    if printer is not None:  # echoed once everything is loaded: a bad draft or heads dir prints only its error
        sys.stdout.write(args.prompt if tokenizer is not None else " ".join(map(str, prompt)))
    res = setup.generate([prompt], stream=printer)
    if args.json:
        print(json.dumps(res.model_dump(mode="json"), indent=2))
    else:
        print("\n" + summary(res.stats, res.messages))
        line = autotune_line(spec, setup.proposer)
        if line:
            print(line)
    return 0

"""``accel generate``: speculative decoding from the command line (see docs/spd.md).

``--target`` / ``--draft`` are HF-style checkpoint directories or llama.cpp ``.gguf`` files (``accel.models``), or,
with ``--backend ort``, ``.onnx`` files written by ``accel export`` (a checkpoint given with ``--backend ort`` is
exported once, streamed tensor by tensor, and cached in ``$ACCEL_CACHE/onnx``). The tokenizer is the target's:
``tokenizer.json`` next to it, or the ``.gguf`` file's own. Without ``--draft`` the target decodes autoregressively.
The text is streamed as rounds complete; tokens that were accepted from the draft are shown in green on a terminal,
in ``[brackets]`` otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from accel.backends.weights import WEIGHT_MODES
from accel.errors import AccelError, BackendError, SpdError
from accel.spd.options import check_generate_options
from accel.spd.ppd_cli import add_arguments as add_ppd_arguments

__all__ = ["register", "run"]

_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``generate`` subcommand."""
    p = subparsers.add_parser(
        "generate", help="speculative decoding with a draft and a target model", description=__doc__
    )
    p.add_argument(
        "--target", required=True, help="target checkpoint directory or .gguf file (or .onnx with --backend ort)"
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft checkpoint directory, .gguf file or .onnx (omit: autoregressive); a "
        "feature draft (accel.drafts.feature) is fed the target's hidden states",
    )
    p.add_argument("--prompt", required=True, help="prompt text (token ids separated by spaces if no tokenizer)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (default 4)")
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
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores temperature/top-k/top-p)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("ort", "torch"), default="ort")
    p.add_argument("--ctx-len", type=int, default=512, help="KV-cache length in tokens (checkpoint directories)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the target (torch: both models)")
    p.add_argument(
        "--draft-threads",
        type=int,
        default=None,
        help="onnxruntime intra-op threads of the draft (default: chosen from its size: 1 below "
        f"{_WIDE_DRAFT_PARAMS // 10**6} M parameters, whose calls are too short to split; the target's --threads "
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
        default="fp32",
        help="onnxruntime export of a target checkpoint (the choices of accel export --weights): fp32 "
        "(default), or e.g. mxint8-nbits / mxfp6-nbits / mxfp4-nbits (exact MX weights run by onnxruntime's "
        "8-bit MatMulNBits with int8 activations per block: about half the step time on CPU) or mxfp6-kernel / "
        "mxfp4-kernel / mxint8-kernel (the same weights packed, on accel's fused kernel with float32 activations; "
        "needs a C compiler); see docs/backends.md",
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer.json, directory or .gguf (default: the target's)")
    add_ppd_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result (tokens and statistics) as JSON")
    p.set_defaults(func=run)


#: drafts with at least this many parameters get the target's threads by default. Measured (benchmarks/draft_threads.py,
#: RESULTS.md): the shipped 9 M draft runs best on 1 thread; random drafts of 28 M, 61 M and 135 M parameters beside a
#: 1.7B target gave 1.07-1.10x the SpD tokens/s on 2 threads, and a 0.5B draft 1.46x.
_WIDE_DRAFT_PARAMS = 20_000_000


def _is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


@functools.lru_cache(maxsize=4)
def _model_config(path: Path) -> dict[str, Any]:
    """The HF config of a checkpoint directory or ``.gguf`` file, or the one recorded in an exported ONNX file."""
    if _is_gguf(path):
        from accel.models.gguf_loader import open_gguf

        return open_gguf(path)[0].to_hf()
    if path.is_dir():
        cfg = path / "config.json"
        text, where = (cfg.read_text(errors="replace"), str(cfg)) if cfg.is_file() else ("{}", "")
    elif path.suffix == ".onnx" and path.is_file():
        import onnx

        try:
            meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        except Exception as exc:  # protobuf DecodeError: a corrupt or truncated file
            raise BackendError(f"{path} is not a readable ONNX file: {type(exc).__name__}: {exc}") from exc
        text, where = meta.get("accel.model_config", "{}"), f"{path} (metadata accel.model_config)"
    else:
        return {}
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise SpdError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise SpdError(f"{where}: must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def _onnx_metadata(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file ({} when unreadable: OrtBackend then reports the file)."""
    import onnx

    try:
        return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    except Exception:  # protobuf DecodeError
        return {}


def _draft_threads(args: argparse.Namespace, feature_draft: bool) -> int | None:
    """Default onnxruntime threads of the draft: the target's for a feature draft or one of at least
    ``_WIDE_DRAFT_PARAMS`` parameters, else 1."""
    if feature_draft:
        return args.threads
    cfg = _model_config(Path(args.draft))
    if not cfg:
        return 1
    from accel.sim.models import from_hf_config

    try:
        params = from_hf_config(cfg).num_params
    except (AccelError, ValueError, KeyError, TypeError):  # an architecture the simulator does not describe
        return 1
    return args.threads if params >= _WIDE_DRAFT_PARAMS else 1


def _open_backend(
    path: Path,
    kind: str,
    ctx_len: int,
    threads: int | None,
    tmp: Path,
    hidden_output: bool = False,
    weights: str = "fp32",
    tree: bool = False,
):
    if not path.exists():
        raise SpdError(f"no model at {path}: give a checkpoint directory, a .gguf file or an .onnx file")
    if kind == "torch":
        if not (path.is_dir() or _is_gguf(path)):
            raise SpdError(f"--backend torch needs a checkpoint directory or a .gguf file; got {path}")
        from accel.backends import TorchBackend
        from accel.backends.torch_mx import pack_compressed
        from accel.models import load_checkpoint

        model = load_checkpoint(path)
        if path.is_dir():  # an accel-compressed checkpoint keeps its MX weights packed (the fused kernel)
            pack_compressed(model, path)
        return TorchBackend(model, ctx_len=ctx_len, batch_size=1, threads=threads)
    from accel.backends import OrtBackend

    if path.is_dir() or _is_gguf(path):  # exported once per checkpoint and ctx_len, cached in $ACCEL_CACHE/onnx
        from accel.backends import export_cached
        from accel.models.smollm2 import cache_root

        path = export_cached(
            path,
            cache_root() / "onnx",
            ctx_len=ctx_len,
            hidden_output=hidden_output,
            weights=weights,
            tree=tree,
            say=lambda line: print(line, file=sys.stderr, flush=True),
            progress=True,
        )
    if path.suffix != ".onnx":
        raise SpdError(f"--backend ort needs an .onnx file, a .gguf file or a checkpoint directory; got {path}")
    import time

    from accel.models.smollm2 import cache_root

    # a graph that decodes packed MX weights in the graph spends most of its session creation folding them: keep
    # onnxruntime's optimized graph (accel.backends.ort_session); other graphs gain too little for a second copy
    packed = _onnx_metadata(path).get("accel.weights") == "mx-packed"
    t0 = time.perf_counter()
    backend = OrtBackend(path, batch_size=1, threads=threads, optimized_dir=cache_root() / "ort" if packed else None)
    if time.perf_counter() - t0 > 2:  # large graphs: onnxruntime's optimizations take seconds, say where time went
        print(f"onnxruntime session for {path.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return backend


def _find_tokenizer(args: argparse.Namespace, target: Path):
    candidates = [Path(args.tokenizer)] if args.tokenizer else [target if target.is_dir() else target.parent]
    if _is_gguf(candidates[0]):  # the tokenizer stored in the GGUF file
        from accel.models.smollm2 import load_tokenizer

        return load_tokenizer(candidates[0])
    if not args.tokenizer and _is_gguf(target):
        from accel.models.smollm2 import load_tokenizer

        return load_tokenizer(target)
    for c in candidates:
        if (c / "tokenizer.json").is_file() or (c.is_file() and c.suffix == ".json"):
            try:
                from accel.models.smollm2 import load_tokenizer
            except ImportError:  # accel.models needs torch; fall back to tokenizers directly
                from tokenizers import Tokenizer

                return Tokenizer.from_file(str(c / "tokenizer.json" if c.is_dir() else c))
            return load_tokenizer(c)
    if args.tokenizer:
        raise SpdError(f"no tokenizer.json at {args.tokenizer} (give a tokenizer.json, its directory or a .gguf)")
    return None


class _Printer:
    """Streams decoded text; draft-accepted tokens in green (TTY) or [brackets] (pipe)."""

    def __init__(self, tokenizer, out=None) -> None:
        self.tok, self.out = tokenizer, out if out is not None else sys.stdout
        self.color = self.out.isatty()
        self.ids: list[int] = []
        self.text = ""

    def _piece(self, token: int) -> str:
        if self.tok is None:
            return f" {token}"
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        piece = text[len(self.text) :] if text.startswith(self.text) else text
        self.text = text
        return piece

    def __call__(self, row: int, tokens: list[int], from_draft: list[bool]) -> None:
        for t, d in zip(tokens, from_draft, strict=True):
            piece = self._piece(int(t))
            if d:
                piece = f"{_GREEN}{piece}{_RESET}" if self.color else f"[{piece}]"
            self.out.write(piece)
        self.out.flush()


def _summary(stats, messages: list[str]) -> str:
    s = stats
    lines = [
        f"mode {s.mode}  k {s.k}  new tokens {s.new_tokens}  rounds {s.rounds}  "
        f"tokens/target call {s.tokens_per_target_call:.2f}",
        f"tokens/s {s.tokens_per_s:.1f} (decode {s.decode_tokens_per_s:.1f})  wall {s.wall_s:.3f} s = "
        f"draft {s.draft_s:.3f} + target {s.target_s:.3f} + host {s.host_s:.3f}  (prefill {s.prefill_s:.3f})",
    ]
    if s.mode == "spd":
        lines.insert(0, f"proposer {s.proposer}")
        per_pos = " ".join(f"{a:.2f}" for a in s.acceptance_per_position)
        lines.append(
            f"alpha {s.alpha_counts:.3f} (counts), {s.alpha_overlap:.3f} (sum min(p,q))  "
            f"accepted histogram {s.accepted_histogram}  per position [{per_pos}]  "
            f"calls: draft {s.draft_calls}, target {s.target_calls}"
        )
        lines.append(
            f"loops: {s.mean_tokens_per_loop:.3f} tokens and {s.mean_drafts_per_loop:.3f} drafts per loop, "
            f"{s.all_accepted_rounds}/{s.row_calls} all accepted (accel predict --tokens-per-loop / "
            "--drafts-per-loop take these)"
        )
        if s.tree_rounds:
            ranks = _rank_rates(s)
            lines.append(
                f"trees: {s.tree_rounds}/{s.row_calls} rounds branched; {s.mean_drafts_per_loop:.2f} nodes and "
                f"{s.mean_target_call_tokens:.2f} target tokens per call; {s.draft_calls_per_loop:.2f} draft calls "
                f"of {s.mean_draft_tokens_per_call:.2f} tokens per loop; acceptance by sibling rank "
                f"[{' '.join(f'{a:.2f}' for a in ranks)}]"
            )
            lines.append(
                f"(the tree round's shape for accel.sim: nodes {round(s.mean_drafts_per_loop)}, acceptance by rank "
                f"{','.join(f'{a:.3f}' for a in ranks)}, draft calls per loop {s.draft_calls_per_loop:.3f}, "
                f"draft tokens per call {s.mean_draft_tokens_per_call:.3f})"
            )
        if s.lookup_rounds:
            lines.append(
                f"n-gram lookup: {s.lookup_rounds}/{s.row_calls} loops drafted by lookup, "
                f"{s.lookup_accepted} of their drafts accepted; {s.draft_calls_per_loop:.3f} draft calls per "
                f"loop (accel predict --draft-calls-per-loop {s.draft_calls_per_loop:.3f} --lookup-fraction "
                f"{s.lookup_rounds / s.row_calls:.3f})"
            )
    lines += [f"note: {m}" for m in messages]
    return "\n".join(lines)


def _rank_rates(stats) -> list[float]:
    """Per sibling rank, pooled over depths: the probability that the rank-r candidate is the target's token at a
    reached node (``accel.sim``'s per-rank acceptance). The counts give the rate conditional on every earlier rank
    having missed (verification tries ranks in order); ``accel.sim.rank_acceptance_from_counts`` converts it."""
    from accel.sim import rank_acceptance_from_counts

    avail = np.asarray(stats.rank_available, dtype=float).sum(axis=0)
    acc = np.asarray(stats.rank_accepted, dtype=float).sum(axis=0)
    if avail.size == 0 or not avail.any():
        return []
    return [float(x) for x in rank_acceptance_from_counts([avail], [acc])[0]]


def _proposer(args: argparse.Namespace, draft) -> list | None:
    """The proposers the options ask for: n-gram lookup first, then the draft's tree or chain."""
    from accel.spd import DraftChain, DraftTree, NgramLookup

    parts: list = []
    if args.ngram:
        parts.append(NgramLookup(args.ngram, args.ngram_k or args.k))
    if draft is not None and args.tree_nodes:
        parts.append(
            DraftTree(
                draft,
                nodes=args.tree_nodes,
                top_k=args.tree_top_k or 4,
                depth=args.tree_depth,
                min_prob=args.tree_min_prob or 0.0,
                expand_prob=args.tree_expand_prob,
            )
        )
    elif draft is not None:
        parts.append(DraftChain(draft, k=args.k, min_draft_prob=args.min_draft_prob))
    return parts or None


def run(args: argparse.Namespace) -> int:
    """Run ``accel generate``; returns the exit code."""
    from accel.spd import Sampling, check_compatible, generate

    check_generate_options(args)
    target_path = Path(args.target)
    tokenizer = _find_tokenizer(args, target_path)
    if tokenizer is not None:
        prompt = tokenizer.encode(args.prompt).ids
    else:
        try:
            prompt = [int(x) for x in args.prompt.split()]
        except ValueError:
            raise SpdError(
                f"no tokenizer found for {target_path}: give --tokenizer, or the prompt as token ids"
            ) from None
    if not prompt:
        raise SpdError("the prompt encodes to no tokens")
    eos = _model_config(target_path).get("eos_token_id")
    if args.hydra and args.draft:
        raise SpdError("give --draft or --hydra, not both")
    if args.tree_nodes is not None and not (args.draft or args.hydra):
        raise SpdError("--tree-nodes needs a draft model (--draft) or Hydra heads (--hydra) to build the trees with")
    if args.ngram_merge and not (args.ngram and (args.hydra or (args.draft and args.tree_nodes))):
        raise SpdError("--ngram-merge joins lookup into a tree: give --ngram and --tree-nodes with --draft, or --hydra")
    if args.hydra:  # the heads' tree options are checked before the target is exported
        from accel.drafts.hydra.cli import hydra_tree_shape

        hydra_tree_shape(args)
    with tempfile.TemporaryDirectory(prefix="accel-generate-") as tmp:
        if args.ppd is not None:
            from accel.spd.ppd_cli import run_ppd

            return run_ppd(args, prompt, tokenizer, eos, Path(tmp))
        # a feature draft (EAGLE-style) reads the target's hidden states: export the target with that output
        feature_draft = bool(args.draft and _model_config(Path(args.draft)).get("accel_feature_size"))
        if args.target_weights != "fp32" and (args.backend != "ort" or target_path.suffix == ".onnx"):
            raise SpdError(
                "--target-weights applies to a target checkpoint (directory or .gguf) on --backend ort (an .onnx "
                "file keeps the weights it was exported with)"
            )
        target = _open_backend(
            target_path,
            args.backend,
            args.ctx_len,
            args.threads,
            Path(tmp),
            hidden_output=feature_draft or bool(args.hydra),
            weights=args.target_weights,
            tree=bool(args.tree_nodes) or bool(args.hydra),
        )
        draft = None
        if args.draft:
            draft_path = Path(args.draft)
            threads = args.draft_threads if args.draft_threads is not None else _draft_threads(args, feature_draft)
            if args.backend != "ort":
                threads = args.threads  # torch threads are global
            weights = args.draft_weights or ("int8" if feature_draft else "fp32")
            draft = _open_backend(
                draft_path, args.backend, args.ctx_len, threads, Path(tmp), weights=weights, tree=bool(args.tree_nodes)
            )
            draft_tok = _find_tokenizer(argparse.Namespace(tokenizer=None), draft_path) if tokenizer else None
            check_compatible(target, draft, tokenizer, draft_tok)
        proposers = _proposer(args, draft)
        if args.hydra:
            from accel.drafts.hydra.cli import hydra_proposer

            proposers = [*(proposers or []), hydra_proposer(args, target_path)]
        if args.ngram_merge and proposers is not None:
            from accel.spd import Merge

            proposers = [Merge(*proposers)]
        printer = None if args.json else _Printer(tokenizer)
        if printer is not None:  # echoed once everything is loaded: a bad draft or heads dir prints only its error
            sys.stdout.write(args.prompt if tokenizer is not None else " ".join(map(str, prompt)))
        res = generate(
            target,
            proposers,
            [prompt],
            max_new_tokens=args.max_new_tokens,
            sampling=Sampling(args.temperature, args.top_k, args.top_p, args.greedy),
            seed=args.seed,
            eos_token_id=eos,
            stream=printer,
        )
    if args.json:
        print(json.dumps(res.model_dump(mode="json"), indent=2))
    else:
        print("\n" + _summary(res.stats, res.messages))
    return 0

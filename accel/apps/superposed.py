"""``accel ngrams build`` (an n-gram store from text) and ``accel complete`` (k suggestions by Superposed Decoding,
against k nucleus samples). See docs/superposed.md."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from accel.errors import SuperposedError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``ngrams`` and ``complete`` subcommands."""
    p = subparsers.add_parser("ngrams", help="n-gram stores for Superposed Decoding", description=__doc__)
    sub = p.add_subparsers(dest="ngrams_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="count the n-grams of text into a store file")
    b.add_argument("paths", nargs="*", metavar="PATH", help="UTF-8 text files, or directories of them")
    b.add_argument("-o", "--out", required=True, help="store file to write")
    b.add_argument("--stdlib", action="store_true", help="add the Python standard library's source (code)")
    b.add_argument("--self-written", type=int, default=0, metavar="N", help="add N continuations the target writes")
    b.add_argument(
        "--shards",
        nargs="+",
        default=[],
        metavar="SHARD",
        help="add target-written token rows: distill-data *.safetensors shards or folders of them",
    )
    b.add_argument(
        "--exclude-held-out",
        action="store_true",
        help="drop shard rows that contain a held-out evaluation prompt (accel.drafts.HELD_OUT_PROMPTS)",
    )
    b.add_argument("--target", default=None, help="target checkpoint directory (default: SmolLM2-135M)")
    b.add_argument("--tokenizer", default=None, help="tokenizer.json or directory (default: the target's)")
    b.add_argument("--max-order", type=int, default=6, help="longest n-gram counted (default 6)")
    b.add_argument("--max-bytes", type=int, default=50_000_000, help="text read per source, bytes (default 50 MB)")
    b.add_argument("--max-tokens", type=int, default=None, help="corpus size limit, tokens (default 30 M)")
    b.set_defaults(func=run_build)

    c = subparsers.add_parser(
        "complete", help="k suggestions from one pass per token (Superposed Decoding)", description=__doc__
    )
    c.add_argument("--prompt", required=True)
    c.add_argument("--k", type=int, default=3, help="suggestions (default 3)")
    c.add_argument("--max-new-tokens", type=int, default=16)
    c.add_argument("--store", default=None, help="n-gram store (accel ngrams build); default: none (alpha unused)")
    c.add_argument(
        "--settings",
        choices=("tuned", "paper"),
        default="tuned",
        help="n-gram settings: tuned for a store of the target's own writing (default) or the paper's",
    )
    c.add_argument("--alpha", type=float, default=None, help="n-gram weight (default: the settings')")
    c.add_argument("--no-match-logprob", type=float, default=None, help="n-gram log-prob where none matches, nats")
    c.add_argument("--temperature", type=float, default=0.06, help="on the superposed logits (default 0.06)")
    c.add_argument("--n-token-sample", type=int, default=9, help="tokens per draft and step (default 9)")
    c.add_argument("--target", default=None, help="checkpoint directory (default: SmolLM2-135M)")
    c.add_argument("--backend", choices=("ort", "torch"), default="ort")
    c.add_argument("--ctx-len", type=int, default=256, help="KV-cache length, tokens")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--no-nucleus", action="store_true", help="skip the k nucleus samples it is compared against")
    c.add_argument("--top-p", type=float, default=0.9, help="of the nucleus samples (default 0.9)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.set_defaults(func=run_complete)


def _target(path: str | None) -> Path:
    if path is not None:
        p = Path(path)
        if not (p / "config.json").is_file():
            raise SuperposedError(f"no checkpoint directory (config.json) at {p}")
        return p
    from accel.models.smollm2 import smollm2_checkpoint

    return smollm2_checkpoint()


def run_build(args: argparse.Namespace) -> int:
    """``accel ngrams build``: tokenize the sources and write the store; returns the exit code."""
    from accel.models.smollm2 import load_tokenizer
    from accel.superposed import NgramStore, build_store
    from accel.superposed.build import DEFAULT_MAX_TOKENS
    from accel.superposed.corpus import tokenizer_fingerprint

    if not (args.paths or args.stdlib or args.self_written or args.shards):
        raise SuperposedError("no corpus: give text files/directories, --stdlib, --self-written N and/or --shards")
    target = _target(args.target) if (args.target or args.self_written or not args.tokenizer) else None
    tok = load_tokenizer(args.tokenizer or str(target))
    vocab = json.loads((target / "config.json").read_text())["vocab_size"] if target else tok.get_vocab_size()
    docs, sources = _corpus(args, tok, target, vocab)
    meta = {"sources": sources, "tokenizer": tokenizer_fingerprint(tok)}
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS
    out = build_store(docs, vocab, args.out, max_order=args.max_order, meta=meta, max_tokens=max_tokens)
    store = NgramStore.load(out, verify=False)
    print(f"wrote {out}: {store.positions} tokens, orders 1..{store.max_order}, {out.stat().st_size} bytes")
    for s in sources:
        print(f"  {s}")
    return 0


def _corpus(args: argparse.Namespace, tok: Any, target: Path | None, vocab: int) -> tuple[Iterable, list[str]]:
    """The documents (token id arrays) of every source ``accel ngrams build`` was given, and their descriptions."""
    from accel.superposed.corpus import (
        drop_containing,
        self_written_texts,
        stdlib_files,
        teacher_shards,
        tokenize_texts,
        user_text_files,
    )

    texts, sources = [], []
    if args.paths:
        t, desc = user_text_files(args.paths, args.max_bytes)
        texts += t
        sources.append(desc)
    if args.stdlib:
        t, desc = stdlib_files(args.max_bytes)
        texts += t
        sources.append(desc)
    if args.self_written:
        from accel.models.smollm2 import cache_root

        assert target is not None
        t, desc = self_written_texts(target, tok, args.self_written, cache_dir=cache_root() / "texts")
        texts += t
        sources.append(desc)
    shard_docs: list = []
    if args.shards:
        shard_docs, desc = teacher_shards(args.shards, vocab)
        if args.exclude_held_out:
            from accel.drafts.prompts import HELD_OUT_PROMPTS

            shard_docs, dropped = drop_containing(shard_docs, [tok.encode(p).ids for p in HELD_OUT_PROMPTS])
            desc += f"; {dropped} rows holding a held-out prompt dropped"
        sources.append(desc)
    return itertools.chain(tokenize_texts(texts, tok), shard_docs), sources


def _open(args: argparse.Namespace, target: Path):
    if args.backend == "torch":
        from accel.backends import TorchBackend
        from accel.models import load_checkpoint

        return TorchBackend(load_checkpoint(target), ctx_len=args.ctx_len, batch_size=1, threads=args.threads)
    from accel.backends import OrtBackend, export_cached
    from accel.models.smollm2 import cache_root

    path = export_cached(target, cache_root() / "onnx", ctx_len=args.ctx_len, mix_inputs=True)
    return OrtBackend(path, batch_size=1, threads=args.threads)


def run_complete(args: argparse.Namespace) -> int:
    """``accel complete``: k superposed suggestions (and k nucleus samples); returns the exit code."""
    from accel.models.smollm2 import load_tokenizer
    from accel.superposed import NgramStore, SuperposedConfig
    from accel.superposed.corpus import tokenizer_fingerprint
    from accel.superposed.evaluate import compare
    from accel.superposed.scoring import TUNED

    target = _target(args.target)
    tok = load_tokenizer(target)
    base = TUNED if args.settings == "tuned" else SuperposedConfig()
    over = {"alpha": args.alpha, "no_match_logprob": args.no_match_logprob}
    cfg = dataclasses.replace(
        base,
        k=args.k,
        temperature=args.temperature,
        n_token_sample=args.n_token_sample,
        **{name: v for name, v in over.items() if v is not None},
    )
    store = None
    if args.store:
        store = NgramStore.load(args.store)
        fp = store.meta.get("tokenizer")
        if fp is not None and fp != tokenizer_fingerprint(tok):
            raise SuperposedError(f"{args.store} was built with another tokenizer than {target}'s")
    prompt = tok.encode(args.prompt).ids
    if not prompt:
        raise SuperposedError("the prompt encodes to no tokens")
    backend = _open(args, target)
    if args.no_nucleus:
        from accel.superposed.decode import superposed_generate
        from accel.superposed.evaluate import Completions, distinct_n, perplexity

        res = superposed_generate(backend, [prompt], args.max_new_tokens, cfg, store)
        drafts = [d.tokens for d in res.drafts[0]]
        ppls = [perplexity(backend, prompt, d) for d in drafts]
        wall = res.prefill_s + res.decode_s
        comps = [
            Completions(
                "superposed",
                drafts,
                ppls,
                distinct_n(drafts, 1),
                distinct_n(drafts, 2),
                wall,
                res.calls + res.prefill_calls,
            )
        ]
    else:
        c = compare(backend, prompt, args.max_new_tokens, cfg, store, top_p=args.top_p, seed=args.seed)
        comps = [c.superposed, c.nucleus]
    if args.json:
        print(json.dumps([_as_dict(m, tok) for m in comps], indent=2))
        return 0
    for m in comps:
        print(
            f"{m.method}: {m.wall_s * 1e3:.1f} ms, {m.calls} model calls, mean perplexity {m.mean_perplexity:.2f}, "
            f"distinct-2 {m.distinct_2:.2f}"
        )
        for i, (d, ppl) in enumerate(zip(m.drafts, m.perplexities, strict=True)):
            print(f"  {i + 1}. {args.prompt}{tok.decode(d)!r}  (ppl {ppl:.2f})")
    if len(comps) == 2:
        print(f"time superposed/nucleus {comps[0].wall_s / comps[1].wall_s:.2f}x")
    return 0


def _as_dict(m: Any, tok: Any) -> dict[str, Any]:
    return {
        "method": m.method,
        "texts": [tok.decode(d) for d in m.drafts],
        "tokens": m.drafts,
        "perplexities": m.perplexities,
        "distinct_1": m.distinct_1,
        "distinct_2": m.distinct_2,
        "wall_s": m.wall_s,
        "calls": m.calls,
    }

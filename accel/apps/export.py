"""``accel export MODEL -o OUT.onnx``: export a checkpoint (HF directory, accel-compressed directory or .gguf) to ONNX
with the KV-cache contract, optionally with the Cloud AI 100 compile files."""

from __future__ import annotations

import argparse
from pathlib import Path

from accel.backends.weights import WEIGHT_MODES as _WEIGHT_MODES


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    p = subparsers.add_parser(
        "export", help="export a checkpoint to ONNX (KV cache in/out, dynamic seq_len)", description=__doc__
    )
    p.add_argument("model", metavar="MODEL", help="checkpoint directory (config.json + weights) or a .gguf file")
    p.add_argument("-o", "--out", required=True, metavar="OUT.onnx", help="output ONNX file")
    p.add_argument("--weights", choices=_WEIGHT_MODES, default="fp32", help="weight storage (default fp32)")
    p.add_argument(
        "--fmt",
        default=None,
        help="MX element format for mx-rounded / mx-packed of an uncompressed model (default mxfp6; the *-nbits and "
        "*-kernel weights fix their own, a compressed model keeps its own)",
    )
    p.add_argument(
        "--float-weights",
        choices=("fp32", "fp16"),
        default="fp32",
        help="MX modes: storage of the weights left float (embeddings, norms, lm_head; default fp32)",
    )
    p.add_argument(
        "--nbits-accuracy",
        type=int,
        choices=(1, 4),
        default=4,
        help="*-nbits modes: MatMulNBits activations, 4 = int8 per block (fast, default), 1 = float32 (slow)",
    )
    p.add_argument("--ctx-len", type=int, default=512, help="KV-cache length in tokens (default 512)")
    p.add_argument("--batch-size", type=int, default=1, help="rows per call (default 1)")
    p.add_argument(
        "--num-logits", type=int, default=None, help="return only the last N logits (default: all positions)"
    )
    p.add_argument(
        "--external-data",
        action="store_true",
        help="weights in OUT.onnx.data even for a small model (default: above 64 MiB of float32 weights)",
    )
    p.add_argument(
        "--tree", action="store_true", help="add the token-tree inputs slot_ids and tree_mask (docs/backends.md)"
    )
    p.add_argument(
        "--ort-ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="RMSNorm + residual and RoPE as onnxruntime's fused CPU operators (faster on onnxruntime; not readable by "
        "Cloud AI 100). Default: on for int8, the *-nbits and *-kernel weights, off for the others",
    )
    p.add_argument(
        "--accel-attention",
        action="store_true",
        help="each layer's RoPE, cache write and attention as one ai.accel::CacheAttention node (accel's kernel "
        "library; onnxruntime only, turns --ort-ops on): attends only the slots each token sees",
    )
    p.add_argument("--qaic-dir", default=None, metavar="DIR", help="also write Cloud AI 100 compile files here")
    p.add_argument("--prompt-len", type=int, default=32, help="qaic prefill specialization length (default 32)")
    p.add_argument("--k", type=int, default=7, help="qaic draft length K; decode specialization is K+1 (default 7)")
    p.add_argument(
        "--tree-nodes", type=int, default=None, help="qaic: also compile tree calls of N tokens (needs --tree)"
    )
    p.add_argument("--num-cores", type=int, default=16, help="qaic AI cores (default 16)")
    p.add_argument("--mxint8-kv", action="store_true", help="qaic: keep the KV cache in MXINT8 on the device")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``export``; returns the exit code (ModelError/BackendError are printed by accel.cli)."""
    from accel.backends.export import export_onnx, onnx_file_bytes
    from accel.backends.weights import ExportWeights, WeightFormat
    from accel.errors import BackendError

    if args.fmt is not None and not WeightFormat(args.weights).uses_mx_format:
        raise BackendError(
            f"--fmt {args.fmt} would be ignored: it applies to --weights mx-rounded / mx-packed, and "
            f"--weights {args.weights} fixes its own weights"
        )

    # the checkpoint is read tensor by tensor while the graph is written: no torch model, no second copy
    path = export_onnx(
        args.model,
        args.out,
        ctx_len=args.ctx_len,
        batch_size=args.batch_size,
        num_logits=args.num_logits,
        weights=ExportWeights(
            args.weights,
            mx_format=args.fmt or "mxfp6",
            float_storage=args.float_weights,
            accuracy_level=args.nbits_accuracy,
        ),
        progress=not args.quiet,
        external_data=True if args.external_data else None,
        tree=args.tree,
        ort_ops=args.ort_ops,
        accel_attention=args.accel_attention,
    )
    data = path.with_name(path.name + ".data")
    where = f" + {data.name}" if data.is_file() else ""
    print(f"wrote {path}{where} ({onnx_file_bytes(path) / 1e6:.1f} MB in all, weights={args.weights})")
    if args.qaic_dir:
        from accel.backends.qaic import QaicOptions, write_qaic_files

        try:
            options = QaicOptions(
                batch_size=args.batch_size,
                num_cores=args.num_cores,
                mxint8_kv=args.mxint8_kv,
                tree_nodes=args.tree_nodes,
            )
            spec = write_qaic_files(
                path, args.qaic_dir, prompt_len=args.prompt_len, k=args.k, ctx_len=args.ctx_len, options=options
            )
        except BaseException:  # the command's outputs are whole or absent: drop the ONNX file it just wrote
            for written in (path, path.with_name(path.name + ".data")):
                written.unlink(missing_ok=True)
            raise
        print(
            f"wrote Cloud AI 100 files to {args.qaic_dir}: run {Path(args.qaic_dir) / 'compile.sh'} "
            f"(specializations seq_len {spec.seq_lens}; not verified on hardware)"
        )
    tok = write_tokenizer(Path(args.model), path)
    print(
        f"wrote {tok} (the model's tokenizer, which accel generate reads beside the graph)"
        if tok
        else f"no tokenizer in {args.model}: accel generate --target {path} needs --tokenizer or token ids"
    )
    return 0


def tokenizer_path(graph: Path) -> Path:
    """Where ``accel export`` writes the tokenizer of the graph at ``graph``: ``NAME.tokenizer.json`` beside it."""
    return graph.with_name(graph.stem + ".tokenizer.json")


def write_tokenizer(model: Path, graph: Path) -> Path | None:
    """Write the tokenizer of checkpoint ``model`` (its ``tokenizer.json``, or a ``.gguf`` file's own) beside
    ``graph`` (``tokenizer_path``; written whole or not at all); returns its path, or None when the checkpoint has
    none or the ``tokenizers`` package is missing."""
    import os
    import shutil
    import tempfile

    out = tokenizer_path(graph)
    src = model / "tokenizer.json" if model.is_dir() else None
    if src is not None and not src.is_file():
        return None
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if src is not None:
            shutil.copyfile(src, tmp)
        elif model.suffix == ".gguf":
            from accel.errors import ModelError
            from accel.models.smollm2 import load_tokenizer

            try:
                load_tokenizer(model).save(tmp)
            except ModelError:  # no tokenizers package, or none in the file: the graph is still complete
                return None
        else:
            return None
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        return out
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

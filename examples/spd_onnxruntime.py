"""Export a target and a draft to ONNX and run speculative decoding on onnxruntime, next to plain decoding.

Run: .venv/bin/python examples/spd_onnxruntime.py   (SmolLM2-135M + the shipped draft; ~1 minute)
"""

from pathlib import Path

import accel.models
from accel.apps.demo import default_draft_dir
from accel.backends import OrtBackend, export_onnx
from accel.spd import GREEDY, DraftChain, generate, generate_ar

out = Path("results/example_spd")
target_dir = accel.models.smollm2_checkpoint()
tok = accel.models.load_tokenizer(target_dir)
for name, src in (("target", target_dir), ("draft", default_draft_dir())):
    if not (out / f"{name}.onnx").exists():
        export_onnx(accel.models.load_checkpoint(src), out / f"{name}.onnx", ctx_len=256)
target, draft = OrtBackend(out / "target.onnx", threads=2), OrtBackend(out / "draft.onnx", threads=1)

prompt = tok.encode(
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"
).ids
ar = generate_ar(target, [prompt], max_new_tokens=64, sampling=GREEDY)
spd = generate(target, DraftChain(draft, k=2), [prompt], max_new_tokens=64, sampling=GREEDY)
assert spd.tokens == ar.tokens  # greedy speculative decoding is token-identical to greedy decoding
print(tok.decode(spd.tokens[0]))
print(
    f"AR {ar.stats.tokens_per_s:.1f} tok/s, SpD {spd.stats.tokens_per_s:.1f} tok/s "
    f"({spd.stats.tokens_per_s / ar.stats.tokens_per_s:.2f}x), {spd.stats.mean_tokens_per_loop:.2f} tokens "
    f"per target call"
)

"""Speculative decoding on onnxruntime next to plain decoding, each written once as a ``DecodeSpec``.

The recipe is saved as JSON: ``accel generate --spec results/example_spd/spd.json --prompt "..."`` runs the same
decode from the command line. ``accel.decode.build`` exports the models once (``$ACCEL_CACHE/onnx``) and opens them;
the lower-level pieces it wires (``export_onnx``, ``OrtBackend``, ``DraftChain``, ``generate``) are in docs/spd.md.

Run: .venv/bin/python examples/spd_onnxruntime.py   (SmolLM2-135M + the shipped draft; ~1 minute)
"""

from pathlib import Path

import accel.models
from accel.apps.demo import default_draft_dir
from accel.decode import ARSpec, ChainSpec, DecodeSpec, SamplingSpec, TargetSpec, build

out = Path("results/example_spd")
target = TargetSpec(path=accel.models.smollm2_checkpoint(), ctx_len=256, threads=2)
common = dict(target=target, sampling=SamplingSpec(greedy=True), max_new_tokens=64)
ar_spec = DecodeSpec(proposer=ARSpec(), **common)
spd_spec = DecodeSpec(proposer=ChainSpec(draft=default_draft_dir(), k=2), **common)  # k given: no controller
out.mkdir(parents=True, exist_ok=True)
(out / "spd.json").write_text(spd_spec.model_dump_json(indent=2))

ar_setup, spd_setup = build(ar_spec), build(spd_spec)
prompt = spd_setup.tokenizer.encode(
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"
).ids
ar, spd = ar_setup.generate([prompt]), spd_setup.generate([prompt])
assert spd.tokens == ar.tokens  # greedy speculative decoding is token-identical to greedy decoding
print(spd_setup.tokenizer.decode(spd.tokens[0]))
print(
    f"AR {ar.stats.tokens_per_s:.1f} tok/s, SpD {spd.stats.tokens_per_s:.1f} tok/s "
    f"({spd.stats.tokens_per_s / ar.stats.tokens_per_s:.2f}x), {spd.stats.mean_tokens_per_loop:.2f} tokens "
    f"per target call; the same decode: accel generate --spec {out / 'spd.json'} --prompt ..."
)

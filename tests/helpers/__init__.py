"""Helpers shared by the test modules: test modules import from here, never from each other or from a conftest.

- ``decoders``: tiny random decoders, perturbed copies (high-acceptance drafts), TorchBackends, an oracle feature draft;
- ``spd``: the chi-square test, exact laws by enumeration, batched sampling, the loop tests' prompts;
- ``scenario``: the prefill / step / score scenario that compares a backend with a reference;
- ``formats``: MX format lists, ml_dtypes twins, the SmolLM2 GGUF path;
- ``drafts``: tiny random targets with a byte-level tokenizer for the draft-training tests.
"""

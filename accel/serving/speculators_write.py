"""Write an EAGLE-3 head as a speculators 0.9.0 checkpoint folder (``config.json`` + ``model.safetensors``), the form
``read_speculators``, the ``speculators`` package's own loaders and vLLM's ``eagle3`` method read.

The head's weights come as float32 arrays under speculators' names (``accel.drafts.eagle3.Eagle3Draft
.speculators_tensors``: one decoder layer, the full target vocabulary, so no ``d2t`` / ``t2d`` maps). The config holds
what ``Eagle3SpeculatorConfig`` serialises: ``speculators_model_type = "eagle3"``, the decoder layer as a Llama
``transformer_layer_config``, ``eagle_aux_hidden_state_layer_ids``, the norm flags (all off: the plain EAGLE-3
layout), and ``speculators_config`` (greedy proposals of ``speculative_tokens`` drafts; the verifier's path and
architecture). Written in a temporary folder beside ``out`` and renamed into place when complete; no torch needed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accel._io import check_output_path
from accel.errors import DraftError
from accel.models.config import ModelConfig
from accel.serving.mx_checkpoint import _replace_dir
from accel.serving.safetensors_plain import PlainWriter
from accel.serving.speculators_format import _expected_shapes

__all__ = ["SPECULATORS_VERSION", "speculators_config", "write_speculators"]

#: the speculators release whose format this writes (and accel's tests load it with)
SPECULATORS_VERSION = "0.9.0"
_NO_FLAGS = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False}


def speculators_config(
    config: ModelConfig, layer_ids: Sequence[int], *, verifier: str, speculative_tokens: int = 3
) -> dict[str, Any]:
    """The ``config.json`` object of an EAGLE-3 head with ``config``'s decoder layer (``num_layers`` of the head)."""
    layer = {**config.to_hf(), "architectures": ["LlamaForCausalLM"], "num_hidden_layers": config.num_layers}
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": config.vocab_size,
        "eagle_aux_hidden_state_layer_ids": [int(i) for i in layer_ids],
        "embed_requires_grad": False,
        **_NO_FLAGS,
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "dtype": "float32",
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(speculative_tokens),
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": str(verifier)},
        },
    }


def write_speculators(
    tensors: dict[str, np.ndarray],
    config: ModelConfig,
    layer_ids: Sequence[int],
    out: str | Path,
    *,
    verifier: str | Path,
    speculative_tokens: int = 3,
) -> Path:
    """Write the EAGLE-3 head ``tensors`` (float32, speculators names; ``config``: the head's decoder layers with the
    target's vocabulary) for the target at ``verifier`` to the folder ``out`` (replaced if it exists); returns it.
    DraftError for a missing, extra or misshapen tensor, a non-finite weight or a bad proposal length."""
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) or speculative_tokens < 1:
        raise DraftError(f"speculative_tokens must be an int >= 1; got {speculative_tokens!r}")
    want = _expected_shapes(config, len(layer_ids), _NO_FLAGS)
    if set(tensors) != set(want):
        raise DraftError(f"EAGLE-3 tensors: missing {sorted(set(want) - set(tensors))[:4]}, "
                         f"unexpected {sorted(set(tensors) - set(want))[:4]}")  # fmt: skip
    for name, shape in want.items():
        a = np.asarray(tensors[name])
        if a.shape != shape or not np.issubdtype(a.dtype, np.floating) or not np.isfinite(a).all():
            raise DraftError(f"EAGLE-3 tensor {name}: need finite floats of shape {shape}, got {a.dtype} {a.shape}")
    out = check_output_path(out, "a speculators checkpoint", DraftError, folder=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        specs = {n: ("F32", want[n]) for n in want}
        with PlainWriter(staging / "model.safetensors", specs) as w:
            for name in want:
                w.write(name, np.asarray(tensors[name], np.float32))
        cfg = speculators_config(config, layer_ids, verifier=str(verifier), speculative_tokens=speculative_tokens)
        (staging / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        _replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out

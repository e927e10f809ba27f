"""EAGLE-3 draft heads in the ``speculators`` format (the vLLM project's draft library, v0.9.0): read and validated.

A speculators checkpoint is a folder with ``config.json`` (``speculators_model_type``, ``speculators_config``, the
draft's decoder layers as ``transformer_layer_config``) and safetensors weights. An EAGLE-3 head (Li et al. 2025)
reads, with the token ``x_p`` at position ``p``, the concatenated hidden states ``a_{p-1}`` of the target at the layers
``eagle_aux_hidden_state_layer_ids`` (layer id ``l``: the residual stream entering target layer ``l``, before its
norm; ``l = num_layers``: after the last layer, before the final norm; vLLM's ``aux_hidden_state_layers``):

- ``g = fc(a)`` (``fc.weight [H, n * H]``, no bias; ``norm_before_fc``: one RMSNorm over ``a`` first, weight
  ``input_norm.weight``; ``fc_norm``: one RMSNorm per layer's slice, ``fc_norm.{j}.weight``);
- the first decoder layer attends with ``concat(input_layernorm(embed(x)), hidden_norm(g))`` (q/k/v take ``2 H``
  inputs) and adds to the residual ``g`` (``norm_before_residual``: ``hidden_norm(g)``); then the usual MLP, then the
  other layers (plain Llama layers), the final ``norm`` and ``lm_head [draft_vocab, H]``;
- while drafting, the head's own last-layer output (pre-norm; ``norm_output``: normed) replaces ``g`` for the next
  token: it skips ``fc``;
- a draft vocabulary: draft token ``i`` is target token ``i + d2t[i]``; ``t2d[v]`` says whether target token ``v``
  has a draft row (both absent when ``draft_vocab_size`` is the target's).

Sources: speculators 0.9.0 ``speculators/models/eagle3/{config,core,model_definitions}.py``,
``speculators/model.py`` (``DraftVocabMixin``), ``speculators/models/eagle3/data.py`` (``shift_batch``: token
``x_{p+1}`` with the target state at ``p``, position ``p + 1``); vLLM ``vllm/model_executor/models/llama.py``
(``aux_hidden_states.append(hidden_states + residual)`` before layer ``idx``). docs/serving.md has the details.

``read_speculators`` validates everything it reads (config fields, tensor names, shapes, dtypes, finite values, the
vocabulary maps) and never unpickles: weights come from safetensors files only. No torch is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import DraftError, FormatError, ModelError
from accel.models.config import ModelConfig
from accel.serving.safetensors_plain import PlainFile

__all__ = [
    "SPECULATORS_EXPORT_REFUSALS",
    "SUPPORTED_SPECULATORS_TYPES",
    "Eagle3Head",
    "read_json_object",
    "read_speculators",
    "vllm_speculative_config",
    "weight_files",
]

#: the ``speculators_model_type`` values accel runs
SUPPORTED_SPECULATORS_TYPES = ("eagle3",)
#: tensors a speculators 0.9.0 EAGLE-3 file may hold that inference does not use (training-only copies)
_IGNORED = ("verifier_lm_head.weight", "verifier_norm.weight")
#: why accel writes no speculators checkpoint for each kind of draft (``accel export-draft --format speculators``)
SPECULATORS_EXPORT_REFUSALS: dict[str, str] = {
    "feature": "accel's feature draft has no speculators form: speculators 0.9.0 defines only EAGLE-3 among EAGLE "
    "heads, and accel's draft computes something else (it reads the target's final-norm state, joins it with the "
    "token embedding in one fc before a plain first layer, and feeds its final-norm state back through that fc; "
    "EAGLE-3 reads pre-norm states of several layers, normalises token and state apart in a 2H-wide first layer and "
    "feeds its pre-norm state back past fc), so no weight mapping keeps its logits; accel distill-eagle3 trains an "
    "EAGLE-3 head in that format (docs/serving.md)",
    "hydra": "Hydra heads have no speculators form: speculators 0.9.0 defines eagle3, peagle, dflash, dflash2, dspark, "
    "mtp and xpress; the closest, mtp, is one recurrent decoder layer over the target's state and the last token, "
    "where Hydra has one MLP head per depth reading the target's state and the embeddings of all earlier drafts "
    "(docs/serving.md)",
    "standalone": "a standalone draft is a plain causal LM, which speculators has no type for: use --format hf "
    "(vLLM's draft_model method takes it)",
    "speculators": "this folder is already a speculators checkpoint: give it to vLLM as it is "
    "(speculative_config method eagle3, docs/serving.md)",
}
_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
_FLOAT_CODES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Eagle3Head:
    """An EAGLE-3 head read from a speculators checkpoint (module docstring).

    ``config``: the head's decoder layers as an accel ``ModelConfig`` whose ``vocab_size`` is the target's,
    ``head_vocab`` the draft vocabulary (0 when it is the target's) and ``feature_size`` the feature width
    ``feature_width``. ``tensors``: float32 weights under accel's names (those of the checkpoint, plus
    ``lm_head_token_ids``, the target token of each ``lm_head`` row, sorted ascending with the rows permuted to
    match). ``layer_ids``: the target layers the head reads. ``flags``: ``norm_before_residual``,
    ``norm_before_fc``, ``fc_norm``, ``norm_output``. ``speculative_tokens``: the checkpoint's greedy proposal length
    (tokens; None if it names none). ``verifier``: the target it was trained for (``name_or_path``, as written).
    """

    config: ModelConfig
    layer_ids: tuple[int, ...]
    tensors: dict[str, np.ndarray] = field(repr=False)
    flags: dict[str, bool]
    speculative_tokens: int | None = None
    verifier: str | None = None

    @property
    def hidden_size(self) -> int:
        """The head's (and the target's) hidden width H."""
        return self.config.hidden_size

    @property
    def feature_width(self) -> int:
        """Width of the head's ``features`` input in accel: the ``n * H`` target states, then ``H`` for the head's
        own state while drafting (zeros in a target column, as the target's part is zero in a drafting column)."""
        return (len(self.layer_ids) + 1) * self.hidden_size


def read_speculators(path: str | Path, *, embed_tokens: np.ndarray | None = None) -> Eagle3Head:
    """Read and validate the speculators EAGLE-3 checkpoint folder ``path``.

    ``embed_tokens``: the target's token embedding ``[vocab, H]`` (float), used when the checkpoint has none (the
    package then loads the verifier's). DraftError names the offending field or tensor (and the allowed values).
    """
    path = Path(path)
    if not path.is_dir():
        raise DraftError(f"no speculators checkpoint folder at {path}")
    raw = read_json_object(path / "config.json")
    kind = raw.get("speculators_model_type")
    if kind not in SUPPORTED_SPECULATORS_TYPES:
        raise DraftError(
            f"{path}/config.json: speculators_model_type={kind!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_SPECULATORS_TYPES)}"
        )
    config, layer_ids, flags = _eagle3_config(raw, path)
    files = weight_files(path)
    tensors = _read_tensors(files, config, len(layer_ids), flags, embed_tokens is not None)
    if "embed_tokens.weight" not in tensors:
        tensors["embed_tokens.weight"] = _check_float(
            "embed_tokens (given)", np.asarray(embed_tokens, np.float32), (config.vocab_size, config.hidden_size)
        )
    tensors.update(_vocab_map(files, config, tensors.pop("lm_head.weight")))
    steps, verifier = _speculators_section(raw, path)
    return Eagle3Head(config, layer_ids, tensors, flags, steps, verifier)


def vllm_speculative_config(checkpoint: str | Path, num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for a speculators EAGLE-3 folder: ``{"model": path, "method": "eagle3",
    "num_speculative_tokens": k}`` (vLLM reads the method and the aux layers from the folder's config.json)."""
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise DraftError(f"num_speculative_tokens must be an int >= 1; got {num_speculative_tokens!r}")
    if num_speculative_tokens < 1:
        raise DraftError(f"num_speculative_tokens must be >= 1; got {num_speculative_tokens}")
    return {"model": str(checkpoint), "method": "eagle3", "num_speculative_tokens": num_speculative_tokens}


# ---------------------------------------------------------------------------------------------------------- config


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in file ``path``; ``DraftError`` naming the file when it is missing, not JSON or not an
    object."""
    if not path.is_file():
        raise DraftError(f"no config.json at {path}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DraftError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DraftError(f"{path} must hold a JSON object")
    return raw


def _eagle3_config(raw: dict[str, Any], path: Path) -> tuple[ModelConfig, tuple[int, ...], dict[str, bool]]:
    """The head's accel config, aux layer ids and flags from an ``eagle3`` config.json (DraftError naming the field)."""
    where = f"{path}/config.json"
    layers = raw.get("transformer_layer_config")
    if not isinstance(layers, dict):
        raise DraftError(f"{where}: transformer_layer_config must be a JSON object")
    if layers.get("model_type", "llama") != "llama":
        raise DraftError(
            f"{where}: transformer_layer_config.model_type={layers.get('model_type')!r} is not supported; supported: "
            "'llama' (qwen3 heads normalise q and k per head, which accel's decoder layers do not)"
        )
    kinds = set(layers.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise DraftError(f"{where}: layer_types {sorted(kinds)} are not supported; supported: full_attention only")
    try:
        base = ModelConfig.from_hf({**layers, "model_type": "llama"})
    except ModelError as exc:
        raise DraftError(f"{where}: transformer_layer_config: {exc}") from exc
    flags = {}
    for name in _FLAGS:
        value = raw.get(name, False)
        if not isinstance(value, bool):
            raise DraftError(f"{where}: {name} must be a JSON boolean; got {value!r}")
        flags[name] = value
    if flags["norm_before_fc"] and flags["fc_norm"]:
        raise DraftError(f"{where}: norm_before_fc and fc_norm are mutually exclusive (speculators 0.9.0)")
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != base.hidden_size:
        raise DraftError(
            f"{where}: target_hidden_size={target_hidden!r} differs from the head's hidden_size {base.hidden_size}; "
            "supported: null or equal (speculators 0.9.0's fc reads num_aux * hidden_size)"
        )
    layer_ids = _layer_ids(raw.get("eagle_aux_hidden_state_layer_ids"), where)
    draft_vocab = raw.get("draft_vocab_size")
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= base.vocab_size:
        raise DraftError(f"{where}: draft_vocab_size must be an int in 1..{base.vocab_size}; got {draft_vocab!r}")
    config = base.with_(
        head_vocab=0 if draft_vocab == base.vocab_size else draft_vocab,
        feature_size=(len(layer_ids) + 1) * base.hidden_size,
        tie_word_embeddings=False,
    )
    return config, layer_ids, flags


def _layer_ids(value: Any, where: str) -> tuple[int, ...]:
    """``eagle_aux_hidden_state_layer_ids``: distinct ints >= 0 (the package's default when absent needs the
    verifier's config, so accel asks for them explicitly)."""
    if value is None:
        raise DraftError(
            f"{where}: eagle_aux_hidden_state_layer_ids is missing; speculators then takes [2, L // 2, L - 3] of the "
            "verifier's L layers: write them into config.json"
        )
    ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok or min(value) < 0 or len(set(value)) != len(value):
        raise DraftError(f"{where}: eagle_aux_hidden_state_layer_ids must be distinct ints >= 0; got {value!r}")
    return tuple(value)


def _speculators_section(raw: dict[str, Any], path: Path) -> tuple[int | None, str | None]:
    """The default proposal's ``speculative_tokens`` and the verifier's ``name_or_path`` (both optional)."""
    section = raw.get("speculators_config")
    if section is None:
        return None, None
    if not isinstance(section, dict):
        raise DraftError(f"{path}/config.json: speculators_config must be a JSON object")
    verifier = section.get("verifier") or {}
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    steps = None
    for method in section.get("proposal_methods") or []:
        if isinstance(method, dict) and method.get("proposal_type") == section.get("default_proposal_method"):
            steps = method.get("speculative_tokens")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise DraftError(f"{path}/config.json: speculative_tokens must be an int >= 1; got {steps!r}")
    return steps, name if isinstance(name, str) else None


# --------------------------------------------------------------------------------------------------------- weights


def weight_files(path: Path) -> dict[str, PlainFile]:
    """Tensor name -> its safetensors file in speculators checkpoint folder ``path`` (a ``PlainFile``: its header read
    and validated, no tensor read): ``model.safetensors`` or the shards of ``model.safetensors.index.json``.
    ``DraftError`` when there are none or they cannot be read."""
    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise DraftError(f"{index}: weight_map must map tensor names to shard file names")
            shards = {name: PlainFile(path / Path(name).name) for name in set(weight_map.values())}
            files = {n: shards[s] for s in shards for n in shards[s].entries}
        elif (path / "model.safetensors").is_file():
            single = PlainFile(path / "model.safetensors")
            files = dict.fromkeys(single.entries, single)
        else:
            raise DraftError(f"{path}: no model.safetensors (nor model.safetensors.index.json): no weights")
    except FormatError as exc:
        raise DraftError(f"{path}: unreadable weights: {exc}") from exc
    return files


def _expected_shapes(config: ModelConfig, num_aux: int, flags: dict[str, bool]) -> dict[str, tuple[int, ...]]:
    """Every float tensor of an EAGLE-3 head and its shape (speculators 0.9.0 names, which are accel's)."""
    c, H = config, config.hidden_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (c.vocab_size, H),
        "fc.weight": (H, num_aux * H),
        "norm.weight": (H,),
        "lm_head.weight": (c.head_vocab or c.vocab_size, H),
        "layers.0.hidden_norm.weight": (H,),
    }
    for i in range(c.num_layers):
        p, width = f"layers.{i}", 2 * H if i == 0 else H
        inter = c.intermediate_size
        for name, shape, bias in (
            ("self_attn.q_proj", (q, width), c.qkv_bias),
            ("self_attn.k_proj", (kv, width), c.qkv_bias),
            ("self_attn.v_proj", (kv, width), c.qkv_bias),
            ("self_attn.o_proj", (H, q), c.o_bias),
            ("mlp.gate_proj", (inter, H), c.mlp_bias),
            ("mlp.up_proj", (inter, H), c.mlp_bias),
            ("mlp.down_proj", (H, inter), c.mlp_bias),
        ):
            shapes[f"{p}.{name}.weight"] = shape
            if bias:
                shapes[f"{p}.{name}.bias"] = (shape[0],)
        shapes[f"{p}.input_layernorm.weight"] = (H,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (H,)
    if flags["norm_before_fc"]:
        shapes["input_norm.weight"] = (num_aux * H,)
    if flags["fc_norm"]:
        shapes.update({f"fc_norm.{j}.weight": (H,) for j in range(num_aux)})
    return shapes


def _read_tensors(
    files: dict[str, PlainFile], config: ModelConfig, num_aux: int, flags: dict[str, bool], have_embed: bool
) -> dict[str, np.ndarray]:
    """The head's float tensors as float32, each checked for its name, dtype, shape and finite values."""
    shapes = _expected_shapes(config, num_aux, flags)
    maps = {"t2d", "d2t"}
    unknown = sorted(set(files) - set(shapes) - maps - set(_IGNORED))
    if unknown:
        raise DraftError(f"unexpected tensors {unknown[:5]}: not part of a speculators 0.9.0 EAGLE-3 llama head")
    out = {}
    for name, shape in shapes.items():
        if name not in files:
            if name == "embed_tokens.weight" and have_embed:
                continue
            hint = " (or pass embed_tokens=, the target's embedding)" if name == "embed_tokens.weight" else ""
            raise DraftError(f"tensor {name!r} is missing from the checkpoint{hint}")
        f = files[name]
        code, got = f.entries[name]
        if code not in _FLOAT_CODES:
            raise DraftError(f"{f.path}: tensor {name!r} is {code}; allowed: {', '.join(_FLOAT_CODES)}")
        out[name] = _check_float(f"{f.path}: tensor {name!r}", f.float32(name) if got == shape else None, shape, got)
    return out


def _check_float(what: str, array: np.ndarray | None, shape: tuple[int, ...], got: Any = None) -> np.ndarray:
    """``array`` if it has ``shape`` and only finite values (DraftError otherwise)."""
    if array is None or tuple(array.shape) != tuple(shape):
        raise DraftError(f"{what} has shape {got if array is None else tuple(array.shape)}; expected {shape}")
    if not np.all(np.isfinite(array)):
        raise DraftError(f"{what} holds NaN or Inf values")
    return np.ascontiguousarray(array, dtype=np.float32)


def _vocab_map(files: dict[str, PlainFile], config: ModelConfig, head: np.ndarray) -> dict[str, np.ndarray]:
    """``lm_head.weight`` with its rows sorted by target token and ``lm_head_token_ids`` (a restricted head), or the
    head as it is (a full-vocabulary head: ``t2d``/``d2t`` are ignored, as the package ignores them)."""
    if not config.head_vocab:
        return {"lm_head.weight": head}
    for name in ("t2d", "d2t"):
        if name not in files:
            raise DraftError(f"tensor {name!r} is missing: draft_vocab_size {config.head_vocab} needs the vocab maps")
    d2t = _int_tensor(files, "d2t", ("I64", "I32"), (config.head_vocab,))
    t2d = _int_tensor(files, "t2d", ("BOOL", "U8", "I64", "I32"), (config.vocab_size,))
    ids = np.arange(config.head_vocab, dtype=np.int64) + d2t
    if ids.min() < 0 or ids.max() >= config.vocab_size:
        raise DraftError(f"d2t maps draft tokens outside the target vocabulary 0..{config.vocab_size - 1}")
    if len(np.unique(ids)) != len(ids):
        raise DraftError("d2t maps two draft tokens to one target token")
    if not np.isin(t2d, (0, 1)).all() or int(t2d.astype(bool).sum()) != config.head_vocab:
        raise DraftError(f"t2d must be a 0/1 mask of the target vocabulary with {config.head_vocab} ones")
    if not t2d.astype(bool)[ids].all():
        raise DraftError("t2d and d2t disagree: a target token d2t maps to is not marked in t2d")
    order = np.argsort(ids, kind="stable")
    return {"lm_head.weight": np.ascontiguousarray(head[order]), "lm_head_token_ids": ids[order]}


def _int_tensor(files: dict[str, PlainFile], name: str, codes: tuple[str, ...], shape: tuple[int, ...]) -> np.ndarray:
    f = files[name]
    code, got = f.entries[name]
    if code not in codes or tuple(got) != shape:
        raise DraftError(
            f"{f.path}: tensor {name!r} is {code} {tuple(got)}; expected one of {codes} with shape {shape}"
        )
    return np.asarray(f.raw(name)).astype(np.int64)

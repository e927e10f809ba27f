"""Write accel's MX weights as checkpoints that serving engines load (AMD Quark OCP-MX, compressed-tensors), and read
such checkpoints back bit-exactly.

``export_mx_checkpoint`` takes a Hugging Face checkpoint directory (plain float, or accel-compressed MX) or a
``Decoder`` and writes ``config.json`` (with ``quantization_config``), ``model.safetensors`` (plain safetensors, HF
names) and the tokenizer files. Linear weights (2-D ``*.weight`` other than embeddings, norms and the LM head, with
``in_features % 32 == 0``) are quantized with accel's own codec (``accel.formats.quantize``: floor-rule E8M0 scales,
round-half-even elements, OCP MX v1.0 §6.3) or, when the source is already accel-compressed in the same format with
block 32, copied without re-encoding. Every other Linear stays in float and is listed in the config's exclude list.

``read_mx_checkpoint`` returns every tensor by HF name, MX weights as ``MXTensor`` (the stored bytes, unchanged);
``load_mx_checkpoint`` builds a ``Decoder`` from it (MX weights dequantized exactly to float32).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from accel.errors import FormatError
from accel.formats.file import SafetensorsFile
from accel.formats.mx_tensor import MXTensor, quantize
from accel.formats.staging import check_output
from accel.models.config import ModelConfig
from accel.models.hf_names import accel_to_hf, hf_to_accel
from accel.serving.mx_layouts import (
    BLOCK,
    SCALES_SUFFIX,
    MXLayout,
    from_stored,
    get_layout,
    parse_quantization_config,
    quantization_config,
    to_stored,
)
from accel.serving.safetensors_plain import PlainFile, PlainWriter

__all__ = ["MXExportSummary", "export_mx_checkpoint", "load_mx_checkpoint", "read_mx_checkpoint"]

#: float weights never quantized: embeddings, norms, the LM head (as ``accel.formats.stream.DEFAULT_EXCLUDE``)
KEEP_FLOAT = ("*embed*", "*lm_head*", "*norm*")
#: small files copied from a source directory (tokenizer, generation settings)
AUX_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)
WEIGHTS_NAME = "model.safetensors"


class MXExportSummary(BaseModel):
    """What ``export_mx_checkpoint`` wrote."""

    path: str = Field(description="the output checkpoint directory")
    layout: str = Field(description="quark or compressed-tensors")
    fmt: str = Field(description="accel element format of the MX weights")
    quantized: list[str] = Field(description="Linear modules stored as MX")
    copied_mx: list[str] = Field(description="of those, the ones copied from accel MX tensors without re-encoding")
    excluded: list[str] = Field(description="Linear modules kept in float (the config's exclude / ignore list)")
    weights_bytes: int = Field(description="size of model.safetensors in bytes")


# ------------------------------------------------------------------------------------------------- sources


class _Source:
    """Tensors of the source by HF name: ``shape(name)``, ``get(name)`` (float32 array or MXTensor), ``raw``."""

    def __init__(self, source: Any) -> None:
        self.files: dict[str, SafetensorsFile] = {}
        self.mx: set[str] = set()
        self.arrays: dict[str, np.ndarray] = {}
        self.dir: Path | None = None
        if isinstance(source, (str, os.PathLike)):
            self.dir = Path(source)
            self._open_dir(self.dir)
        elif hasattr(source, "config") and hasattr(source, "state_dict"):
            self._from_decoder(source)
        else:
            raise FormatError(f"cannot export {type(source).__name__}; give a checkpoint directory or a Decoder")

    def _open_dir(self, d: Path) -> None:
        cfg = d / "config.json"
        if not cfg.is_file():
            raise FormatError(f"{d}: no config.json (give a Hugging Face checkpoint directory)")
        try:
            self.config = json.loads(cfg.read_text())
        except ValueError as exc:
            raise FormatError(f"{cfg} is not valid JSON: {exc}") from exc
        if "quantization_config" in self.config:
            raise FormatError(f"{cfg} already has a quantization_config; export from the float or accel checkpoint")
        shards = sorted(d.glob("*.safetensors"))
        if not shards:
            raise FormatError(f"{d}: no *.safetensors weights")
        for shard in shards:
            f = SafetensorsFile(shard)
            for name in f.mx_headers:
                self.files[name] = f
                self.mx.add(name)
            for name in f.entries:
                if not name.endswith((".mx_codes", ".mx_scales")):
                    self.files[name] = f

    def _from_decoder(self, model: Any) -> None:
        import torch

        self.config = model.config.to_hf()
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        for name, t in accel_to_hf(model.config, state).items():
            self.arrays[name] = t.float().numpy() if t.is_floating_point() else t.numpy()
        if any(t.dtype == torch.uint8 for t in state.values()):
            raise FormatError("the Decoder has MX-compressed layers; export its checkpoint directory instead")

    def names(self) -> list[str]:
        return sorted(self.files) if self.dir is not None else sorted(self.arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.arrays:
            return tuple(self.arrays[name].shape)
        f = self.files[name]
        return tuple(f.mx_headers[name]["shape"]) if name in self.mx else tuple(f.entries[name].shape)

    def dtype(self, name: str) -> str:
        """safetensors dtype code of a plain tensor ("MX" for an accel MX tensor)."""
        if name in self.mx:
            return "MX"
        if name in self.arrays:
            a = self.arrays[name]
            return "F32" if a.dtype.kind == "f" else {np.dtype("int64"): "I64"}.get(a.dtype, "I32")
        return self.files[name].entries[name].dtype

    def get(self, name: str) -> np.ndarray | MXTensor:
        if name in self.arrays:
            return self.arrays[name]
        f = self.files[name]
        if name in self.mx:
            return f.mx_tensor(name)
        f.verify(name)
        return np.array(f.raw(name))  # stored dtype (BF16 as uint16 bits): copied unchanged


# ------------------------------------------------------------------------------------------------- export


def _is_linear_weight(name: str, shape: tuple[int, ...]) -> bool:
    return name.endswith(".weight") and len(shape) == 2 and "embed" not in name


def export_mx_checkpoint(
    source: Any,
    out_dir: str | os.PathLike,
    fmt: str = "mxfp6",
    layout: str = "quark",
    *,
    overwrite: bool = False,
    progress: bool = False,
) -> MXExportSummary:
    """Write ``source`` (a Llama-family HF checkpoint directory, plain or accel-compressed, or a ``Decoder``) to
    ``out_dir`` as a ``layout`` (``"quark"`` or ``"compressed-tensors"``) checkpoint with ``fmt`` weights.

    The directory is built beside ``out_dir`` and renamed into place when complete. FormatError for a format the
    layout lacks (Quark: mxfp4/mxfp6 E2M3/E3M2; compressed-tensors: mxfp4/mxfp6 E2M3/mxfp8 E4M3), NaN/Inf weights,
    a GPT-2 source (its Conv1D weights are not Linear), or accel MX weights in another format or block size.
    """
    lay = get_layout(layout, fmt)
    src = _Source(source)
    if src.config.get("model_type") == "gpt2":
        raise FormatError("GPT-2 checkpoints store Conv1D weights, which the serving MX layouts do not cover")
    out = Path(out_dir)
    check_output(out, overwrite)
    plan = _plan(src, lay)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_weights(src, lay, plan, staging / WEIGHTS_NAME, progress)
        config = dict(src.config)
        config["quantization_config"] = quantization_config(lay, plan["excluded"])
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        for aux in AUX_FILES:
            if src.dir is not None and (src.dir / aux).is_file():
                shutil.copyfile(src.dir / aux, staging / aux)
        size = (staging / WEIGHTS_NAME).stat().st_size
        _replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return MXExportSummary(
        path=str(out),
        layout=lay.name,
        fmt=lay.fmt.name,
        quantized=sorted(n.rsplit(".", 1)[0] for n in plan["quantize"]),
        copied_mx=sorted(n.rsplit(".", 1)[0] for n in plan["quantize"] if n in src.mx),
        excluded=plan["excluded"],
        weights_bytes=size,
    )


def _plan(src: _Source, lay: MXLayout) -> dict[str, Any]:
    quantize_names, excluded = [], []
    for name in src.names():
        shape = src.shape(name)
        if not _is_linear_weight(name, shape):
            if name in src.mx:
                raise FormatError(f"tensor {name!r} is stored as MX but is not a Linear weight of a Llama checkpoint")
            continue
        keep = any(fnmatch.fnmatchcase(name, p) for p in KEEP_FLOAT) or shape[1] % BLOCK
        if name in src.mx:
            if keep:
                raise FormatError(f"tensor {name!r} is accel MX but cannot be stored as {lay.name} MX (see KEEP_FLOAT)")
            quantize_names.append(name)
        elif keep or src.dtype(name) not in ("F32", "F16", "BF16", "F64"):
            excluded.append(name.rsplit(".", 1)[0])
        else:
            quantize_names.append(name)
    if "lm_head" not in excluded:
        excluded.append("lm_head")  # a tied head has no tensor of its own but is a Linear module in every engine
    return {"quantize": set(quantize_names), "excluded": sorted(excluded)}


def _write_weights(src: _Source, lay: MXLayout, plan: dict[str, Any], path: Path, progress: bool) -> None:
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in src.names():
        shape = src.shape(name)
        if name in plan["quantize"]:
            module = name[: -len(".weight")]
            out_f, in_f = shape
            specs[lay.codes_name(module)] = (lay.codes_dtype, (out_f, lay.packed_cols(in_f)))
            specs[lay.scales_name(module)] = ("U8", (out_f, in_f // BLOCK))
        else:
            code = src.dtype(name)
            specs[name] = (code, shape)
    with PlainWriter(path, specs) as w:
        for name in tqdm(src.names(), desc=f"write {lay.name} {lay.fmt.name}", disable=not progress):
            value = src.get(name)
            if name not in plan["quantize"]:
                assert isinstance(value, np.ndarray)
                w.write(name, value)
                continue
            mx = value if isinstance(value, MXTensor) else _quantize(value, lay, name, src.dtype(name))
            codes, scales = to_stored(mx, lay, name)
            module = name[: -len(".weight")]
            w.write(lay.codes_name(module), codes)
            w.write(lay.scales_name(module), scales)


def _quantize(value: np.ndarray, lay: MXLayout, name: str, code: str) -> MXTensor:
    if code == "BF16":
        value = (value.astype(np.uint32) << 16).view(np.float32)
    if not np.isfinite(value).all():
        raise FormatError(f"tensor {name!r} holds NaN/Inf weights, which {lay.name} MX cannot represent")
    return quantize(value, lay.fmt, axis=1, block_size=BLOCK, name=name)


def _replace_dir(staging: Path, out: Path) -> None:
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.rename(staging, out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- reading


def read_mx_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray | MXTensor]]:
    """``(config.json dict, tensors by HF name)`` of a Quark OCP-MX or compressed-tensors MX checkpoint directory.

    MX weights come back as ``MXTensor`` holding the stored bytes (bit-exact); float tensors as float32 arrays (BF16
    and F16 widened exactly), integer tensors as stored. FormatError names the file and tensor for anything that does
    not match the config (a missing scale, wrong shapes, extra quantization tensors such as activation scales).
    """
    d = Path(path)
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{d}: cannot read config.json: {exc}") from exc
    lay = parse_quantization_config(config.get("quantization_config"), str(d / "config.json"))
    shards = sorted(d.glob("*.safetensors"))
    if not shards:
        raise FormatError(f"{d}: no *.safetensors weights")
    out: dict[str, np.ndarray | MXTensor] = {}
    for shard in shards:
        out.update(_read_shard(PlainFile(shard), lay))
    return config, out


def _read_shard(f: PlainFile, lay: MXLayout) -> dict[str, np.ndarray | MXTensor]:
    out: dict[str, np.ndarray | MXTensor] = {}
    pairs = {n[: -len(SCALES_SUFFIX) - 1] for n in f.entries if n.endswith("." + SCALES_SUFFIX)}
    used: set[str] = set()
    for module in sorted(pairs):
        codes_name, scales_name = lay.codes_name(module), lay.scales_name(module)
        if codes_name not in f.entries:
            raise FormatError(f"{f.path}: {scales_name!r} has no {codes_name!r} beside it")
        code = f.entries[codes_name][0]
        if code != lay.codes_dtype:
            raise FormatError(f"{f.path}: {codes_name!r} is {code}; {lay.name} {lay.fmt.name} stores {lay.codes_dtype}")
        out[f"{module}.weight"] = from_stored(f.raw(codes_name), f.raw(scales_name), lay, f"{module}.weight")
        used |= {codes_name, scales_name}
    for name, (code, _) in f.entries.items():
        if name in used:
            continue
        if name.endswith(("_scale", "_zero_point", "_packed", "_global_scale", "weight_shape")):
            raise FormatError(f"{f.path}: tensor {name!r} belongs to a quantization scheme accel does not read")
        out[name] = f.float32(name) if code in ("BF16", "F16", "F32", "F64") else np.array(f.raw(name))
    return out


def load_mx_checkpoint(path: str | os.PathLike, *, dtype: Any = None) -> Any:
    """A ``Decoder`` (eval mode, ``dtype``, default float32) from a Quark / compressed-tensors MX checkpoint: the MX
    weights dequantized exactly (``MXTensor.dequantize``), everything else as stored."""
    import torch

    # torch-optional: the Decoder and its loader need torch; reading and writing MX checkpoints does not
    from accel.models.decoder import Decoder
    from accel.models.loading import load_state

    config, tensors = read_mx_checkpoint(path)
    cfg = ModelConfig.from_hf({k: v for k, v in config.items() if k != "quantization_config"})
    dense = {
        n: torch.from_numpy(np.ascontiguousarray(v.dequantize(np.float32) if isinstance(v, MXTensor) else v))
        for n, v in tensors.items()
    }
    model = Decoder(cfg)
    load_state(model, hf_to_accel(cfg, dense))
    return model.to(dtype or torch.float32).eval()

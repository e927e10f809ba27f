"""The demo's decoding modes as ``DecodeSpec`` recipes (``accel.decode``), one per mode, opened on one target session.

Every mode is written to ``<out>/specs/<mode>.json``: ``accel generate --spec FILE --prompt TEXT`` and
``accel.decode.build(load_spec(FILE)).generate(...)`` run the same decode. The demo opens all modes through one
``accel.decode.Opener`` whose target graph has what the widest mode needs (the feature draft's hidden states and
tree inputs), so the modes (AR included) are timed on one target session; a mode run alone opens the graph its own
proposer needs, which for the feature-draft modes is that same graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from accel.apps.demo.hydra import HYDRA_NODES, default_hydra_dir
from accel.apps.demo.settings import AUTOTUNE_MODE, LOOKUP_MODE, TREE_MODE, TREE_NODES
from accel.backends.weights import WeightFormat
from accel.decode import (
    ARSpec,
    ChainSpec,
    DecodeSetup,
    DecodeSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    ProposerSpec,
    SamplingSpec,
    TargetSpec,
    TreeSpec,
    build,
)
from accel.decode.opening import GraphNeeds, Opener

__all__ = ["AR_MODE", "ModeSettings", "demo_modes", "open_modes", "spec_file_name", "write_specs"]

AR_MODE = "AR (greedy)"


@dataclass(frozen=True)
class ModeSettings:
    """What every mode shares: the target and drafts (``feature_draft`` None: no feature-draft modes; ``hydra``: the
    shipped Hydra++ heads' modes), the chain length ``k``, tokens per prompt, the sampled modes' temperature,
    onnxruntime threads (None: its default), the cache length in tokens, stop tokens and the tokenizer's file or
    directory."""

    target: Path
    draft: Path
    feature_draft: Path | None
    hydra: bool
    k: int
    max_new_tokens: int
    temperature: float
    threads: int | None
    ctx_len: int
    eos: list[int] | None
    tokenizer: Path


def demo_modes(s: ModeSettings) -> list[tuple[str, DecodeSpec]]:
    """``(mode, spec)`` of every decoding mode the demo runs, in the order it prints them (AR first)."""
    greedy = SamplingSpec(greedy=True)
    sampled = SamplingSpec(temperature=s.temperature)
    chain = ChainSpec(draft=s.draft, k=s.k)
    modes: list[tuple[str, ProposerSpec, SamplingSpec, bool]] = [
        (AR_MODE, ARSpec(), greedy, False),
        ("SpD greedy", chain, greedy, False),
        (f"SpD sampled T={s.temperature:g}", chain, sampled, False),
    ]
    if s.feature_draft is not None:
        feat = ChainSpec(draft=s.feature_draft, k=s.k)  # int8 weights: build's default for a feature draft
        lookup = LookupSpec(n=3, k=s.k)
        modes += [
            ("feature SpD greedy", feat, greedy, False),
            (f"feature SpD T={s.temperature:g}", feat, sampled, False),
            (LOOKUP_MODE, FirstOfSpec(lookup=lookup, then=feat), greedy, False),
            (TREE_MODE, TreeSpec(draft=s.feature_draft, nodes=TREE_NODES), greedy, False),
            # the controller over lookup then the chain, the chain, and a tree merged with lookup (build's arms)
            (AUTOTUNE_MODE, FirstOfSpec(lookup=lookup, then=feat), greedy, True),
        ]
        if s.hydra:  # the heads read the target's hidden states, as the feature draft does
            heads = HydraTreeSpec(heads=default_hydra_dir(), nodes=HYDRA_NODES, weights="int8")
            name = f"Hydra++ tree({HYDRA_NODES})"
            modes += [(f"{name} greedy", heads, greedy, False), (f"{name} T={s.temperature:g}", heads, sampled, False)]
    target = TargetSpec(
        path=s.target, weights=WeightFormat.MX_ROUNDED, ctx_len=s.ctx_len, threads=s.threads
    )  # MXFP6 values in float32: the accelerator's numerics
    return [
        (
            name,
            DecodeSpec(
                target=target,
                proposer=proposer,
                sampling=sampling,
                max_new_tokens=s.max_new_tokens,
                eos_token_id=s.eos if s.eos is not None else [],
                tokenizer=s.tokenizer,
                autotune=tune,
            ),
        )
        for name, proposer, sampling, tune in modes
    ]


def open_modes(modes: list[tuple[str, DecodeSpec]], tokenizer: object, wide: bool) -> dict[str, DecodeSetup]:
    """Every mode built (``accel.decode.build``) through one ``Opener``: one target session (with hidden states and
    tree inputs when ``wide``: the feature draft's modes), one session per draft, threads that do not spin (the
    drafts' calls alternate with the target's)."""
    opener = Opener(GraphNeeds(hidden_output=wide, tree=wide), target_spin=False)
    return {name: build(spec, tokenizer, opener) for name, spec in modes}


def spec_file_name(mode: str) -> str:
    """The file a mode's spec is written to: ``"feature SpD tree(4) greedy"`` -> ``feature-spd-tree-4-greedy.json``."""
    return re.sub(r"[^a-z0-9.=]+", "-", mode.lower()).strip("-").replace("=", "") + ".json"


def write_specs(modes: list[tuple[str, DecodeSpec]], folder: Path) -> dict[str, Path]:
    """Each mode's spec as JSON under ``folder`` (replaced whole: written to a temporary name, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, spec in modes:
        path = folder / spec_file_name(name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(spec.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        paths[name] = path
    return paths

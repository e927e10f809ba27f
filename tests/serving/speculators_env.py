"""Import the ``speculators`` package (0.9.0, installed with ``pip install --no-deps``) in accel's test environment,
and build tiny EAGLE-3 checkpoints with it.

``import speculators`` imports the package's training-data pipeline at package level
(``speculators.models.eagle3.data`` -> ``speculators.train.data``), which imports ``openai``, ``datasets`` (pyarrow,
pandas, ...) and ``hs_connectors``. None of them is used by what the tests call (the config classes, the model's
``__init__`` / ``forward`` / ``save_pretrained`` / ``from_pretrained``). While ``speculators`` is imported, each of them
that is not installed is stood in by an empty module whose attributes are inert classes (instantiating one raises
ImportError); the stand-ins are removed from ``sys.modules`` right after, so nothing else sees them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

#: the training-pipeline imports of speculators 0.9.0 that its model code does not use
TRAINING_ONLY = ("openai", "datasets", "hs_connectors")


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the ``TRAINING_ONLY`` packages (and their submodules) that are not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def __getattr__(attr: str):
            def refuse(*args, **kwargs):
                raise ImportError(f"{spec.name} is not installed (speculators' training pipeline is not available)")

            return type(attr, (), {"__init__": refuse})

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:
        return None


def import_speculators():
    """The ``speculators`` package, or a pytest skip when it is not installed."""
    if "speculators" in sys.modules:
        return sys.modules["speculators"]
    if importlib.util.find_spec("speculators") is None:
        pytest.skip("speculators is not installed (pip install --no-deps speculators==0.9.0)", allow_module_level=True)
    absent = tuple(n for n in TRAINING_ONLY if importlib.util.find_spec(n) is None)
    finder = _Absent(absent)
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module("speculators")
        importlib.import_module("speculators.models.eagle3")
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in absent]:
            del sys.modules[name]
    return module


def build_eagle3(
    verifier: Path,
    out: Path,
    *,
    layer_ids: list[int],
    draft_vocab: int,
    seed: int = 0,
    std: float = 0.2,
    layers: int = 1,
    draft_ids: torch.Tensor | None = None,
    fit: Callable[[Any], None] | None = None,
    **flags: bool,
) -> Path:
    """A random EAGLE-3 head for the HF checkpoint ``verifier``, built and saved by speculators itself: vocabulary
    maps for ``draft_vocab`` target tokens (``draft_ids``, else random; none when it is the target's), embeddings and
    head rows loaded from the verifier by the package, the other weights ~ N(0, std) (norm gains ~ 1 + N(0, 0.1));
    ``fit(model)`` may then change the weights before saving; ``flags``: the ``Eagle3SpeculatorConfig`` norm
    options. Returns ``out``."""
    import_speculators()
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(verifier)
    tcfg.num_hidden_layers = layers
    tcfg._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tcfg,
        draft_vocab_size=draft_vocab,
        eagle_aux_hidden_state_layer_ids=layer_ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(verifier)),
        ),
        **flags,
    )
    model = Eagle3DraftModel(config)
    vocab = tcfg.vocab_size
    gen = torch.Generator().manual_seed(seed)
    if draft_vocab < vocab:
        ids = torch.randperm(vocab, generator=gen)[:draft_vocab] if draft_ids is None else torch.as_tensor(draft_ids)
        ids = ids.sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        model.load_vocab_mappings(t2d, ids - torch.arange(draft_vocab))
    model.load_verifier_weights()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("layers.", "fc.", "input_norm", "fc_norm", "norm.")):
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                else:
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
    if fit is not None:
        fit(model.eval())
    model.save_pretrained(out)
    return out


def load_eagle3(path: Path):
    """The speculators package's own loaders on ``path``: config, then model (eager attention, eval mode)."""
    import_speculators()
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = "eager"
    return SpeculatorModel.from_pretrained(path, config=config).eval()

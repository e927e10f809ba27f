"""``distill_hydra``: target-written data -> the target's hidden states -> trained Hydra heads, in one resumable run
(what ``accel distill-hydra`` runs; ``examples/build_hydra_heads.py`` runs the same stages with its own data).

Work files live in ``<out>/.hydra/``: the data shards (``data/``, ``accel.drafts.distill_data``), their hidden states
(``features/``) and the training state. With two or more shards the last one is held out: the best heads are those
with the most tokens per greedy tree round on its rows (``evaluate_heads``; its sampled rows make this an estimate).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from accel._io import check_output_path, writing
from accel.drafts.checkpoint import load_model
from accel.drafts.config import DistillConfig
from accel.drafts.distill_data import build_data
from accel.drafts.hydra.config import HydraReport, HydraSpec, HydraTrainConfig
from accel.drafts.hydra.data import ShardBatches, feature_shards, load_shard
from accel.drafts.hydra.evaluate import evaluate_heads
from accel.drafts.hydra.model import HydraHeads, build_hydra
from accel.drafts.hydra.train import STATE_DIR, train_hydra
from accel.drafts.hydra.tree import TreeShape
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["distill_hydra", "most_predicted_tokens", "shard_eval"]


def most_predicted_tokens(pairs: list[tuple[Path, Path]], n: int, vocab_size: int) -> torch.Tensor:
    """The ``n`` token ids the target predicts most often (its top-1 over every masked position of the data shards),
    sorted ascending."""
    from safetensors.torch import load_file

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for data_path, _ in pairs:
        t = load_file(str(data_path))
        counts += torch.bincount(t["topk_ids"][..., 0][t["mask"].bool()].long(), minlength=vocab_size)
    return torch.sort(torch.argsort(counts, descending=True, stable=True)[:n]).values


def shard_eval(pair: tuple[Path, Path], shape: TreeShape, max_rows: int = 16):
    """``eval_fn(heads) -> tokens per greedy tree round`` on (up to ``max_rows`` of) one shard's rows, teacher-forced
    on their own tokens (``evaluate_heads``)."""
    shard = load_shard(*pair)
    seqs, hidden = [], []
    for row in range(min(max_rows, shard["tokens"].shape[0])):
        used = shard["mask"][row].nonzero()
        if used.numel() < 3:
            continue
        end = int(used.max()) + 2
        seqs.append(shard["tokens"][row, :end])
        hidden.append(shard["hidden"][row, :end].float())
    if not seqs:
        raise DraftError(f"the held-out shard {pair[0]} has no sequence of 4 or more tokens")

    def score(heads: HydraHeads) -> float:
        depth = min(shape.depth, heads.config.num_heads)
        tree = TreeShape(depth=depth, top_k=shape.top_k, beam=shape.beam, budget=shape.budget)
        return evaluate_heads(heads, seqs, [2] * len(seqs), hidden, shape=tree).tree_tokens_per_call

    return score


def distill_hydra(
    target: Decoder | str | Path,
    out_dir: str | Path,
    spec: HydraSpec | None = None,
    data: DistillConfig | None = None,
    train: HydraTrainConfig | None = None,
    *,
    tokenizer_dir: str | Path | None = None,
) -> HydraReport:
    """Train Hydra heads for ``target`` into ``out_dir``: ``spec`` says which heads, ``data`` which target-written data
    (its data fields: prompts, ``self_generate``, ``gen_tokens``, ``temperatures``, ``data_files``, ...; the draft
    architecture fields are unused), ``train`` the optimisation. ``train.resume`` continues an interrupted run and
    reuses its data; without it the work files are rebuilt. Returns the ``HydraReport``."""
    spec, data, train = spec or HydraSpec(), data or DistillConfig(), train or HydraTrainConfig()
    if train.threads:
        torch.set_num_threads(train.threads)
    out = check_output_path(out_dir, "the Hydra heads", DraftError, folder=True)  # before the target is read
    work = out / STATE_DIR
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else (None if isinstance(target, Decoder) else Path(target))
    target_model = load_model(target, "target")
    if not train.resume and work.exists():
        shutil.rmtree(work)
    t0 = time.perf_counter()
    build_data(target_model, data, work / "data", tok_dir)
    pairs = feature_shards(target_model, work / "data", work / "features", progress=train.progress)
    data_s = time.perf_counter() - t0
    held = pairs[-1] if len(pairs) >= 2 else None
    train_pairs = pairs[:-1] if held else pairs
    vocab = target_model.config.vocab_size
    head_ids = most_predicted_tokens(train_pairs, spec.head_vocab, vocab) if 0 < spec.head_vocab < vocab else None
    heads = build_hydra(
        target_model,
        num_heads=spec.num_heads,
        mlp_layers=spec.mlp_layers,
        prefix=spec.prefix,
        head_ids=head_ids,
        seed=train.seed,
    )
    eval_fn = shard_eval(held, TreeShape(depth=spec.num_heads)) if held else None
    report = train_hydra(heads, ShardBatches(train_pairs, train.batch_rows, train.seed), out, train, eval_fn)
    report = report.model_copy(update={"data_time_s": data_s})
    with writing(out, "the Hydra report", DraftError):
        (out / "hydra_report.json").write_text(report.model_dump_json(indent=2))
    return report

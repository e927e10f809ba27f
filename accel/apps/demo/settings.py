"""The demo's fixed settings: held-out prompts, the hardware it predicts, the shipped drafts."""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "demo_data"  # accel/demo_data: the drafts and heads shipped with accel

__all__ = [
    "AUTOTUNE_MODE",
    "AUTOTUNE_NODES",
    "DEMO_PROMPTS",
    "HARDWARE",
    "LOOKUP_MODE",
    "TREE_MODE",
    "TREE_NODES",
    "default_draft_dir",
    "default_feature_draft_dir",
]

# held-out prompts (not in the draft's training prompts): code and chat, in SmolLM2's ChatML template where chat
DEMO_PROMPTS: tuple[tuple[str, str], ...] = (
    (
        "code",
        "<|im_start|>user\nWrite a Python function that returns the sum of the squares of a list of numbers."
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "chat",
        "<|im_start|>user\nWhat is the difference between a compiler and an interpreter?<|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
    ("code", "def bubble_sort(items):\n"),
)
HARDWARE = ("cloud-ai-100-standard", "cloud-ai-100-pro", "cloud-ai-100-ultra", "a100-80gb")
LOOKUP_MODE = "feature SpD greedy+lookup"  # the feature draft, plus n-gram lookup drafts where the text repeats
TREE_NODES = 4  # node budget of the feature draft's dynamic tree (accel.spd.DraftTree) in the demo
TREE_MODE = f"feature SpD tree({TREE_NODES}) greedy"  # the feature draft's dynamic token tree, greedy
AUTOTUNE_NODES = 8  # the largest budget the demo's controller may choose (accel.spd.autotune.AutoTune)
# the controller over the feature draft's shapes (lookup then a chain, the chain, a tree of up to AUTOTUNE_NODES nodes
# merged with lookup, the lookup alone), its shape and size chosen every round
AUTOTUNE_MODE = f"feature SpD autotune(<={AUTOTUNE_NODES})"


def default_draft_dir() -> Path:
    """The shipped demo draft (``accel/demo_data/smollm2-draft``)."""
    return SHIPPED / "smollm2-draft"


def default_feature_draft_dir() -> Path:
    """The shipped feature draft (reads the target's hidden states): ``accel/demo_data/smollm2-feature-draft``."""
    return SHIPPED / "smollm2-feature-draft"

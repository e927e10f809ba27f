"""The import rule: each accel package imports only its own layer and the layers below it, function-level imports
included; the applications (``accel.apps``, ``accel.cli``) sit on top and nothing imports them. Checked on the
source with ``ast`` (nothing is imported), and shown to fail on a planted upward import."""

from __future__ import annotations

import ast
from pathlib import Path

import accel

#: bottom to top; a package may import its own layer and every layer before it
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_lazy", "_io"),  # the base: exceptions, the lazy-attribute helper, checked output paths
    ("formats",),  # MX codecs and the fused kernel
    ("models",),  # configs, the torch decoder, checkpoint loading
    ("backends",),  # ONNX export, onnxruntime / torch / Cloud AI 100 runtimes
    ("sim",),  # the roofline simulator (its host profile times ONNX graphs)
    ("spd",),  # speculative decoding: proposers, verification, the loop
    ("drafts",),  # draft models, feature drafts, Hydra heads, exit heads
    ("superposed",),  # superposed decoding and its n-gram store
    ("serving",),  # artefacts for serving engines
    ("decode",),  # DecodeSpec and build(spec): the one recipe
    ("apps", "cli"),  # applications: the command line and the demo
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = Path(accel.__file__).resolve().parent


def _imported(node: ast.AST) -> list[str]:
    """First-party packages an import node names (``accel.X...`` -> ``X``; ``from accel import X`` -> ``X``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == "accel":
            return [a.name for a in node.names if a.name in RANK]  # accel.__version__ and the like: the package
        names = [node.module]
    else:
        return []
    return [n.split(".")[1] for n in names if n.startswith("accel.")]


def violations(root: Path) -> list[str]:
    """``file: imports accel.X (layer of X above the file's)`` for every upward import under ``root`` (an accel
    package directory); a package missing from ``LAYERS`` is reported too."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts == ("__init__.py",):
            continue
        own = rel.parts[0].removesuffix(".py")
        if own not in RANK:
            found.append(f"{rel}: package {own!r} has no layer in tests/test_layers.py")
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for pkg in _imported(node):
                if RANK.get(pkg, len(LAYERS)) > RANK[own]:
                    found.append(f"{rel}:{node.lineno}: imports accel.{pkg} (a layer above {own})")
    return found


def test_no_package_imports_upward():
    assert violations(ROOT) == []


def test_a_planted_upward_import_is_found(tmp_path):
    (tmp_path / "formats").mkdir()
    (tmp_path / "formats" / "fine.py").write_text("from accel.errors import FormatError\n")
    (tmp_path / "formats" / "bad.py").write_text("def f():\n    from accel.spd import generate\n")
    (tmp_path / "spd").mkdir()
    (tmp_path / "spd" / "worse.py").write_text("import accel.apps.generate\n")
    (tmp_path / "newpkg").mkdir()
    (tmp_path / "newpkg" / "x.py").write_text("")
    found = violations(tmp_path)
    assert len(found) == 3, found
    assert any("formats/bad.py:2: imports accel.spd" in f for f in found)
    assert any("spd/worse.py:1: imports accel.apps" in f for f in found)
    assert any("'newpkg' has no layer" in f for f in found)


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {
        p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"
    }
    assert packages <= set(RANK) | {"demo_data"}, packages - set(RANK)

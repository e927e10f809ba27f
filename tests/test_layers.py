"""The import rule: each accel package imports only its own layer and the layers below it, function-level imports
included; the applications (``accel.apps``, ``accel.cli``) sit on top and nothing imports them. First-party imports
go at the module top: in the engine packages a function-level one is debt (``LOCAL_IMPORTS``, which may shrink but
not grow) and says why it stays local. Checked on the source with ``ast`` (nothing is imported), and shown to fail on
a planted upward import and a planted function-level import."""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
from pathlib import Path

import accel

#: bottom to top; a package may import its own layer and every layer before it
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_lazy", "_io", "_legacy"),  # the base: exceptions, lazy attributes, checked output paths, old keywords
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


#: function-level first-party imports per engine package today: a ratchet (lower an entry when one moves to the
#: module top; never raise one). Each one left says why on its line, or in a comment right above its run of imports
LOCAL_IMPORTS: dict[str, int] = {
    "formats": 0,
    "models": 4,
    "backends": 0,
    "sim": 2,
    "spd": 0,
    "drafts": 3,
    "superposed": 3,
    "serving": 2,
}
#: why an import may stay in a function: the imported module needs torch or another optional extra the importing
#: one must not; a module-top import would close an import cycle; an upward import for a plugin hook; keeping a
#: heavy module off a start-up path (``accel --help``)
REASON = re.compile(r"#.*\b(torch-optional|optional extra|import cycle|upward|start-up)\b")
#: (file, imported module) of local imports not yet explained: in files being reworked elsewhere (move them up)
UNEXPLAINED: set[tuple[str, str]] = set()


def _first_party(node: ast.AST) -> str | None:
    """The first-party module an import node names (``import accel.x`` / ``from accel.x import y`` -> ``accel.x``;
    a relative import counts too), else None."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name == "accel" or a.name.startswith("accel.")]
        return names[0] if names else None
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return "." * node.level + (node.module or "")
        if node.module and (node.module == "accel" or node.module.startswith("accel.")):
            return node.module
    return None


def _comment_above(lines: list[str], node: ast.stmt) -> list[str]:
    """The comment lines right above ``node`` (no blank line between)."""
    out, i = [], node.lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i])
        i -= 1
    return out


def local_imports(root: Path, packages: tuple[str, ...] = tuple(LOCAL_IMPORTS)) -> list[tuple[str, int, str, bool]]:
    """``(file, line, module, says why)`` of every first-party import inside a function (nested ones included) of
    ``packages`` under ``root`` (an accel package directory). It says why when a ``REASON`` comment is on its lines
    or right above it or above an import before it in the same run of import statements."""
    found = []

    def visit(node: ast.AST, in_function: bool, rel: str, lines: list[str]) -> None:
        for _, value in ast.iter_fields(node):
            run: list[ast.stmt] = []  # the import statements just before, in this block
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                run = [*run, child] if isinstance(child, (ast.Import, ast.ImportFrom)) else []
                module = _first_party(child) if in_function else None
                if module is not None:
                    assert isinstance(child, ast.stmt) and child.end_lineno is not None
                    said = [lines[i - 1] for i in range(child.lineno, child.end_lineno + 1)]
                    said += [c for s in run for c in _comment_above(lines, s)]
                    found.append((rel, child.lineno, module, any(REASON.search(c) for c in said)))
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, inner, rel, lines)

    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            visit(ast.parse(text, str(path)), False, path.relative_to(root).as_posix(), text.splitlines())
    return found


def local_import_problems(
    found: list[tuple[str, int, str, bool]], allowed: dict[str, int], unexplained: Collection[tuple[str, str]] = ()
) -> list[str]:
    """What breaks the rule in ``found`` (``local_imports``): an import that does not say why (unless listed in
    ``unexplained``), a package over its ``allowed`` count, and an entry of ``allowed`` or ``unexplained`` that can be
    lowered or dropped."""
    out = [
        f"{rel}:{line}: imports {module} inside a function: move it to the module top, or say why it stays "
        "(# torch-optional / optional extra / import cycle / upward / start-up: ...)"
        for rel, line, module, why in found
        if not why and (rel, module) not in unexplained
    ]
    for pkg, cap in allowed.items():
        n = sum(rel.split("/")[0] == pkg for rel, *_ in found)
        if n > cap:
            out.append(f"{pkg}: {n} function-level first-party imports, over the {cap} allowed: move them to the top")
        elif n < cap:
            out.append(f"{pkg}: {n} function-level first-party imports: lower its LOCAL_IMPORTS entry from {cap}")
    still = {(rel, module) for rel, _, module, why in found if not why}
    out += [
        f"{rel}: {module} is no longer an unexplained local import: drop it from UNEXPLAINED"
        for rel, module in sorted(set(unexplained) - still)
    ]
    return out


def test_first_party_imports_are_at_module_top():
    assert local_import_problems(local_imports(ROOT), LOCAL_IMPORTS, UNEXPLAINED) == []


def test_a_planted_function_level_import_is_found(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "ok.py").write_text(
        "from accel.errors import SimError\n\n"
        "def f():\n    import json\n\n    # import cycle: accel.sim.b imports this module\n"
        "    from accel.sim.b import g\n    from accel.sim.c import h\n\n"
        "def k():\n    import accel.formats  # torch-optional: stands in for a torch module\n"
    )
    (tmp_path / "sim" / "bad.py").write_text(
        "def f():\n    x = 1  # import cycle (a comment on code, not on an import)\n    from accel.sim.b import g\n"
        "    class C:\n        def m(self):\n            from . import c\n"
    )
    found = local_imports(tmp_path, ("sim",))
    assert [(rel, line, why) for rel, line, _, why in found] == [
        ("sim/bad.py", 3, False),
        ("sim/bad.py", 6, False),
        ("sim/ok.py", 7, True),
        ("sim/ok.py", 8, True),
        ("sim/ok.py", 11, True),
    ]
    out = local_import_problems(found, {"sim": 4})
    assert len(out) == 3, out
    assert out[0].startswith("sim/bad.py:3: imports accel.sim.b inside a function")
    assert out[1].startswith("sim/bad.py:6: imports . inside a function")
    assert out[2].startswith("sim: 5 function-level first-party imports, over the 4 allowed")
    pending = {("sim/bad.py", "accel.sim.b"), ("sim/bad.py", ".")}
    assert local_import_problems(found, {"sim": 5}, pending) == []
    assert local_import_problems(found, {"sim": 6}, {*pending, ("sim/ok.py", "accel.sim.c")}) == [
        "sim: 5 function-level first-party imports: lower its LOCAL_IMPORTS entry from 6",
        "sim/ok.py: accel.sim.c is no longer an unexplained local import: drop it from UNEXPLAINED",
    ]

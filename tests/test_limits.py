"""Size limits of the engine packages (CONTRIBUTING.md, "Rules"): no function over 60 lines and no signature over 8
parameters (``self``/``cls`` not counted). ``DEBT`` lists the functions over a limit today with their size: they may
shrink (then the entry is lowered or removed) but not grow, and no other function may pass a limit. Checked on the
source with ``ast``, and shown to fail on a planted violation."""

from __future__ import annotations

import ast
from pathlib import Path

import accel

ENGINE = ("formats", "models", "backends", "sim", "spd", "drafts", "superposed", "serving", "decode")
MAX_LINES, MAX_PARAMS = 60, 8
ROOT = Path(accel.__file__).resolve().parent

#: "module:qualified name" -> (lines, parameters) of each function over a limit today (to be split or given typed
#: option objects; issue "One typed decode recipe")
DEBT: dict[str, tuple[int, int]] = {
    "sim.catalog:_gpu": (37, 13),
    "sim.published:_qc": (24, 9),
}


def sizes(root: Path, packages: tuple[str, ...] = ENGINE) -> dict[str, tuple[int, int]]:
    """``"module:qualname" -> (lines, parameters)`` of every function and method under ``root``'s ``packages``."""
    found: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, module, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                params -= bool(a.args and a.args[0].arg in ("self", "cls"))
                if any(ast.unparse(d) == "triton.jit" for d in child.decorator_list):
                    params = 0  # a Triton kernel's arguments are its launch ABI (pointers, sizes, constexpr flags)
                assert child.end_lineno is not None
                found[f"{module}:{prefix}{child.name}"] = (child.end_lineno - child.lineno + 1, params)
                visit(child, module, f"{prefix}{child.name}.")

    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
            visit(ast.parse(path.read_text(encoding="utf-8")), module, "")
    return found


def problems(found: dict[str, tuple[int, int]], debt: dict[str, tuple[int, int]]) -> list[str]:
    """Functions over a limit and not in ``debt``, ``debt`` entries that grew, and stale ``debt`` entries."""
    out = []
    for name, (lines, params) in found.items():
        cap = debt.get(name, (MAX_LINES, MAX_PARAMS))
        limit = (max(cap[0], MAX_LINES), max(cap[1], MAX_PARAMS))
        if lines > limit[0] or params > limit[1]:
            out.append(f"{name}: {lines} lines, {params} parameters (limit {limit[0]} / {limit[1]})")
    for name, cap in debt.items():
        now = found.get(name)
        if now is None or (now[0] <= MAX_LINES and now[1] <= MAX_PARAMS):
            out.append(f"{name}: in DEBT but {'gone' if now is None else 'within the limits'}: remove the entry")
        elif now != cap and now[0] <= cap[0] and now[1] <= cap[1]:
            out.append(f"{name}: shrank to {now}: lower its DEBT entry from {cap}")
    return out


def test_engine_functions_keep_within_the_limits():
    assert problems(sizes(ROOT), DEBT) == []


def test_a_planted_long_or_wide_function_fails(tmp_path):
    (tmp_path / "spd").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "spd" / "m.py").write_text(
        f"def long():\n{body}\n\ndef wide(a, b, c, d, e, f, g, h, i):\n    pass\n\n"
        "class C:\n    def ok(self, a, b, c, d, e, f, g, h):\n        pass\n"
    )
    found = sizes(tmp_path, ("spd",))
    out = problems(found, {})
    assert len(out) == 2 and any("spd.m:long: 62 lines" in p for p in out) and any("spd.m:wide" in p for p in out)
    assert problems(found, {"spd.m:long": (62, 0), "spd.m:wide": (2, 9)}) == []
    assert problems(found, {"spd.m:long": (70, 0), "spd.m:wide": (2, 9), "spd.m:gone": (99, 1)}) == [
        "spd.m:long: shrank to (62, 0): lower its DEBT entry from (70, 0)",
        "spd.m:gone: in DEBT but gone: remove the entry",
    ]

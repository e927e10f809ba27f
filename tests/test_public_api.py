"""The public API: docs/api.md and the ``__all__`` of ``accel`` and each of its packages list the same names, every
listed name resolves, and renamed names keep working for one release with a DeprecationWarning naming the
replacement (docs/api.md, "Deprecated names")."""

from __future__ import annotations

import importlib
import pkgutil
import re
import warnings
from pathlib import Path

import pytest

import accel

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
_MODULE_HEADING = re.compile(r"^## `(accel[\w.]*)`\s*$")
_NAME_ROW = re.compile(r"^\| `([^`]+)` \|")
_DEPRECATED_HEADING = "## Deprecated names"
_DEPRECATED_ROW = re.compile(r"^\| `(accel[\w.]*)` \| `(accel[\w.]*)` \| ([\w.]+) \|")


def parse_api_doc(text: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(names listed per package, deprecated name -> replacement) from the text of docs/api.md."""
    listed: dict[str, list[str]] = {}
    deprecated: dict[str, str] = {}
    section: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = _MODULE_HEADING.match(line)
            section = heading.group(1) if heading else line.strip()
            if heading:
                listed.setdefault(section, [])
            continue
        if section == _DEPRECATED_HEADING and (row := _DEPRECATED_ROW.match(line)):
            deprecated[row.group(1)] = row.group(2)
        elif section in listed and (row := _NAME_ROW.match(line)):
            listed[section].append(row.group(1))
    return listed, deprecated


def public_packages() -> list[str]:
    """``accel`` and every package below it whose dotted name has no part starting with ``_``."""
    found = [m.name for m in pkgutil.walk_packages(accel.__path__, "accel.") if m.ispkg]
    return ["accel", *sorted(n for n in found if not any(p.startswith("_") for p in n.split(".")))]


def api_mismatches(package: str, exported: list[str], documented: list[str]) -> list[str]:
    """What differs between a package's ``__all__`` and its section of docs/api.md (empty when they agree)."""
    problems = [f"{package}: {n!r} is in __all__ but not in docs/api.md" for n in exported if n not in documented]
    problems += [f"{package}: {n!r} is in docs/api.md but not in __all__" for n in documented if n not in exported]
    problems += [f"{package}: {n!r} twice in __all__" for n in set(exported) if exported.count(n) > 1]
    problems += [f"{package}: {n!r} twice in docs/api.md" for n in set(documented) if documented.count(n) > 1]
    return problems


LISTED, DEPRECATED = parse_api_doc(API_DOC.read_text(encoding="utf-8"))


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_public_package_has_a_section():
    assert set(LISTED) == set(public_packages()), (
        f"packages without a section in docs/api.md: {sorted(set(public_packages()) - set(LISTED))}; "
        f"sections for no package: {sorted(set(LISTED) - set(public_packages()))}"
    )


@pytest.mark.parametrize("package", public_packages())
def test_all_agrees_with_api_doc(package):
    module = importlib.import_module(package)
    assert hasattr(module, "__all__"), f"{package} has no __all__"
    assert api_mismatches(package, list(module.__all__), LISTED.get(package, [])) == []


@pytest.mark.parametrize("package", public_packages())
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ names what {package} does not have: {missing}"


def test_the_check_fails_on_a_name_missing_from_either_side():
    listed, _ = parse_api_doc(API_DOC.read_text(encoding="utf-8").replace("| `load_checkpoint` |", "| gone |"))
    exported = list(importlib.import_module("accel.models").__all__)
    assert api_mismatches("accel.models", exported, listed["accel.models"]) == [
        "accel.models: 'load_checkpoint' is in __all__ but not in docs/api.md"
    ]
    assert api_mismatches("accel.models", [*exported, "load"], listed["accel.models"] + ["load_checkpoint"]) == [
        "accel.models: 'load' is in __all__ but not in docs/api.md"
    ]
    assert api_mismatches("accel.models", exported[1:], listed["accel.models"] + ["load_checkpoint"]) == [
        f"accel.models: {exported[0]!r} is in docs/api.md but not in __all__"
    ]


def test_deprecated_names_are_those_the_code_keeps():
    in_code = {
        f"{package}.{old}": f"{package}.{new}"
        for package in public_packages()
        for old, (_, new) in getattr(importlib.import_module(package), "_DEPRECATED", {}).items()
    }
    assert in_code == DEPRECATED
    assert {"accel.models.load": "accel.models.load_checkpoint"}.items() <= DEPRECATED.items()


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED.items()))
def test_deprecated_name_works_and_warns_with_its_replacement(old, new):
    package, _, name = old.rpartition(".")
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=re.escape(new)) as caught:
        value = getattr(module, name)
    assert value is _resolve(new)
    assert Path(caught[0].filename) == Path(__file__)  # the warning points at the caller's line
    assert name not in module.__all__
    assert name not in LISTED[package]


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED.items()))
def test_deprecated_name_imports_with_from(old, new):
    package, _, name = old.rpartition(".")
    scope: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=re.escape(new)):
        exec(f"from {package} import {name}", scope)
    assert scope[name] is _resolve(new)


def test_deprecated_load_loads_a_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from accel.models import ModelConfig, load_checkpoint
    from accel.models.random_checkpoint import write_random_checkpoint

    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    path = write_random_checkpoint(config, tmp_path / "tiny")
    with pytest.warns(DeprecationWarning, match=r"accel\.models\.load_checkpoint"):
        old = accel.models.load(path)
    new = load_checkpoint(path)
    assert old.config == new.config
    for (name, a), (_, b) in zip(old.state_dict().items(), new.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_public_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for package in public_packages():
            module = importlib.import_module(package)
            for name in module.__all__:
                getattr(module, name)


def test_unknown_names_still_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        accel.models.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        accel.no_such_name  # noqa: B018

"""The Python blocks of README.md and docs/*.md run as written, offline, in a few seconds each.

Convention: every block fenced as ```python runs, each in a fresh interpreter in an empty directory; a block whose
lines start with ``>>>`` runs as a doctest (its printed output is checked too). A block that cannot run as written
(placeholder paths or objects, network, big downloads, minutes of work) is preceded by an HTML comment on the line
before its fence, which Markdown does not show::

    <!-- no-run: a checkpoint path of yours -->

The import statements of every block run anyway, so a documented name that moved or was renamed fails here too.
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_RUN = re.compile(r"^<!-- no-run: (\S.*?) -->$")
#: docs whose illustrative blocks are not marked with ``no-run`` yet: only their imports are checked. Remove a doc
#: from here once each of its blocks runs or is marked.
PENDING = {
    "docs/drafts.md": "illustrative blocks (placeholder paths) not marked no-run yet",
    "docs/formats.md": "illustrative blocks (undefined `weight`, `model`, `w`, `x`) not marked no-run yet",
    "docs/ppd.md": "illustrative blocks (undefined `model`, `front`, `back`) not marked no-run yet",
    "docs/spd.md": "illustrative block (`target.onnx`, `prompt_ids`) not marked no-run yet",
    "docs/superposed.md": "illustrative blocks (undefined `ckpt`, `model`, `prompt_ids`) not marked no-run yet",
}
#: a guard against a hung snippet, not a speed check (each runs in a few seconds)
HANG_TIMEOUT_S = 300


@dataclass(frozen=True)
class Snippet:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    code: str
    no_run: str | None  # the reason given, or None when the block runs

    @property
    def is_doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")

    def source(self) -> str:
        """The block as Python source (a doctest's examples, without their expected output)."""
        if not self.is_doctest:
            return self.code
        return "".join(e.source for e in doctest.DocTestParser().get_examples(self.code))


def parse_snippets(doc: str, text: str) -> list[Snippet]:
    """Every ```python block of a Markdown text, with the reason of a ``no-run`` comment on the line before it."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = NO_RUN.match(lines[i - 1].strip()) if i else None
        found.append(Snippet(doc, i + 1, "\n".join(lines[i + 1 : end]) + "\n", marker.group(1) if marker else None))
        i = end + 1
    return found


def _all_snippets() -> list[Snippet]:
    return [s for p in DOCS for s in parse_snippets(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))]


SNIPPETS = _all_snippets()
RUNNABLE = [s for s in SNIPPETS if s.no_run is None and s.doc not in PENDING]


def _id(s: Snippet) -> str:
    return f"{s.doc}:{s.line}"


def test_docs_have_runnable_snippets():
    assert {s.doc for s in RUNNABLE} >= {"README.md", "docs/api.md", "docs/sim.md"}


@pytest.mark.parametrize("snippet", SNIPPETS, ids=_id)
def test_snippet_imports_resolve(snippet):
    tree = ast.parse(snippet.source(), filename=_id(snippet))
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    exec(compile(ast.Module(body=imports, type_ignores=[]), _id(snippet), "exec"), {})


@pytest.mark.parametrize("snippet", RUNNABLE, ids=_id)
def test_snippet_runs(snippet, tmp_path):
    if snippet.is_doctest:
        (tmp_path / "snippet.txt").write_text(snippet.code, encoding="utf-8")
        command = [sys.executable, "-m", "doctest", "snippet.txt"]
    else:
        (tmp_path / "snippet.py").write_text(snippet.code, encoding="utf-8")
        command = [sys.executable, "snippet.py"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, f"{_id(snippet)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_no_run_markers_sit_on_a_python_block():
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "no-run" in line:
                where = f"{path.relative_to(ROOT)}:{i + 1}"
                assert NO_RUN.match(line.strip()), f"{where}: write it as <!-- no-run: REASON -->"
                assert i + 1 < len(lines) and lines[i + 1].strip() == "```python", f"{where}: not before ```python"


def test_pending_docs_still_have_unmarked_blocks():
    for doc in PENDING:
        assert any(s.doc == doc and s.no_run is None for s in SNIPPETS), f"{doc} is done: remove it from PENDING"


def test_parser_finds_markers_and_doctests():
    text = "# t\n\n<!-- no-run: needs a GPU -->\n```python\nimport x\n```\n\n```python\n>>> 1 + 1\n2\n```\n"
    marked, doctest_block = parse_snippets("t.md", text)
    assert (marked.line, marked.no_run, marked.code) == (4, "needs a GPU", "import x\n")
    assert (doctest_block.no_run, doctest_block.is_doctest, doctest_block.source()) == (None, True, "1 + 1\n")

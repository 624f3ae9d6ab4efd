"""The run context (harness.run.context) has one builder and, per field, one writer: the file WRITTEN_BY names.

Read from the sources: every assignment to a RunContext field through a context (`ctx.X = ...`, `c.X += ...`,
`self.ctx.X = ...`, tuple targets too) in harness/ and arms/, and every `RunContext(...)` call."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict

from harness.run.context import WRITTEN_BY, RunContext
from tests.conftest import REPO

CONTEXT_NAMES = {"ctx", "c", "context"}  # what the harness calls a RunContext in a function
BUILDER = "harness/run/recipe.py"


def _is_context(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in CONTEXT_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr == "ctx")


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        out = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        out = [node.target]
    else:
        return []
    flat = []
    while out:
        t = out.pop()
        flat.extend(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else flat.append(t)
    return flat


def writers(sources: dict[str, str]) -> tuple[dict[str, set[str]], set[str]]:
    """({field: the files that assign it through a context}, {the files that call RunContext(...)})."""
    fields = {f.name for f in dataclasses.fields(RunContext)}
    out, builders = defaultdict(set), set()
    for rel, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            for t in _targets(node):
                if isinstance(t, ast.Attribute) and t.attr in fields and _is_context(t.value):
                    out[t.attr].add(rel)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RunContext":
                builders.add(rel)
    return out, builders


def _sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for pkg in ("harness", "arms") for p in (REPO / pkg).rglob("*.py")}


def test_every_field_of_the_run_context_has_its_one_writer():
    found, builders = writers(_sources())
    assert builders == {BUILDER}, f"RunContext is built in {sorted(builders)}: only {BUILDER} builds it"
    assert set(WRITTEN_BY) == {f.name for f in dataclasses.fields(RunContext)}, "WRITTEN_BY names every field"
    wrong = {k: sorted(v) for k, v in found.items() if v != ({WRITTEN_BY[k]} if WRITTEN_BY[k] != "-" else set())}
    assert not wrong, f"fields written outside their one writer (harness.run.context.WRITTEN_BY): {wrong}"
    # every named writer does write its field (the map says where to look, not where one might)
    unused = {k: w for k, w in WRITTEN_BY.items() if w != "-" and k not in found}
    assert not unused, unused


def test_a_second_writer_is_found():
    """The scan on made-up sources: a second file writing tokens_used, through a tuple and self.ctx, is named."""
    found, builders = writers({
        "harness/accounting/ledger.py": "def f(ctx):\n    ctx.tokens_used += 1\n",
        "harness/elsewhere.py": "def g(self):\n    self.ctx.halted, x = {}, 1\n    c.tokens_used = 0\n"
                                "    ctx = RunContext(run_dir=None, plan=None)\n",
    })
    assert found["tokens_used"] == {"harness/accounting/ledger.py", "harness/elsewhere.py"}
    assert found["halted"] == {"harness/elsewhere.py"}
    assert builders == {"harness/elsewhere.py"}

"""The layout a newcomer can carry: no import cycle among harness/ and arms/, no function over ~80 lines
and no file over ~500 lines (outside the listed exceptions), and the parent plan shown by mode=plan."""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO, run_harness

PACKAGES = ("harness", "arms")
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500
#: (file, function) -> why it stays long. Keep this list short; each entry is a decision, not an oversight.
LONG_FUNCTIONS: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (REPO / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of harness/ and arms/ it imports, at any depth of its code (lazy imports count)."""
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycle_among_harness_and_arms():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_lazy_imports():
    g = import_graph()
    assert "harness.config.compose" in g["harness.plan"]  # imported inside sft_parent
    assert "arms.common" in g["arms"] and "harness.config.fields" in g["arms.grpo.config"]


def test_no_long_functions_or_files():
    long_functions, long_files = [], []
    for name, path in modules().items():
        text = path.read_text()
        rel = path.relative_to(REPO).as_posix()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long_files, long_files
    assert not long_functions, long_functions


def test_mode_plan_shows_the_sft_parent_under_the_child(tmp_path):
    proc = run_harness("mode=plan", f"output_root={tmp_path}", "arm=grpo", "seed=3", "arm.learning_rate=3e-4",
                       timeout=60)
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout)
    parent = child["parent"]
    assert child["kind"] == "rl" and parent["kind"] == "sft" and parent["parent"] is None
    assert parent["run_dir"] == str(tmp_path / "runs" / parent["run_name"]) and parent["run_name"].startswith("sft-")
    assert parent["identity"]["semantic_sha256"] and parent["config"]["seed"] == 3
    assert parent["config"]["budget"]["max_steps"] == child["config"]["budget"]["sft_warm_start_steps"]
    assert parent["config"]["arm"]["learning_rate"] != 3e-4  # the child's arm.* overrides are not the parent's
    assert not (tmp_path / "runs").exists()  # mode=plan writes nothing
    scratch = json.loads(run_harness("mode=plan", f"output_root={tmp_path}", "arm.init=scratch", timeout=60).stdout)
    sft = json.loads(run_harness("mode=plan", f"output_root={tmp_path}", "arm=sft", timeout=60).stdout)
    assert scratch["parent"] is None and sft["parent"] is None and sft["kind"] == "sft"

"""The layout a newcomer can carry: no import cycle among harness/ and arms/, no function over ~80 lines
and no file over ~500 lines (outside the listed exceptions), and the parent plan shown by mode=plan."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
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


#: The layers of harness/ and arms/, bottom first: a module imports only from its own layer and the ones below
#: (lazy imports count). docs/architecture.md, section "Layers", names them in this order. Each module's layer is
#: that of the first rule whose pattern (fnmatch: `*` crosses dots) matches its name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("harness", "harness.errors", "harness.identity", "harness.log", "harness.entry", "harness.faults",
              "harness.halt", "harness.dist", "harness.diagnostics", "harness.slurm", "harness.trackers",
              "harness.hub", "harness.rundir", "harness.usercache", "harness.metrics")),
    ("domain", ("harness.rewards", "harness.rewards.*", "harness.rounds", "harness.data", "harness.data.*",
                "harness.models", "harness.models.*", "harness.accounting",
                "harness.accounting.*", "harness.offpolicy", "harness.offpolicy.buffer", "harness.offpolicy.process")),
    ("config", ("harness.config", "harness.config.*", "harness.kinds", "arms", "arms.common", "arms.*.config",
                "arms.grpo", "arms.papo", "arms.evi_po", "arms.sft", "arms.opd")),
    ("plan", ("harness.plan", "harness.rollout")),
    ("artifacts", ("harness.policy", "harness.portable", "harness.card", "harness.eval")),
    ("training hooks", ("harness.run", "harness.run.context", "harness.run.callbacks",
                        "harness.run.checkpoint_callback", "harness.run.audit", "harness.run.learning",
                        "harness.run.loggers")),
    ("eval", ("harness.eval.greedy", "harness.eval.during", "harness.eval.periodic", "harness.eval.abstention")),
    ("run", ("harness.run.stages", "harness.run.stages.*", "harness.run.recipe", "harness.run.lifecycle",
             "arms.*.trainer", "arms.*.terms", "arms.trl_hooks", "arms.offpolicy", "harness.offpolicy.sampler")),
    ("tools", ("harness.verify", "harness.verify.*", "harness.report", "harness.report.*", "harness.port",
               "harness.port.*", "harness.export", "harness.eval.cli", "harness.eval.__main__", "harness.smoke")),
    ("entry", ("harness.cli", "harness.__main__", "harness.launch", "harness.sweep", "harness.slurm_launcher")),
]
#: (importer, imported) -> why this import points up. At most 2 entries, each a decision with its reason.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the first layer with a pattern matching `module`, or None."""
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own, as 'a (layer) -> b (layer)'."""
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la and (a, b) not in UPWARD_ALLOWED:
                out.append(f"{a} ({LAYERS[la][0]}) -> {b} ({LAYERS[lb][0]})")
    return out


def test_every_module_has_a_layer():
    assert not [m for m in modules() if layer_of(m) is None], "add the module to a layer of LAYERS (and the docs)"


def test_imports_point_down_the_layers():
    assert len(UPWARD_ALLOWED) <= 2
    assert not upward_imports(import_graph())


def test_an_import_up_the_layers_is_found():
    graph = {"harness.plan": {"harness.policy", "harness.kinds"}, "harness.kinds": {"harness.rounds"}}
    assert upward_imports(graph) == ["harness.plan (plan) -> harness.policy (artifacts)"]
    assert layer_of("arms.grpo.trainer") == layer_of("harness.run.lifecycle")
    assert layer_of("arms.grpo.config") == layer_of("harness.kinds") and layer_of("arms.grpo") == layer_of("arms")


def test_the_architecture_doc_names_the_layers_in_order():
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| *\d+ *\| *([a-z ]+?) *\|", section, flags=re.M)
    assert named == [name for name, _ in LAYERS]


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

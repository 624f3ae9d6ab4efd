"""Benchmark: wall time of `python -m harness mode=plan` vs `python -c "import hydra, omegaconf"`, and no torch.

    .venv/bin/python bench/plan.py [--quick] [--repeats 5] [override ...]

The commands run as subprocesses of this interpreter (the venv's python), alternating, --repeats times each
(5; --quick 3); the plans write under a temp output_root (deleted afterwards), their stdout (the plan JSON) is
captured and discarded. Goal: `ratio=<plan/import>` <= 2.0, printed last (planning costs about what importing
Hydra costs: the control plane stays light).

    plan      `python -m harness mode=plan ...` as a user runs it: with the compose cache on (the default,
              harness/config/compose_cache.py). The warm-up plan fills it, as the first plan of a command does
              for a user who plans it again, so the timed runs compose nothing: imports, the plan and its warm
              start's plan (checks, identity), and reading two cache entries. `ratio=`
    import    `python -c "import hydra, omegaconf"`
    uncached  the same plan with HARNESS_COMPOSE_CACHE=0: every compose by Hydra (the run's and, for an RL arm,
              its SFT warm start's), what a first plan of a command costs. `uncached_ratio=`
    compose   the floor under the uncached plan: importing Hydra, registering the harness's schemas and composing
              conf/config.yaml once with Hydra's compose API (HARNESS_COMPOSE_CACHE=0; no checks, no plan, no
              parent, no identity). `compose_floor_ratio=`. Measured before the cache: 2.31 (0.425 vs 0.184 s)
              with mode=plan at 2.59: one compose of this config by Hydra is above the goal of 2.0 on its own.

The compose cache lives in $HARNESS_CACHE_DIR/compose (else $XDG_CACHE_HOME/harness/compose, else
~/.cache/harness/compose); this bench adds two entries to it per invocation (its temp output_root is part of
the argv, so part of the key). The children run without PYTHONDONTWRITEBYTECODE (the warm-up writes the
harness's bytecode, as it is for a user; Hydra's comes compiled from pip), so the comparison is not skewed by
recompiling every module.

It also runs the plan twice more (cached and uncached) under a wrapper that prints, at exit (atexit: after the
harness's own SystemExit), the imported modules of torch, transformers and trl; prints `torch_imported=False/True`
and exits 1 if either imported torch (the control plane must stay torch-free). This script imports no torch
itself; threads are irrelevant (no torch work is timed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl")  # what the control plane must not import
MARKER = "BENCH_PLAN_MODULES="

# `python -c WRAPPER arg ...` runs `python -m harness arg ...` in-process and reports the heavy modules at exit.
WRAPPER = f"""
import atexit, json, runpy, sys
def _report():
    heavy = sorted(m for m in sys.modules if m.split(".")[0].startswith({HEAVY!r}))
    sys.stderr.write({MARKER!r} + json.dumps(heavy) + "\\n")
atexit.register(_report)
sys.argv = ["harness", *sys.argv[1:]]
runpy.run_module("harness", run_name="__main__", alter_sys=True)
"""


def plan_argv(output_root: str, overrides: list[str]) -> list[str]:
    return ["mode=plan", f"output_root={output_root}", *overrides]


def heavy_modules(argv: list[str], python: str = sys.executable, env: dict | None = None) -> list[str]:
    """Modules of torch / transformers / trl (and torch* packages) that `python -m harness *argv` imported
    (`env`: extra environment variables, e.g. HARNESS_COMPOSE_CACHE=0).

    Raises RuntimeError if the command fails or the report is missing."""
    p = subprocess.run([python, "-c", WRAPPER, *argv], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(MARKER)]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"`python -m harness {' '.join(argv)}` exited {p.returncode}:\n{p.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARKER):])


def torch_imported(modules: list[str]) -> bool:
    return any(m.split(".")[0].startswith("torch") for m in modules)


# Hydra's own cost of composing this config once: the floor under an uncached mode=plan (argv[1:]: the overrides)
COMPOSE = """
import sys
from harness.config.compose import compose
compose(sys.argv[1:])
"""
# the cache as a user has it by default, whatever this shell says (the uncached runs say so themselves)
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "HARNESS_COMPOSE_CACHE")}
UNCACHED = {"HARNESS_COMPOSE_CACHE": "0"}  # every compose by Hydra


def _time(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**ENV, **(env or {})})
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each command (default 5, --quick 3)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides added to the plan command, e.g. debug=tiny")
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)

    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        argv = plan_argv(tmp, args.overrides)
        cmds = {"plan": [py, "-m", "harness", *argv], "import": [py, "-c", "import hydra, omegaconf"],
                "uncached": [py, "-m", "harness", *argv], "compose": [py, "-c", COMPOSE, *argv]}
        envs = {"uncached": UNCACHED, "compose": UNCACHED}
        _time(cmds["plan"])  # warm-up: bytecode caches, page cache, and the compose cache's two entries
        times = {k: [] for k in cmds}
        for _ in range(repeats):
            for k, cmd in cmds.items():
                times[k].append(_time(cmd, envs.get(k)))
        heavy = sorted({*heavy_modules(argv, env={"HARNESS_COMPOSE_CACHE": "1"}), *heavy_modules(argv, env=UNCACHED)})

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{repeats} runs each, alternating (after one warm-up plan); python {py}")
    for k, cmd in cmds.items():
        shown = " ".join(Path(c).name if i == 0 else ("<compose once>" if c == COMPOSE else c) for i, c in enumerate(cmd))
        shown = "".join(f"{var}={val} " for var, val in envs.get(k, {}).items()) + shown
        print(f"{k:8} median {med[k]:6.3f} s   runs " + " ".join(f"{t:.3f}" for t in times[k]) + f"   ({shown})")
    imported = torch_imported(heavy)
    print(f"heavy modules imported by mode=plan: {', '.join(heavy) if heavy else 'none'}")
    print(f"torch_imported={imported}")
    print(f"compose_floor_ratio={med['compose'] / med['import']:.3f}")
    print(f"uncached_ratio={med['uncached'] / med['import']:.3f}")
    print(f"ratio={med['plan'] / med['import']:.3f}")  # last: the goal's figure
    if imported:
        sys.exit(1)


if __name__ == "__main__":
    main()

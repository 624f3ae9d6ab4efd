"""Benchmark: wall time of `python -m harness mode=plan` vs `python -c "import hydra, omegaconf"`, and no torch.

    .venv/bin/python bench/plan.py [--quick] [--repeats 5] [override ...]

Both commands run as subprocesses of this interpreter (the venv's python), alternating, --repeats times each
(5; --quick 3); the plan writes under a temp output_root (deleted afterwards), its stdout (the plan JSON) is
captured and discarded. Prints both medians and last `ratio=<plan/import>`; goal <= 2.0 (planning costs about
what importing Hydra costs: the control plane stays light).

A third command is the floor under that ratio: importing Hydra, registering the harness's schemas and
composing conf/config.yaml once with Hydra's compose API (no checks, no plan, no parent, no identity), printed as
`compose_floor_ratio=<compose/import>`. Measured here: 2.31 (0.425 vs 0.184 s) with mode=plan at 2.59
(0.477 s): one compose of this config by Hydra is already above the goal of 2.0, and mode=plan's own work
(the warm start's second compose, the checks, the identity's git and package reads) adds ~0.3 of the ratio.
The children run without PYTHONDONTWRITEBYTECODE (the warm-up writes the harness's bytecode, as it is
for a user; Hydra's comes compiled from pip), so the comparison is not skewed by recompiling every module.

It also runs the plan once more under a wrapper that prints, at exit (atexit: after the harness's own
SystemExit), the imported modules of torch, transformers and trl; prints `torch_imported=False/True` and exits 1
if torch was imported (the control plane must stay torch-free). This script imports no torch itself; threads
are irrelevant (no torch work is timed).
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


def heavy_modules(argv: list[str], python: str = sys.executable) -> list[str]:
    """Modules of torch / transformers / trl (and torch* packages) that `python -m harness *argv` imported.

    Raises RuntimeError if the command fails or the report is missing."""
    p = subprocess.run([python, "-c", WRAPPER, *argv], cwd=REPO, capture_output=True, text=True)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(MARKER)]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"`python -m harness {' '.join(argv)}` exited {p.returncode}:\n{p.stderr[-2000:]}")
    return json.loads(lines[-1][len(MARKER):])


def torch_imported(modules: list[str]) -> bool:
    return any(m.split(".")[0].startswith("torch") for m in modules)


# Hydra's own cost of composing this config once: the floor under mode=plan (argv[1:] are the overrides)
COMPOSE = """
import sys
from harness.config.compose import compose
compose(sys.argv[1:])
"""
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
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
                "compose": [py, "-c", COMPOSE, *argv]}
        _time(cmds["plan"])  # warm-up: bytecode caches, page cache
        times = {k: [] for k in cmds}
        for _ in range(repeats):
            for k, cmd in cmds.items():
                times[k].append(_time(cmd))
        heavy = heavy_modules(argv)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{repeats} runs each, alternating (after one warm-up plan); python {py}")
    for k, cmd in cmds.items():
        shown = " ".join(Path(c).name if i == 0 else ("<compose once>" if c == COMPOSE else c) for i, c in enumerate(cmd))
        print(f"{k:7} median {med[k]:6.3f} s   runs " + " ".join(f"{t:.3f}" for t in times[k]) + f"   ({shown})")
    imported = torch_imported(heavy)
    print(f"heavy modules imported by mode=plan: {', '.join(heavy) if heavy else 'none'}")
    print(f"torch_imported={imported}")
    print(f"compose_floor_ratio={med['compose'] / med['import']:.3f}")
    print(f"ratio={med['plan'] / med['import']:.3f}")
    if imported:
        sys.exit(1)


if __name__ == "__main__":
    main()

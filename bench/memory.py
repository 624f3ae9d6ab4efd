"""Benchmark: peak RSS at step 400 vs step 50 of a long tiny RL run, through the harness's own training path.

    .venv/bin/python bench/memory.py [--quick] [--steps 400] [--early 50] [--tracemalloc] [--output-root DIR]
                                     [override ...]

Runs `python -m harness debug=tiny <overrides>` made long: budget.max_steps=--steps, the token budget raised to
the plan's worst case for those steps (so max_steps binds, not the budget) and a checkpoint every --early/2 steps
(debug=tiny's every 2 is slow; both measured steps have seen checkpoint saves). Two subprocesses of this script:
the first runs the SFT warm start (and builds the data and the tiny model), so its memory is not the RL run's;
the second composes the plan with harness.cli.compose_plan and runs harness.run.lifecycle.run_with_prerequisites, with
harness.run.stages.train.build wrapped at run time (nothing in the repository is patched) to add a callback that
samples, at every step end, the current RSS (VmRSS) and the peak (getrusage ru_maxrss). Prints both at step
--early and --steps, the RSS every --early steps and its slope, and last `ratio=<peak(steps)/peak(early)>`;
goal <= 1.10 (no per-step state accumulates). --quick: 200 vs 25 steps (same proportions). --tracemalloc also
prints the Python allocations that grew most between the two steps (slow: traced runs take ~2x longer).
Threads are left at their default (nothing is timed); set OMP_NUM_THREADS to share a machine. Works in a temp
output_root (deleted afterwards) unless --output-root is given (the RL run dir of these overrides is then
removed before the run, so it starts fresh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_kb() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process in kB: /proc VmRSS and getrusage ru_maxrss (kB on Linux)."""
    import resource

    cur = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1])
                break
    return cur, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# --- the child: one subprocess per phase


def child(phase: str, result: Path, argv: list[str], early: int, late: int, trace: bool) -> None:
    from harness.cli import compose_plan
    from harness.log import setup_logging

    setup_logging()
    plan = compose_plan(argv)
    if phase == "parent":
        from harness.run.lifecycle import run_prerequisite

        if plan.parent is not None:
            run_prerequisite(plan.parent)
        result.write_text(json.dumps({"ok": True}))
        return

    import harness.run.stages.train as train_stage
    from transformers import TrainerCallback

    samples: list[list[int]] = []  # [step, VmRSS kB, peak kB]
    snaps: dict[int, object] = {}

    class RssProbe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            samples.append([state.global_step, *_rss_kb()])
            if trace:
                import tracemalloc

                tracemalloc.start(1)

        def on_step_end(self, args, state, control, **kw):
            samples.append([state.global_step, *_rss_kb()])
            if trace and state.global_step in (early, late):
                import tracemalloc

                snaps[state.global_step] = tracemalloc.take_snapshot()

    build = train_stage.build

    def build_with_probe(plan, *args, **kwargs):
        trainer = build(plan, *args, **kwargs)
        if plan.kind.samples:
            trainer.add_callback(RssProbe())
        return trainer

    train_stage.build = build_with_probe  # the recipe looks `build` up in its module at call time
    t0 = time.perf_counter()
    code = execute_fresh(plan)
    out = {"code": code, "samples": samples, "seconds": time.perf_counter() - t0}
    if early in snaps and late in snaps:
        stats = snaps[late].compare_to(snaps[early], "lineno")
        out["tracemalloc"] = [[str(s.traceback), s.size_diff, s.count_diff] for s in stats[:15]]
    result.write_text(json.dumps(out))


def execute_fresh(plan) -> int:
    from harness.run.lifecycle import run_with_prerequisites

    if os.path.isdir(plan.run_dir):
        shutil.rmtree(plan.run_dir)  # this bench's own run (its overrides); an old one would resume or be complete
    return run_with_prerequisites(plan)


# --- the driver


def _run_child(phase: str, argv: list[str], work: Path, args) -> dict:
    result, log_path = work / f"{phase}.json", work / f"{phase}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--result", str(result),
           "--early", str(args.early), "--steps", str(args.steps), *(["--tracemalloc"] if args.tracemalloc else []),
           "--", *argv]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        p = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode != 0 or not result.exists():
        tail = log_path.read_text()[-3000:]
        raise SystemExit(f"the {phase} subprocess exited {p.returncode}; the end of its log:\n{tail}")
    out = json.loads(result.read_text())
    out["wall"] = time.perf_counter() - t0
    return out


def _overrides(root: str, args) -> list[str]:
    """debug=tiny made long: max_steps binds (the token budget is its worst case), fewer checkpoints."""
    from harness.cli import compose_plan

    argv = ["debug=tiny", f"output_root={root}", f"budget.max_steps={args.steps}",
            f"train.save_steps={max(1, args.early // 2)}", *args.overrides]
    worst = compose_plan(argv).budget.get("max_steps_worst_case_tokens")
    return [*argv, f"budget.max_completion_tokens={worst}"] if worst else argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 vs 25 steps")
    ap.add_argument("--steps", type=int, default=None, help="the late step, also the run's length (default 400)")
    ap.add_argument("--early", type=int, default=None, help="the early step (default 50)")
    ap.add_argument("--tracemalloc", action="store_true", help="report the Python allocations that grew")
    ap.add_argument("--output-root", default=None, help="data, model and runs (default: a temp dir, deleted)")
    ap.add_argument("--child", choices=("parent", "train"), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides added to the run, e.g. arm=papo")
    args = ap.parse_args()
    args.steps = args.steps or (200 if args.quick else 400)
    args.early = args.early or (25 if args.quick else 50)
    if not 0 < args.early < args.steps:
        raise SystemExit(f"--early ({args.early}) must lie between 0 and --steps ({args.steps})")
    if args.child:
        child(args.child, Path(args.result), args.overrides, args.early, args.steps, args.tracemalloc)
        return

    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        root = args.output_root or tmp
        argv = _overrides(root, args)
        parent = _run_child("parent", argv, Path(tmp), args)
        print(f"SFT warm start (data, tiny model): {parent['wall']:.1f} s", flush=True)
        out = _run_child("train", argv, Path(tmp), args)
    if out["code"] != 0:
        raise SystemExit(f"the run exited {out['code']}")
    by_step = {s: (cur, peak) for s, cur, peak in out["samples"]}  # the last sample of a step wins
    missing = [s for s in (args.early, args.steps) if s not in by_step]
    if missing:
        raise SystemExit(f"no RSS sample at step(s) {missing}; the run reached step {max(by_step, default=0)}")
    mb = lambda kb: kb / 1024  # noqa: E731
    print(f"RL run: {max(by_step)} steps in {out['seconds']:.1f} s; overrides {' '.join(argv)}")
    print(f"{'step':>6} {'VmRSS MB':>9} {'peak MB':>9}")
    start = by_step[min(by_step)]
    print(f"{'begin':>6} {mb(start[0]):9.1f} {mb(start[1]):9.1f}")
    for s in sorted(by_step):
        if s and (s % args.early == 0 or s == args.steps):
            print(f"{s:>6} {mb(by_step[s][0]):9.1f} {mb(by_step[s][1]):9.1f}")
    (e_cur, e_peak), (l_cur, l_peak) = by_step[args.early], by_step[args.steps]
    slope = (l_cur - e_cur) / (args.steps - args.early) * 100
    print(f"VmRSS step {args.early} -> {args.steps}: {mb(l_cur - e_cur):+.1f} MB ({mb(slope):+.2f} MB per 100 steps); "
          f"ratio current {l_cur / e_cur:.3f}")
    for where, size, count in out.get("tracemalloc", []):
        print(f"  tracemalloc {size / 1024:+9.1f} KiB {count:+7d} blocks  {where}")
    print(f"peak RSS step {args.early}: {mb(e_peak):.1f} MB, step {args.steps}: {mb(l_peak):.1f} MB")
    print(f"ratio={l_peak / e_peak:.3f}")


if __name__ == "__main__":
    main()

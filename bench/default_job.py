"""Benchmark: the README's default job from an empty output_root vs plain TRL's GRPO training alone.

    .venv/bin/python bench/default_job.py [--quick] [--bare-steps 250] [override ...]

1. `python -m harness <overrides>` in a fresh temp output_root, as a new user runs it: cold caches (the
   synthetic data and the tiny model are built), the SFT warm start, GRPO until its token budget stops it,
   greedy evals. Its phases (completion.json `phases_s`, the parent's own included) and accuracy are printed.
2. A bare TRL GRPOTrainer with TRL's defaults (bench/common.py: gradient checkpointing on, no image cache,
   a reward function that scores the same way and writes nothing, the same GRPOConfig otherwise) for
   --bare-steps steps from the same SFT policy, also as a fresh process (interpreter start and imports
   count, as they do for the job).

Prints the phases, both walls, and last `ratio=<default job / bare TRL>`; the goal (issue 15) is <= 1.05: the
whole job, data, warm start and evals included, costs no more than plain TRL's training alone, with the
held-out accuracy up by >= 0.10. --quick: the same job at a quarter of its size (data, warm start, token budget,
eval views) against a quarter of the bare steps (~2-3 minutes). --same-steps: also a bare TRL run of as many
steps as the job's GRPO took (budget-bound: 397 in the default job), printed as `same_steps_ratio=` before the
last line: what the whole job costs against plain TRL's training of the same RL steps. Run it on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
QUICK = ["data.n_base=300", "budget.sft_warm_start_steps=38", "budget.max_completion_tokens=19200",
         "data.eval_max_items=180"]  # a quarter of every part of the default job


def _bare_child(root: str, steps: int, overrides: list[str]) -> None:
    sys.path.insert(0, str(HERE))
    import common

    from harness.cli import compose_plan

    common.quiet()
    plan = compose_plan([f"output_root={root}", *overrides])
    t = common.bare_trial(plan, steps=steps, trl_defaults=True, scratch=Path(root) / "bare")
    print(json.dumps({"train_s": t.train_s, "steps": t.steps, "tokens": sum(t.tokens)}))


def _run(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the job against a quarter of the bare steps")
    ap.add_argument("--bare-steps", type=int, default=None, help="bare TRL steps (default 250; --quick 63)")
    ap.add_argument("--same-steps", action="store_true",
                    help="also race a bare TRL run of the job's own number of GRPO steps (same_steps_ratio=)")
    ap.add_argument("--child-bare", nargs=2, metavar=("ROOT", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the job (and the bare trainer's plan)")
    args = ap.parse_args()
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    if args.child_bare:
        _bare_child(args.child_bare[0], int(args.child_bare[1]), overrides)
        return
    steps = args.bare_steps or (63 if args.quick else 250)
    with tempfile.TemporaryDirectory(prefix="bench-default-job-") as root:
        job_wall, proc = _run([sys.executable, "-m", "harness", f"output_root={root}", *overrides])
        (run,) = [p for p in (Path(root) / "runs").iterdir() if p.name.startswith("grpo-")]
        comp = json.loads((run / "completion.json").read_text())
        parent = json.loads((Path(comp["parent"]["run_dir"]) / "completion.json").read_text())
        def bare_run(n: int) -> tuple[float, dict]:  # a fresh process: interpreter start and imports count
            wall, p = _run([sys.executable, str(Path(__file__).resolve()), "--child-bare", root, str(n),
                            *(["--quick"] if args.quick else []), *args.overrides])
            return wall, json.loads(p.stdout.strip().splitlines()[-1])

        bare_wall, bare = bare_run(steps)
        same = bare_run(comp["optimizer_steps"]) if args.same_steps else None

    ph, pph = comp["phases_s"], parent.get("phases_s") or {}
    print(f"default job{' (--quick: ' + ' '.join(QUICK) + ')' if args.quick else ''}"
          f"{' ' + ' '.join(args.overrides) if args.overrides else ''}: {job_wall:.1f} s from an empty output_root")
    print(f"  SFT warm start {ph['parent']:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in pph.items() if k != "parent"))
    print("  GRPO: " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items() if k != "parent")
          + f"  ({comp['optimizer_steps']} steps, {comp['train_runtime_s'] / comp['optimizer_steps']:.3f} s/step, "
            f"{comp['realized_completion_tokens']} tokens, stopped by {comp['stopped_by']})")
    other = job_wall - sum(ph.values())
    print(f"  interpreter, imports, planning and the summary: {other:.1f} s")
    b, a = comp["eval_before"]["accuracy"], comp["eval_after"]["accuracy"]
    print(f"  held-out accuracy {b:.3f} -> {a:.3f} ({a - b:+.3f}; goal >= +0.10)"
          + (" (eval before reused)" if comp["eval_before"].get("reused_from") else ""))
    print(f"bare TRL GRPOTrainer, TRL's defaults: {bare_wall:.1f} s for {bare['steps']} steps "
          f"({bare['train_s'] / bare['steps']:.3f} s/step, {bare['tokens']} tokens; training alone {bare['train_s']:.1f} s)")
    print(f"per-step ratio (job's GRPO / bare TRL)={comp['train_runtime_s'] / comp['optimizer_steps'] / (bare['train_s'] / bare['steps']):.3f}")
    if same is not None:
        sw, sb = same
        print(f"bare TRL GRPOTrainer, TRL's defaults, the job's {sb['steps']} steps: {sw:.1f} s "
              f"({sb['train_s'] / sb['steps']:.3f} s/step; training alone {sb['train_s']:.1f} s)")
        print(f"same_steps_ratio={job_wall / sw:.3f}")
    print(f"ratio={job_wall / bare_wall:.3f}")


if __name__ == "__main__":
    main()

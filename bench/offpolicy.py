"""Benchmark: what off-policy rounds (rollout=async) cost or save against on-policy ones, on this machine.

    .venv/bin/python bench/offpolicy.py [--quick] [--steps 40] [--rounds 3] [--lag 1] [--output-root DIR] [override ...]

Two kinds of trial on the default plan (arm=grpo; the token budget lifted so that budget.max_steps=--steps binds,
eval off), from the same SFT warm start, in one process, alternating order round by round:

  sync    rollout=hf: TRL samples each round in the trainer, then trains on it
  async   rollout=async rollout.lag=--lag: a sampler process samples rounds ahead; the trainer trains the round
          before while it does (on a CPU machine the two processes share its cores)

A trial's time is its whole run (model load, trainer build, training, checkpoints, final save); the async trial's
includes starting its sampler (it rebuilds the model and TRL's trainer from the plan: seconds). Prints per-round
times and `ratio=<async / sync>`, the median over rounds of the ratio of the two trials of a round. On 2 cores the
sampler and the trainer contend: a ratio above 1 here says what sharing the cores costs, not what a GPU node with a
device for each would see.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("sync", "async")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 steps x 2 rounds")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lag", type=int, default=1)
    ap.add_argument("--output-root", default=None, help="data, tiny model and SFT warm start cache (default: temp)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every trial")
    args = ap.parse_args()
    steps, rounds = (12, 2) if args.quick else (args.steps, args.rounds)

    import common
    from harness.cli import compose_plan
    from harness.run.lifecycle import run_prerequisite

    common.quiet()
    with tempfile.TemporaryDirectory(prefix="bench-offpolicy-") as tmp:
        root = args.output_root or tmp
        base = ["arm=grpo", f"output_root={root}", "train.eval_before=false", "train.eval_after=false",
                "budget.max_completion_tokens=100000000", f"budget.max_steps={steps}", *args.overrides]
        plans = {"sync": compose_plan(base),
                 "async": compose_plan([*base, "rollout=async", f"rollout.lag={args.lag}"])}
        run_prerequisite(plans["sync"].parent)  # the SFT warm start, once (not timed)
        results: dict[str, list] = {k: [] for k in KINDS}
        for r in range(rounds):
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                results[kind].append(common.harness_trial(plans[kind], kind))
            print(f"round {r + 1}: " + "  ".join(f"{k} {results[k][-1].wall_s:6.2f} s" for k in KINDS), flush=True)

    print(f"\n{common.machine()}; {rounds} rounds x {steps} steps per kind; lag {args.lag}; "
          f"overrides {args.overrides or '(none)'}")
    print(f"{'kind':6} {'run median':>11} {'train median':>13} {'per step':>9}  tokens sampled (median)")
    for k in KINDS:
        train = statistics.median(t.train_s for t in results[k])
        tokens = statistics.median(sum(t.tokens) for t in results[k])
        print(f"{k:6} {statistics.median(t.wall_s for t in results[k]):9.2f} s {train:11.2f} s "
              f"{train / steps:7.3f} s  {tokens:.0f}")
    paired = [results["async"][i].wall_s / results["sync"][i].wall_s for i in range(rounds)]
    print("per-round async/sync: " + ", ".join(f"{x:.3f}" for x in paired))
    print(f"ratio={statistics.median(paired):.3f}")


if __name__ == "__main__":
    main()

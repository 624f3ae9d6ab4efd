"""Benchmark: what the harness costs over a bare TRL GRPOTrainer, and what its defaults save over TRL's.

    .venv/bin/python bench/overhead.py [--quick] [--steps 40] [--rounds 5] [--output-root DIR] [override ...]

Four kinds of trial on the default plan (arm=grpo; the token budget lifted so that budget.max_steps=--steps
binds, eval off), from the same SFT warm start, in one process, alternating order round by round:

  harness    python -m harness with model.image_cache_mb=0 model.dedupe_rows=false model.rope_cache=false
             (TRL's and transformers' image path, the harness's GRPOConfig)
  bare       a bare TRL GRPOTrainer with the same GRPOConfig (bench/common.py: same model, data, seed and
             checkpoint schedule, a reward function that scores the same way and writes nothing)
  harness*   python -m harness with its defaults (image cache, row dedupe, M-RoPE cache on;
             gradient checkpointing off for tiny models)
  bare*      the bare GRPOTrainer with TRL's defaults (gradient checkpointing on, no image cache)

A trial's time is its whole run: model load, trainer build, training, checkpoints and the final save; the
harness adds claim, data check, ledger, trace, metrics, checkpoint manifests and completion.json. Every trial
must sample the same completion lengths as the others (checked: the same work). Prints per-round times,
medians and spreads, the per-round paired ratios, then `defaults_ratio=<harness* / bare*>` and last
`ratio=<harness / bare>`: each the median over rounds of the ratio of the two trials of a round (they ran
back to back; this machine's speed drifts by tens of percent over minutes, which the walls' spreads show).
Goals (issue 15): ratio <= 1.02, defaults_ratio <= 0.75. --quick: 20 steps x 3 rounds (~3 minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("harness", "bare", "harness*", "bare*")
STOCK_PATHS = ("model.image_cache_mb=0", "model.dedupe_rows=false", "model.rope_cache=false")  # TRL's image path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 steps x 3 rounds")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--output-root", default=None, help="data, tiny model and SFT warm start cache (default: temp)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every trial")
    args = ap.parse_args()
    steps, rounds = (20, 3) if args.quick else (args.steps, args.rounds)

    import common
    from harness.cli import compose_plan

    common.quiet()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        root = args.output_root or tmp
        head = ["arm=grpo", f"output_root={root}", "train.eval_before=false", "train.eval_after=false",
                "budget.max_completion_tokens=100000000"]
        base = [*head, f"budget.max_steps={steps}", *args.overrides]
        plans = {"harness": compose_plan([*base, *STOCK_PATHS]), "harness*": compose_plan(base)}
        from harness.run.lifecycle import run_prerequisite

        run_prerequisite(plans["harness*"].parent)  # the SFT warm start, once (not timed)
        warm = compose_plan([*head, "budget.max_steps=2", *args.overrides])
        common.harness_trial(warm)  # first-use costs (imports, allocator, kernels) are nobody's: not timed
        common.bare_trial(warm, steps=2, trl_defaults=True, scratch=Path(tmp) / "scratch")
        results: dict[str, list] = {k: [] for k in KINDS}
        for r in range(rounds):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for kind in order:
                if kind.startswith("harness"):
                    t = common.harness_trial(plans[kind], kind)
                else:
                    t = common.bare_trial(plans["harness"], steps=steps, trl_defaults=kind == "bare*",
                                          scratch=Path(tmp) / "scratch", kind=kind)
                results[kind].append(t)
            print(f"round {r + 1}: " + "  ".join(f"{k} {results[k][-1].wall_s:6.2f} s" for k in KINDS), flush=True)

    ref = results["bare"][0].tokens
    same = {k: all(t.tokens == ref for t in results[k]) for k in KINDS}
    print(f"\n{common.machine()}; {rounds} rounds x {steps} steps per kind; overrides {args.overrides or '(none)'}")
    print(f"{'kind':9} {'run median':>11} {'spread':>7} {'train median':>13} {'per step':>9}  same completions")
    med = {}
    for k in KINDS:
        walls = [t.wall_s for t in results[k]]
        med[k] = statistics.median(walls)
        train = statistics.median(t.train_s for t in results[k])
        print(f"{k:9} {med[k]:9.2f} s {common.spread(walls):6.1%} {train:11.2f} s {train / steps:7.3f} s  {same[k]}")
    if not all(same.values()):
        print("WARNING: the trials sampled different completions: they did different work")
    # This machine's speed drifts by tens of percent over minutes (the walls' spreads): the ratios are taken
    # within a round, where the two trials ran back to back, and their median over the rounds is reported.
    paired = {}
    for a, b in (("harness", "bare"), ("harness*", "bare*")):
        paired[a] = [results[a][i].wall_s / results[b][i].wall_s for i in range(rounds)]
        print(f"per-round {a}/{b}: " + ", ".join(f"{x:.3f}" for x in paired[a])
              + f"  (spread {common.spread(paired[a]):.1%}; ratio of the medians {med[a] / med[b]:.3f})")
    print(f"defaults_ratio={statistics.median(paired['harness*']):.3f}")
    print(f"ratio={statistics.median(paired['harness']):.3f}")


if __name__ == "__main__":
    main()

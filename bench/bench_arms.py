"""Benchmark: step time of papo and evi_po relative to grpo on the tiny VLM, side by side in one process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_arms.py [--steps 12] [--rounds 3] [--output-root DIR]
                                                             [--arms grpo,papo,evi_po] [override ...]

Every arm trains the same plan (default config unless overrides, e.g. `debug=tiny`) from the same
initial policy (the SFT warm start the harness would use, built on the first run into
--output-root), with the harness reward (ledger + trace into a scratch run dir). Arms alternate
round-robin (grpo, papo, evi_po, grpo, ...) so background load hits them alike. The time of a step
is TRL's `step_time` (generation, scoring, the arm's extra forwards, loss and backward; the optimizer
step is the same for every arm and excluded) and the wall time between step begin and end; the first
step of every trial is dropped (warm-up). Prints the median per arm and the ratios to grpo (goals:
papo <= 1.4, evi_po <= 1.8). Threads are pinned to 1 (set before torch is imported).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def _setup(arm: str, overrides: list[str], root: str):
    """(plan, dataset root, train rows, SFT warm-start policy dir, suppress ids, eos ids) for one arm."""
    from harness.cli import compose_plan
    from harness.data import ensure_synthetic, load_split
    from harness.data.spec import synthetic_args
    from harness.run.lifecycle import run_prerequisite

    plan = compose_plan([f"arm={arm}", f"output_root={root}", *overrides])
    d = plan.cfg.data
    data = ensure_synthetic(**synthetic_args(d, plan.cfg.model.patch_size), cache_dir=d.cache_dir)
    parent = plan.parent
    run_prerequisite(parent)
    return plan, data, load_split(data, d["train_split"]), Path(parent.run_dir) / "final_policy"


def _trial(arm: str, plan, data: Path, rows: list[dict], init: Path, steps: int, scratch: Path) -> dict:
    """Train `steps` steps of `arm` from `init`; per-step TRL step_time and wall time (first step dropped)."""
    import shutil

    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    import arms
    from arms.common import BuildContext
    from harness.models import special_token_ids_to_suppress
    from harness.policy import eos_token_ids, load_policy
    from harness.accounting.ledger import HarnessReward
    from harness.accounting.ledger import provenance_of
    from harness.eval.during import plan_rewards
    from harness.run.stages.resume import ResumePoint
    from harness.run.recipe import open_context
    from harness.data.trainsets import rl_dataset

    run_dir = scratch / arm
    shutil.rmtree(run_dir, ignore_errors=True)
    model, processor = load_policy(init)
    eos = eos_token_ids(processor)
    rctx = open_context(plan, run_dir, ResumePoint())  # this rank's ledger, trace and generation round
    reward = HarnessReward(rctx, rewards=plan_rewards(plan), eos_token_ids=eos,
                           provenance=provenance_of(plan))

    times = {"step_time": [], "wall": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times["wall"].append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "step_time" in logs:
                times["step_time"].append(logs["step_time"])

    ctx = BuildContext(plan=plan, run_dir=run_dir, model=model, processor=processor,
                       train_dataset=rl_dataset(data, rows, is_vlm=True), callbacks=[Clock()], reward_fn=reward,
                       suppress_token_ids=special_token_ids_to_suppress(processor))
    trainer = arms.build_trainer(arm, ctx)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.args.max_steps = steps
    trainer.args.save_strategy = "no"
    trainer.args.disable_tqdm = True
    trainer.train()
    for lg in (rctx.ledger, rctx.trace, rctx.metrics):
        lg.close()
    return {k: v[1:] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per trial (the first is dropped)")
    ap.add_argument("--rounds", type=int, default=3, help="round-robin rounds over the arms")
    ap.add_argument("--arms", default="grpo,papo,evi_po")
    ap.add_argument("--output-root", default=None, help="where data, the tiny model and the SFT warm start are "
                    "cached (default: a temp dir, deleted afterwards)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides applied to every arm, e.g. debug=tiny")
    args = ap.parse_args()

    import torch

    from harness.log import quiet_libraries

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    quiet_libraries()
    names = args.arms.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-arms-") as tmp:
        root = args.output_root or tmp
        setups = {arm: _setup(arm, args.overrides, root) for arm in names}
        results = {arm: {"step_time": [], "wall": []} for arm in names}
        per_round = []
        for r in range(args.rounds):
            medians = {}
            for arm in names:
                t = _trial(arm, *setups[arm], steps=args.steps, scratch=Path(tmp) / "scratch")
                for k in t:
                    results[arm][k].extend(t[k])
                medians[arm] = statistics.median(t["step_time"])
            per_round.append(medians)
            print(f"round {r + 1}: " + "  ".join(f"{a} {m:.3f} s" for a, m in medians.items()), flush=True)

    base = names[0]
    print(f"\nthreads {torch.get_num_threads()}, {args.rounds} rounds x {args.steps - 1} timed steps per arm; "
          f"overrides {args.overrides or '(default config)'}")
    print(f"{'arm':8} {'step_time median':>17} {'wall median':>12} {'ratio (step_time)':>18} {'ratio (wall)':>13} "
          f"{'per-round ratios':>18}")
    for arm in names:
        st, wall = statistics.median(results[arm]["step_time"]), statistics.median(results[arm]["wall"])
        st0, wall0 = statistics.median(results[base]["step_time"]), statistics.median(results[base]["wall"])
        rounds = ", ".join(f"{m[arm] / m[base]:.2f}" for m in per_round)
        print(f"{arm:8} {st:15.3f} s {wall:10.3f} s {st / st0:18.2f} {wall / wall0:13.2f}   {rounds}")


if __name__ == "__main__":
    main()

"""The sampler process of off-policy rounds (harness.offpolicy):

    python -m harness.offpolicy.sampler RUN_DIR --start R --tokens-used N [--token-share S]

Started by the trainer (harness.offpolicy.process), never by hand. It rebuilds what the trainer built from the run's
frozen plan (the data, the policy, TRL's trainer with the same GRPOConfig) and samples rounds R, R+1, ... in the
trainer's data order (TRL's RepeatSampler, the same seed): round r from policy version max(0, r - rollout.lag),
which it waits for, or free running (rollout.lag=null) from the newest version at most r once version
r - rollout.max_policy_age is out; its RNG seeded by (seed, r). A round already in the buffer is kept (sampled before a
restart by the same weights). It stops where the trainer would: at budget.max_steps, or before a round whose worst
case could exceed the token budget (harness.run.callbacks.BudgetCallback's rule). It exits when the trainer does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("harness.offpolicy")


def schedule(sampler, completions: int, repeat: int):
    """The trainer's rounds as lists of dataset indices, in order: TRL's RepeatSampler yields each round's block of
    `completions` indices `repeat` times (once per micro-batch of the round's passes), epoch after epoch, from its
    own seeded generator (what the Trainer's dataloader draws)."""
    while True:
        epoch = list(iter(sampler))
        blocks = [epoch[i:i + completions] for i in range(0, len(epoch), completions)]
        yield from blocks[::repeat]


def sampler_trainer(ctx):
    """The sampler's trainer for a BuildContext (arms.common) of the trainer's plan, model and dataset: the trainer's
    GRPOConfig (the same generation config, batch sizes, seed and data order), without a reference model (it scores
    nothing) and saving nothing."""
    from trl import GRPOConfig

    from arms.grpo.trainer import grpo_config_kwargs
    from arms.offpolicy import SamplerGRPOTrainer, no_reward

    kw = grpo_config_kwargs(ctx)
    kw.update(beta=0.0, report_to=[], save_strategy="no")
    return SamplerGRPOTrainer(model=ctx.model, reward_funcs=[no_reward], args=GRPOConfig(**kw),
                              train_dataset=ctx.train_dataset, processing_class=ctx.processor)


def choose_version(run_dir: Path, rnd: int, lag: int | None, cap: int, gone) -> int | None:
    """The policy version that samples round `rnd`, once it is published (None: the trainer exited first). At a
    fixed lag: sampled_by(rnd, lag). Free running: the newest at most `rnd`, waiting only while round `rnd` would be
    older than the cap `cap` (the trainer prunes nothing this new: harness.offpolicy.process.oldest_needed)."""
    from harness.offpolicy import newest_version, sampled_by, version_path
    from harness.offpolicy.buffer import wait_for

    floor = sampled_by(rnd, lag if lag is not None else cap)
    if not wait_for(version_path(run_dir, floor), gone):
        return None
    return floor if lag is not None else newest_version(run_dir, at_most=rnd)


def build(run_dir: Path):
    """The plan, the model, the dataset and the sampler's trainer, as the trainer process built them."""
    from arms.common import BuildContext
    from arms.offpolicy import no_reward
    from harness.data.trainsets import corpus, rl_dataset
    from harness.plan import Plan
    from harness.policy import build_policy
    from harness.rundir import RunDir
    from harness.run.stages import data as data_stage
    run = RunDir.follower(run_dir, resumed=True)
    plan = Plan.from_json(run.manifest["plan"])
    data = data_stage.prepare(plan.cfg, run.recorded("data"), run_dir=str(run_dir), fix="restore the dataset")
    data = data_stage.load_rows(plan.cfg, data)
    policy = build_policy(plan, run.recorded("model"), corpus(data.train_rows + data.test_rows), str(run_dir))
    dataset = rl_dataset(data.root, data.train_rows, is_vlm=plan.cfg.model.is_vlm)
    scratch = Path(tempfile.mkdtemp(prefix="harness-sampler-"))  # TRL's output_dir: the sampler saves nothing
    trainer = sampler_trainer(BuildContext(plan=plan, run_dir=scratch, model=policy.model, processor=policy.processor,
                                           train_dataset=dataset, reward_fn=no_reward,
                                           suppress_token_ids=policy.suppress_token_ids, device=policy.device))
    return plan, policy, dataset, trainer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.offpolicy.sampler")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--tokens-used", type=int, required=True)
    ap.add_argument("--token-share", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sampler %(message)s", stream=sys.stdout)
    parent = os.getppid()
    gone = lambda: os.getppid() != parent  # noqa: E731  (the trainer died: nothing will read the buffer)

    import torch

    from harness.faults import point
    from harness.log import quiet_libraries
    from harness.offpolicy import round_path, round_seed
    from harness.offpolicy.buffer import Round, load_version, read_round, write_round

    quiet_libraries()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    plan, policy, dataset, trainer = build(args.run_dir)
    cfg, rnd_of = plan.cfg, plan.round
    lag, cap = cfg.rollout.lag, cfg.rollout.max_policy_age
    log.info("built in %.1f s on %s (CUDA_VISIBLE_DEVICES=%s): rounds from %d, %s", time.time() - t0,
             policy.device, os.environ.get("CUDA_VISIBLE_DEVICES"), args.start,
             f"lag {lag}" if lag is not None else f"free running, age cap {cap}")
    tokens, loaded = args.tokens_used, None
    for r, indices in enumerate(schedule(trainer._get_train_sampler(), rnd_of.completions,
                                         trainer.num_iterations * trainer.args.steps_per_generation)):
        if r * rnd_of.cycle >= cfg.budget.max_steps:
            break
        if r < args.start:
            continue
        if round_path(args.run_dir, r).exists():  # sampled before a restart, by the same weights
            tokens += read_round(args.run_dir, r).tokens
            continue
        if args.token_share is not None and tokens + rnd_of.token_bound > args.token_share:
            log.info("budget: round %d could exceed the token share (%d used, bound %d, share %d): done", r, tokens,
                     rnd_of.token_bound, args.token_share)
            break
        version = choose_version(args.run_dir, r, lag, cap, gone)
        if version is None:
            log.info("the trainer exited before publishing the version for round %d: done", r)
            return 0
        if version != loaded:
            load_version(policy.model, args.run_dir, version)
            loaded = version
        seed = round_seed(cfg.seed, r)
        torch.manual_seed(seed)
        inputs = [dataset[i] for i in indices]
        t = time.time()
        prompt_ids, completion_ids, logps = trainer.sample(inputs)
        got = Round(round=r, version=version, seed=seed, keys=[json.loads(x["row"])["key"] for x in inputs],
                    prompt_ids=prompt_ids, completion_ids=completion_ids, logps=logps)
        write_round(args.run_dir, got)
        point("sampler.round")  # tests only (harness.faults): the sampler dies between rounds
        tokens += got.tokens
        log.info("round %d by version %d: %d tokens in %.2f s", r, version, got.tokens, time.time() - t)
        if gone():
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

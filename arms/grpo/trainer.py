"""grpo: TRL's GRPOTrainer with the harness reward function (docs/arms.md grpo).

Nothing is overridden: TRL's own loss, generation and checkpointing run as shipped. The
harness contributes the config mapping (below; the rollout backend's part is harness.rollout),
the reward function (ledger + trace) and the callbacks. papo and evi_po reuse `build_trainer`
with a thin subclass of arms.trl_hooks.ExtraTermsGRPOTrainer (the one place that touches TRL
internals).
"""

from __future__ import annotations

import os

from arms.common import BuildContext, training_kwargs
from harness.rollout import rollout_kwargs


def grpo_config_kwargs(ctx: BuildContext) -> dict:
    a = ctx.plan.cfg.arm
    # harness units -> TRL units: TRL's steps_per_generation counts micro-batches (harness.rounds)
    rnd = ctx.plan.round  # the plan checked that it divides
    kw = dict(
        training_kwargs(ctx),
        **rnd.trl_kwargs(),
        max_completion_length=a.max_completion_length,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        loss_type=a.loss_type.value,
        scale_rewards=a.scale_rewards.value,
        importance_sampling_level=a.importance_sampling_level.value,
        beta=a.beta,
        epsilon=a.epsilon,
        epsilon_high=a.epsilon_high if a.epsilon_high is not None else a.epsilon,
        mask_truncated_completions=a.mask_truncated_completions,
        # generation_kwargs REPLACES TRL's default suppress_tokens (docs/platform.md): list them ourselves
        generation_kwargs={"suppress_tokens": list(ctx.suppress_token_ids)},
        shuffle_dataset=True,
        log_completions=False,
        disable_dropout=True,
    )
    kw.update(rollout_kwargs(ctx.plan.cfg.rollout))  # harness.rollout maps the rollout group onto TRL's fields
    return kw


def build_trainer(ctx: BuildContext, trainer_cls=None, config_cls=None, **extra_config):
    from trl import GRPOConfig, GRPOTrainer

    args = (config_cls or GRPOConfig)(**grpo_config_kwargs(ctx), **extra_config)
    extra = {}
    if ctx.plan.cfg.rollout.mode.value == "async":  # rounds sampled ahead by another process (harness.offpolicy)
        import torch

        from arms.offpolicy import OffPolicyGRPOTrainer
        from harness.offpolicy.process import SamplerProcess, sampler_gpu, split_threads

        if trainer_cls is not None:  # the plan refuses it (harness.config.checks.NOT_OFF_POLICY); never silently
            raise RuntimeError(f"rollout=async trains arm=grpo only, not {trainer_cls.__name__}")
        trainer_cls = OffPolicyGRPOTrainer
        mine = threads = gpu = None
        if ctx.device.startswith("cuda"):  # a GPU of its own where a second is visible, else the trainer's
            index = int(ctx.device.split(":")[1]) if ":" in ctx.device else 0
            gpu = sampler_gpu(torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"), index)
        else:  # one CPU for both: the sampler takes its share of the threads
            mine, threads = split_threads(torch.get_num_threads(), ctx.plan.cfg.rollout.sampler_threads)
        extra["threads"] = mine  # the trainer's while it trains (restored after)
        extra["sampler"] = SamplerProcess(ctx.run_dir, lag=ctx.plan.cfg.rollout.lag,
                                          cap=ctx.plan.cfg.rollout.max_policy_age, cycle=ctx.plan.round.cycle,
                                          token_share=getattr(getattr(ctx.reward_fn, "ctx", None), "token_share", None),
                                          threads=threads, gpu=gpu)
    trainer = (trainer_cls or GRPOTrainer)(
        model=ctx.model,
        reward_funcs=[ctx.reward_fn],
        args=args,
        train_dataset=ctx.train_dataset,
        processing_class=ctx.processor,
        callbacks=ctx.callbacks,
        **extra,
    )
    trainer.generation_round = ctx.plan.round
    return trainer

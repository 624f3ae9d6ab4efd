"""grpo: TRL's GRPOTrainer with the harness reward function (ARMS.md grpo).

Nothing is overridden: TRL's own loss, generation and checkpointing run as shipped. The
harness contributes the config mapping (below), the reward function (ledger + trace) and the
callbacks. papo and evi_po reuse `grpo_config_kwargs` and subclass GRPOTrainer thinly.
"""

from __future__ import annotations

from arms.common import BuildContext, training_kwargs


def grpo_config_kwargs(ctx: BuildContext) -> dict:
    c = ctx.plan.config
    a, r = c["arm"], c["rollout"]
    completions = a["prompts_per_step"] * a["num_generations"]  # per optimizer step, all ranks
    per_device = completions // (ctx.world * a["gradient_accumulation_steps"])  # plan checked divisibility
    kw = dict(
        training_kwargs(ctx),
        per_device_train_batch_size=per_device,
        num_generations=a["num_generations"],
        max_completion_length=a["max_completion_length"],
        temperature=a["temperature"],
        top_p=a["top_p"],
        top_k=a["top_k"],
        loss_type=a["loss_type"],
        scale_rewards=a["scale_rewards"],
        importance_sampling_level=a["importance_sampling_level"],
        beta=a["beta"],
        epsilon=a["epsilon"],
        epsilon_high=a["epsilon_high"] if a["epsilon_high"] is not None else a["epsilon"],
        num_iterations=a["num_iterations"],
        steps_per_generation=a["steps_per_generation"],
        mask_truncated_completions=a["mask_truncated_completions"],
        # generation_kwargs REPLACES TRL's default suppress_tokens (PLATFORM.md): list them ourselves
        generation_kwargs={"suppress_tokens": list(ctx.suppress_token_ids)},
        shuffle_dataset=True,
        log_completions=False,
        disable_dropout=True,
    )
    if r["backend"] == "vllm":
        kw.update(
            use_vllm=True,
            vllm_mode=r["vllm_mode"],
            vllm_gpu_memory_utilization=r["gpu_memory_utilization"],
            vllm_tensor_parallel_size=r["tensor_parallel_size"],
            vllm_enable_sleep_mode=r["enable_sleep_mode"],
            vllm_server_host=r["server_host"],
            vllm_server_port=r["server_port"],
            vllm_importance_sampling_correction=r["importance_sampling_correction"],
            vllm_importance_sampling_mode=r["importance_sampling_mode"],
            vllm_importance_sampling_clip_max=r["importance_sampling_clip_max"],
            vllm_importance_sampling_clip_min=r["importance_sampling_clip_min"],
        )
        if r["structured_output"]:
            from harness.answers import ANSWER_REGEX

            kw["vllm_structured_outputs_regex"] = ANSWER_REGEX
    return kw


def build_trainer(ctx: BuildContext, trainer_cls=None, config_cls=None, **extra_config):
    from trl import GRPOConfig, GRPOTrainer

    args = (config_cls or GRPOConfig)(**grpo_config_kwargs(ctx), **extra_config)
    return (trainer_cls or GRPOTrainer)(
        model=ctx.model,
        reward_funcs=[ctx.reward_fn],
        args=args,
        train_dataset=ctx.train_dataset,
        processing_class=ctx.processor,
        callbacks=ctx.callbacks,
    )

"""verl's ppo_trainer (v0.9.0 field names, harness/port/schemas/verl.yaml): how each field maps onto the harness.

Units: `data.train_batch_size` prompts per rollout (one generation round), each with
`actor_rollout_ref.rollout.n` responses; `actor.ppo_mini_batch_size` prompts per optimizer step (verl multiplies it
by n); `actor.ppo_epochs` passes over a rollout; `trainer.total_epochs` passes over the dataset, or
`trainer.total_training_steps` rollouts. Harness: arm.prompts_per_step x arm.steps_per_generation = prompts per
round, arm.num_iterations passes, budget.max_steps optimizer steps (docs/arms.md, harness/rounds.py)."""

from __future__ import annotations

import harness.port.common as C
from harness.port.core import (Ctx, Field, dist, exact, inactive_unless, info, lacks, mapped, not_impl, only,
                               unset_or, when)

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."


def prepare(ctx: Ctx) -> None:
    g = ctx.get
    ctx.facts["columns"] = {"image": g("data.image_key"), "question": g("data.prompt_key"), "answer": "ANSWER_COLUMN"}
    ctx.facts["lora"] = (g(M + "lora_rank") or 0) > 0
    ctx.facts["n"] = g(R + "n")
    ctx.facts["max_len"] = g("data.max_response_length")
    ctx.facts["ppo_epochs"] = g(A + "ppo_epochs")
    ctx.facts["epochs"] = g("trainer.total_epochs")
    ctx.facts["epochs_field"] = "trainer.total_epochs"
    if g("trainer.total_training_steps") is not None:
        ctx.facts["rollout_steps"] = g("trainer.total_training_steps")
        ctx.facts["epochs_field"] = "trainer.total_training_steps"
    mode = g(A + "policy_loss.loss_mode")
    if mode in ("cispo", "sapo"):
        ctx.facts["loss_type_from_policy"] = mode
    C.round_shape(ctx, g("data.train_batch_size"), g(A + "ppo_mini_batch_size"), "data.train_batch_size",
                  A + "ppo_mini_batch_size")
    ctx.facts["budget_note"] = C.derive_budget(ctx, ctx.facts.get("n_train"))
    C.warmup(ctx, A + "optim.lr_warmup_steps", A + "optim.lr_warmup_steps_ratio")
    # verl v0.9.0 (experimental/reward_loop/reward_loop.py, migrate_legacy_reward_impl): when any value of the legacy
    # custom_reward_function section is set, that section replaces reward.custom_reward_function whole
    legacy = any(f.value not in (None, {}) for p, f in ctx.fields.items()
                 if p == "custom_reward_function" or p.startswith("custom_reward_function."))
    ctx.facts["reward_section"] = "custom_reward_function" if legacy else "reward.custom_reward_function"


def _kl_loss(ctx: Ctx) -> bool:
    return bool(ctx.get(A + "use_kl_loss"))


def adv_estimator(f: Field, ctx: Ctx):
    if f.value in ("grpo", "grpo_vectorized"):
        return "exact", None, "group-normalized outcome advantage over the n responses of a prompt: TRL's GRPO"
    ctx.refuse(f, f"advantage estimator {f.value!r}: the harness's RL arms are GRPO-family (group-normalized "
                  "advantages, no critic)", "use algorithm.adv_estimator=grpo")
    return "unsupported", None, "not GRPO's advantage"


def norm_adv(f: Field, ctx: Ctx):
    ctx.set("arm.scale_rewards", "group" if f.value else "none", f.path)
    return "exact", "arm.scale_rewards", "true: divide by the group's std (group); false: Dr. GRPO (none)"


def use_kl_loss(f: Field, ctx: Ctx):
    if f.value:
        return "exact", "arm.beta", "KL to the reference as a loss term (TRL beta = actor.kl_loss_coef)"
    ctx.set("arm.beta", 0.0, f.path)
    return "exact", "arm.beta", "no KL loss: beta 0 (KL in the reward is algorithm.use_kl_in_reward)"


def policy_loss_mode(f: Field, ctx: Ctx):
    if f.value == "vanilla":
        return "exact", None, "the clipped PPO/GRPO surrogate (TRL's)"
    if f.value == "gspo":
        ctx.set("arm.importance_sampling_level", "sequence", f.path)
        return "exact", "arm.importance_sampling_level", "sequence-level importance ratio (GSPO)"
    if f.value in ("cispo", "sapo"):
        ctx.set("arm.loss_type", f.value, f.path)
        return "locally_lowered", "arm.loss_type", f"TRL's {f.value} (its own token normalization)"
    return only(("vanilla", "gspo", "cispo", "sapo"), f"TRL has no {f.value} policy loss")(f, ctx)


def clip(side: str):
    key = "arm.epsilon" if side == "low" else "arm.epsilon_high"

    def h(f: Field, ctx: Ctx):
        value = f.value if f.value is not None else ctx.get(A + "clip_ratio")
        ctx.set(key, float(value), f.path)
        return "exact", key, f"{side} clip range of the importance ratio" + (" (DAPO clip-higher: TRL epsilon_high)"
                                                                             if side == "high" else "")
    return h


def eval_sampling(f: Field, ctx: Ctx):
    greedy = not ctx.get(R + "val_kwargs.do_sample") or ctx.get(R + "val_kwargs.temperature") == 0
    if greedy:
        return "exact", None, "greedy eval, as the harness's (train.eval_max_new_tokens tokens)"
    return "locally_lowered", None, "eval sampling: the harness's eval is greedy (one sample, temperature 0)"


def lr_schedule(f: Field, ctx: Ctx):
    style = ctx.get(A + "optim.warmup_style")
    if f.path.endswith("warmup_style"):
        return unset_or(C.scheduler, "unset (deprecated name of lr_scheduler_type)")(f, ctx)
    if style is not None:
        return "informational_only", None, "superseded by the deprecated optim.warmup_style, which is set"
    return C.scheduler(f, ctx)


# --- the reward function: custom_reward_function (verl/trainer/ppo/reward.py get_custom_reward_fn; the reward
# managers of verl/experimental/reward_loop/reward_manager/ call it once per response, every argument by keyword)

VERL_CALL = ("called once per completion as verl's reward manager calls it, by keyword: data_source (the row's "
             "meta.data_source, else the harness data option's name, not the parquet's column), solution_str (the "
             "completion's text, special tokens skipped as verl decodes), ground_truth (the row's target), extra_info "
             "(the row's meta + split, index, question, num_turns, rollout_reward_scores), reward_kwargs; a dict "
             "result's 'score' is the reward")


def _section(path: str) -> str:
    """custom_reward_function or reward.custom_reward_function: the section of one of their fields."""
    return path.split(".reward_kwargs", 1)[0] if ".reward_kwargs" in path else path.rsplit(".", 1)[0]


def _reward_path(ctx: Ctx):
    sec = ctx.facts["reward_section"]
    return sec, ctx.get(sec + ".path")


def reward_fn_path(f: Field, ctx: Ctx):
    sec, path = _reward_path(ctx)
    if _section(f.path) != sec:
        if sec == "custom_reward_function":
            return ("informational_only", None, "superseded: verl v0.9 replaces reward.custom_reward_function with the "
                    "legacy custom_reward_function section, which the recipe sets")
        return "informational_only", None, "unset (verl's legacy name of reward.custom_reward_function)"
    if not f.value:
        return ("not_implemented", None, "unset: verl scores with its default_compute_score, chosen by each row's "
                "data_source (gsm8k, MATH, geo3k, ...), which the harness does not run: it scores with its built-in "
                "reward (reward._target_ default: relation-aware match + format - invalid penalty, docs/arms.md grpo)")
    from harness.rewards.conventions import verl_target

    name = ctx.get(sec + ".name")
    target = verl_target(str(f.value), name)
    file = None if str(f.value).startswith("pkg://") else target.rsplit(":", 1)[0]
    note = C.reward_function(f, ctx, file, target, "verl", C.free_dict(ctx, sec + ".reward_kwargs"),
                             sec + ".reward_kwargs", VERL_CALL)
    return "semantically_conformant", "reward._target_", note


def reward_fn_name(f: Field, ctx: Ctx):
    sec, path = _reward_path(ctx)
    if _section(f.path) != sec or not path:
        return "informational_only", None, "inactive (no custom reward function in this section)"
    if f.value is None:
        note = "unset: compute_score, verl's documented default"
        if sec == "custom_reward_function":
            note += (" (verl v0.9.0 itself copies the legacy section with its null name over reward.custom_reward_"
                     "function and then asserts a name: set custom_reward_function.name there)")
        return "exact", "reward._target_", note
    return "exact", "reward._target_", f"the function's name in the file: reward._target_=...:{f.value}"


def reward_fn_kwargs(f: Field, ctx: Ctx):
    sec, path = _reward_path(ctx)
    if _section(f.path) != sec or not path:
        return "informational_only", None, "inactive (no custom reward function in this section)"
    if f.value in ({}, None) and f.path.endswith("reward_kwargs"):
        return "informational_only", None, "empty"
    return ("exact", "reward.kwargs", "a keyword argument of the function on every call (verl merges reward_kwargs "
            "over its own arguments)")


def reward_manager(f: Field, ctx: Ctx):
    if f.value in (None, "naive", "dapo", "rate_limited", "remote"):
        extra = (" (dapo's overlong penalty, from reward.reward_kwargs.overlong_buffer_cfg, is not added)"
                 if f.value == "dapo" else "")
        return ("informational_only", None, f"{f.value or 'naive'}: calls the reward function once per response by "
                f"keyword, as reward.convention=verl does{extra}")
    return ("not_implemented", None, f"verl's {f.value} reward manager is not run: a custom reward function is called "
            "per completion as the naive manager calls it (reward.convention=verl)")


RULES = [
    ("**._target_", info("verl's class path of this section: no training meaning")),
    # actor: optimizer
    (A + "optim.lr", exact("arm.learning_rate", float, "AdamW peak learning rate")),
    (A + "optim.lr_warmup_steps_ratio", C.warmup_ratio),
    (A + "optim.lr_warmup_steps", C.warmup_steps),
    (A + "optim.weight_decay", exact("arm.weight_decay", float, "AdamW weight decay")),
    (A + "optim.betas", lacks(([0.9, 0.999],), "TRL's AdamW betas (the harness does not expose them)")),
    (A + "optim.clip_grad", when(lambda f, ctx: ctx.get("trainer.use_v1"), exact("arm.max_grad_norm", float),
                                 info("the legacy workers (trainer.use_v1=false) clip at actor.grad_clip"))),
    (A + "grad_clip", when(lambda f, ctx: ctx.get("trainer.use_v1"),
                           info("the v1 engine (trainer.use_v1=true) clips at optim.clip_grad"),
                           exact("arm.max_grad_norm", float))),
    (A + "optim.min_lr_ratio", lacks((0, 0.0, None), "the harness's schedules decay to 0")),
    (A + "optim.num_cycles", when(lambda f, ctx: ctx.get(A + "optim.lr_scheduler_type") == "cosine",
                                  only((0.5,), "HF's cosine is a half cycle"), info("cosine only: inactive"))),
    (A + "optim.lr_scheduler_type", lr_schedule),
    (A + "optim.warmup_style", lr_schedule),
    (A + "optim.optimizer", only(("AdamW", "adamw"), "the harness trains with AdamW")),
    (A + "optim.optimizer_impl", only(("torch.optim",), "TRL's AdamW is torch.optim.AdamW")),
    (A + "optim.override_optimizer_config**", unset_or(not_impl("extra optimizer arguments: not passed"))),
    (A + "optim.*", info("bookkeeping of verl's optimizer config")),
    # actor: the loss
    (A + "ppo_mini_batch_size", lambda f, ctx: (
        "semantically_conformant", "arm.prompts_per_step", f"prompts per optimizer step (verl multiplies by n: "
        f"{f.value} x {ctx.get(R + 'n')} responses), whatever the micro-batching")),
    (A + "ppo_micro_batch_size*", dist("micro-batch: memory only. The harness splits an optimizer step's completions "
                                       "over placement ranks x arm.gradient_accumulation_steps (the same update, tested)")),
    (A + "use_dynamic_bsz", dist("token-balanced micro-batches: speed and memory only")),
    (A + "ppo_max_token_len_per_gpu", dist("dynamic batch token cap: memory only")),
    (A + "clip_ratio", lambda f, ctx: ("informational_only", None, "superseded: clip_ratio_low and clip_ratio_high are set")
     if ctx.get(A + "clip_ratio_low") is not None and ctx.get(A + "clip_ratio_high") is not None
     else ("exact", "arm.epsilon", "the clip range where clip_ratio_low/high are null")),
    (A + "clip_ratio_low", clip("low")),
    (A + "clip_ratio_high", clip("high")),
    (A + "clip_ratio_c", not_impl(
        "dual-clip PPO bound (for A < 0 the ratio's loss is capped at C): the harness does not expose TRL's `delta` "
        "(the same bound), so none applies. It binds only off-policy, on the later mini-batches of a round or "
        "ppo_epochs > 1")),
    (A + "tau_*", lambda f, ctx: ("informational_only", None, "SAPO temperature: inactive (loss_mode is not sapo)")
     if ctx.get(A + "policy_loss.loss_mode") != "sapo" else only(
         ({A + "tau_pos": 1.0, A + "tau_neg": 1.05}[f.path],), "TRL's sapo_temperature default (not exposed)")(f, ctx)),
    (A + "policy_loss.loss_mode", policy_loss_mode),
    (A + "policy_loss.*", info("an argument of another policy loss (clip_cov, kl_cov, dro, ...): inactive")),
    (A + "loss_agg_mode", C.loss_aggregation),
    (A + "loss_scale_factor", lacks((None,), "seq-mean-token-sum-norm divides by the response length (TRL dr_grpo: "
                                            "max_completion_length)")),
    (A + "entropy_coeff", lacks((0, 0.0), "an entropy bonus: the harness does not expose TRL's entropy_coef")),
    (A + "calculate_entropy", info("entropy metric only")),
    (A + "calculate_sum_pi_squared", info("a metric only")),
    (A + "use_kl_loss", use_kl_loss),
    (A + "kl_loss_coef", inactive_unless(_kl_loss, "use_kl_loss=false", exact("arm.beta", float, "TRL beta (k3 KL)"))),
    (A + "kl_loss_type", inactive_unless(_kl_loss, "use_kl_loss=false", only(
        ("low_var_kl", "k3"), "TRL's KL term is the k3 estimator (low_var_kl)"))),
    (A + "ppo_epochs", exact("arm.num_iterations", int, "passes over each rollout (GRPO's mu)")),
    (A + "shuffle", info("order of the mini-batches within a rollout: TRL shuffles the round before splitting it")),
    (A + "data_loader_seed", info("seed of that order")),
    (A + "freeze_vision_tower", only((False,), "the harness trains the whole model (full) or its LoRA adapters")),
    (A + "rollout_n", info("a copy of rollout.n")),
    (A + "checkpoint.**", info("checkpoint contents")),
    (A + "profiler.**", info("profiling")),
    (A + "qat.enable", lacks((False,), "quantization-aware training is not in the harness")),
    (A + "fsdp_config.qat.enable", lacks((False,), "quantization-aware training is not in the harness")),
    (A + "qat.**", info("QAT settings: inactive")),
    (A + "fsdp_config.**", dist("FSDP sharding, offload and precision: on GPUs placement=fsdp; the harness computes "
                                "in model.dtype (qwen: bfloat16, tiny models: float32)")),
    (A + "router_replay.**", dist("MoE routing replay")),
    (A + "*", dist("an engine setting (strategy, sequence parallel, compile, padding, kernels): speed and memory only")),
    # reference, rollout
    ("actor_rollout_ref.ref.profiler.**", info("profiling")),
    ("actor_rollout_ref.ref.**", dist("the reference model's engine settings")),
    (R + "name", dist("rollout engine: on a GPU node add rollout=vllm_colocate (the same sampling distribution as the "
                      "harness's hf rollout)")),
    (R + "n", exact("arm.num_generations", int, "G: responses per prompt")),
    (R + "temperature", exact("arm.temperature", float)),
    (R + "top_p", exact("arm.top_p", float)),
    (R + "top_k", C.top_k),
    (R + "do_sample", only((True,), "the harness samples its rollouts")),
    (R + "ignore_eos", only((False,), "the harness stops a completion at EOS")),
    (R + "over_sample_rate", lacks((0, 0.0), "every sampled response is trained on")),
    (R + "seed", info("the engine's seed: the harness derives every sampling seed from its run seed")),
    (R + "val_kwargs.*", eval_sampling),
    (R + "prompt_length", info("a copy of data.max_prompt_length")),
    (R + "response_length", info("a copy of data.max_response_length")),
    (R + "calculate_log_probs", info("rollout log-probs for the mismatch metrics")),
    (R + "multi_turn.enable", lacks((False,), "the harness's rollouts are single-turn")),
    (R + "multi_turn.**", info("multi-turn settings: inactive")),
    (R + "quantization", lacks((None,), "the rollout samples from the trained weights unquantized")),
    (R + "gpu_memory_utilization", dist("vLLM's GPU memory share: rollout.gpu_memory_utilization with "
                                        "rollout=vllm_colocate")),
    (R + "tensor_model_parallel_size", dist("vLLM tensor parallel size: rollout.tensor_parallel_size")),
    (R + "profiler.**", info("profiling")),
    (R + "trace.**", info("tracing")),
    (R + "prometheus.**", info("metrics export")),
    (R + "**", dist("a rollout-engine setting (parallelism, caching, scheduling, agents): speed and memory only")),
    # model
    (M + "path", lambda f, ctx: C.model_path(f, ctx, ctx.get(M + "lora_rank") or 0, ctx.get(M + "lora_alpha"), None)),
    (M + "lora_rank", lambda f, ctx: ("exact", "model.tuning", "0: full fine-tuning; > 0: LoRA of this rank")),
    (M + "lora_alpha", inactive_unless(lambda ctx: ctx.facts["lora"], "lora_rank=0",
                                       lambda f, ctx: ("exact", "model.lora_alpha", "LoRA alpha"))),
    (M + "target_modules", C.lora_targets),
    (M + "exclude_modules", info("modules kept out of LoRA: the harness's list adapts language modules only")),
    (M + "lora_adapter_path", unset_or(not_impl("a saved adapter to start from: use arm.init=PATH with a harness policy"))),
    (M + "lora.**", info("Megatron's LoRA settings: the FSDP engine reads model.lora_rank")),
    (M + "override_config**", unset_or(not_impl("the harness builds the model as saved"), "empty: the model as saved")),
    (M + "enable_gradient_checkpointing", when(
        lambda f, ctx: "model" in ctx.replaced, dist("memory only (the model is replaced)"),
        mapped("distributed_only", "model.gradient_checkpointing", bool, "memory only: the same gradients either way"))),
    (M + "custom_chat_template", unset_or(not_impl("the harness uses the processor's chat template"))),
    (M + "mtp.enable", lacks((False,), "multi-token prediction is not in the harness")),
    (M + "mtp.**", info("MTP settings: inactive")),
    (M + "*", info("loading and kernel options (tokenizer path, remote code, fused kernels): no training meaning")),
    (M + "**", info("kernel options")),
    ("actor_rollout_ref.*", dist("actor/rollout colocation and timeouts")),
    # data
    ("data.train_files", C.train_files),
    ("data.val_files", C.val_files),
    ("data.prompt_key", C.column("question")),
    ("data.image_key", C.column("image")),
    ("data.max_prompt_length", not_impl("the harness neither truncates nor filters prompts (no prompt cap); the data "
                                        "contract checks each prompt's token envelope")),
    ("data.max_response_length", C.MAX_RESPONSE),
    ("data.train_batch_size", C.ROLLOUT_BATCH),
    ("data.gen_batch_size", unset_or(lambda f, ctx: (
        "not_implemented", None, "generation batch of dynamic sampling: the harness samples exactly one round of "
        "data.train_batch_size prompts") if ctx.get("algorithm.filter_groups.enable") else (
        "informational_only", None, "generation in chunks until a rollout batch is full: the same round"),
        "unset: one generation batch per rollout")),
    ("data.shuffle", only((True,), "the harness shuffles the training set (TRL shuffle_dataset=true)")),
    ("data.seed", unset_or(mapped("locally_lowered", "seed", int, "the harness has one run seed: data order, sampling "
                                                                  "and init"), "unset: verl's fixed default order seed")),
    ("data.filter_overlong_prompts", not_impl("the harness does not filter prompts by length")),
    ("data.truncation", info("what to do with an over-long prompt: the harness keeps whole prompts")),
    ("data.train_max_samples", unset_or(not_impl("a cap on the training rows: the harness trains on its whole split"))),
    ("data.val_max_samples", unset_or(mapped("locally_lowered", "data.eval_max_items", int, "eval views at most"))),
    ("data.custom_cls.*", unset_or(not_impl("a custom dataset class: the harness reads its own schema"))),
    ("data.image_patch_size", info("the processor's patch size (the harness: model.patch_size)")),
    ("data.*kwargs**", unset_or(not_impl("processor / chat-template arguments: not passed"), "empty")),
    ("data.**", info("dataset loading details (keys, workers, return formats, tools): no training meaning here")),
    # algorithm
    ("algorithm.adv_estimator", adv_estimator),
    ("algorithm.norm_adv_by_std_in_grpo", norm_adv),
    ("algorithm.use_kl_in_reward", lacks((False,), "KL in the reward: TRL and the harness add KL only as a loss term "
                                                  "(actor.use_kl_loss)")),
    ("algorithm.kl_penalty", info("KL in the reward only: inactive")),
    ("algorithm.kl_ctrl.**", info("the controller of KL in the reward: inactive")),
    ("algorithm.gamma", info("GAE discount: unused by GRPO")),
    ("algorithm.lam", info("GAE lambda: unused by GRPO")),
    ("algorithm.use_pf_ppo", lacks((False,), "preference-feedback PPO reweighting is not in the harness")),
    ("algorithm.pf_ppo.*", info("pf_ppo settings: inactive")),
    ("algorithm.filter_groups.enable", lambda f, ctx: (
        "not_implemented", None, "DAPO dynamic sampling (drop groups whose `metric` has no variance and sample again "
        "until the batch is full): the harness trains on every group; a group whose rewards are all equal has zero "
        "advantage, so it adds no policy gradient but its tokens still count in the dapo normalizer and the budget")
     if f.value else ("informational_only", None, "off: every sampled group is trained on, as in the harness")),
    ("algorithm.filter_groups.*", inactive_unless(lambda ctx: ctx.get("algorithm.filter_groups.enable"),
                                                  "filter_groups.enable=false",
                                                  not_impl("a dynamic sampling setting: the harness keeps every group"))),
    ("algorithm.rollout_correction.rollout_is", unset_or(lambda f, ctx: (
        ctx.set("rollout.importance_sampling_mode", {"token": "token_truncate", "sequence": "sequence_truncate"}
                .get(f.value, "sequence_mask"), f.path),
        ("locally_lowered", "rollout.importance_sampling_mode", "rollout/training mismatch correction: TRL's truncated "
         "IS weights (applies with a vLLM rollout only)"))[-1], "off: the harness's hf rollout has no mismatch; with "
         "rollout=vllm_* the harness corrects by default (rollout.importance_sampling_*)")),
    ("algorithm.rollout_correction.rollout_rs*", unset_or(lacks((None,), "rejection sampling of mismatched rollouts"))),
    ("algorithm.rollout_correction.bypass_mode", lacks((False,), "the harness recomputes old log-probs")),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", lacks((False,), "TRL does not renormalize IS weights")),
    ("algorithm.rollout_correction.*", info("correction setting: applies with rollout_is only")),
    ("algorithm.*", info("verl's class path")),
    # reward
    ("custom_reward_function.path", reward_fn_path),
    ("reward.custom_reward_function.path", reward_fn_path),
    ("custom_reward_function.name", reward_fn_name),
    ("reward.custom_reward_function.name", reward_fn_name),
    ("custom_reward_function.reward_kwargs**", reward_fn_kwargs),  # verl reads reward_kwargs with .get(): not in
    ("reward.custom_reward_function.reward_kwargs**", reward_fn_kwargs),  # its generated schema, added with +
    ("reward.reward_manager.name", reward_manager),
    ("reward_model.reward_manager", reward_manager),
    ("reward.reward_manager.source", lambda f, ctx: ("informational_only", None, "register: one of verl's managers")
     if f.value == "register" else ("not_implemented", None, "a custom reward manager class is not run: a custom "
                                    "reward function is called per completion as verl's naive manager calls it")),
    ("reward.reward_model.enable", lacks((False, None), "a learned reward model: the harness's reward is rule-based")),
    ("reward_model.enable", lacks((False, None), "a learned reward model: the harness's reward is rule-based")),
    ("reward.num_workers", dist("reward workers")),
    ("reward_model.**", info("reward-model settings: inactive")),
    ("reward.**", info("verl's reward workers and reward-manager module settings: no training meaning here")),
    ("custom_reward_function.*", info("a setting of the custom reward function")),
    ("sandbox_fusion.**", info("code-execution sandbox of some reward functions: unused")),
    # the rest
    ("critic.**", info("the critic exists only for adv_estimator=gae (refused): unused")),
    ("distillation.enabled", lacks((False,), "on-policy distillation: not a harness arm yet")),
    ("distillation.**", info("distillation settings: inactive")),
    ("trainer.total_epochs", lambda f, ctx: ("informational_only", None, "superseded by trainer.total_training_steps")
     if ctx.facts.get("epochs_field") != f.path else ("semantically_conformant", "budget.max_steps", ctx.facts["budget_note"])),
    ("trainer.total_training_steps", unset_or(lambda f, ctx: ("semantically_conformant", "budget.max_steps",
                                                              ctx.facts["budget_note"]), "unset: total_epochs counts the steps")),
    ("trainer.val_before_train", exact("train.eval_before", bool, "evaluate the initial policy first")),
    ("trainer.val_only", lacks((False,), "evaluation without training is python -m harness.eval RUN_DIR")),
    ("trainer.test_freq", C.EVAL_FREQ),
    ("trainer.save_freq", C.SAVE_FREQ),
    ("trainer.max_actor_ckpt_to_keep", C.SAVE_LIMIT),
    ("trainer.nnodes", dist("nodes: the harness's placement.num_processes counts processes")),
    ("trainer.n_gpus_per_node", dist("GPUs per node: on GPUs add placement=fsdp placement.num_processes=N")),
    ("trainer.balance_batch", dist("sequence-length balancing across ranks: speed only")),
    ("trainer.device", dist("the accelerator (the harness: placement.device)")),
    ("trainer.use_v1", dist("which worker implementation runs")),
    ("trainer.v1.trainer_mode", lacks(("sync",), "asynchronous (off-policy) training is not in the harness")),
    ("trainer.v1.**", info("async trainer settings: inactive")),
    ("trainer.logger", info("loggers: the harness writes metrics.jsonl always; add logger=wandb / logger=tensorboard")),
    ("trainer.**", info("names, paths, resume and logging of verl's run (the harness's run dir is derived from the "
                        "plan; the same command resumes it)")),
    ("transfer_queue.enable", dist("verl's data transfer system")),
    ("transfer_queue.**", dist("data transfer settings")),
    ("global_profiler.**", info("profiling")),
    ("skip.**", info("rollout dump / replay for debugging")),
    ("ray_kwargs.**", dist("Ray settings")),
]

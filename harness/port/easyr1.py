"""EasyR1's PPOConfig (hiyouga/EasyR1) and the PAPO fork's fields (MikeWangWZHL/PAPO): how each field maps onto
the harness. Units: `data.rollout_batch_size` prompts per rollout (one generation round), each with
`worker.rollout.n` responses; `worker.actor.global_batch_size` prompts per optimizer step (EasyR1 multiplies it by
n); `worker.actor.ppo_epochs` passes over a rollout. Harness: arm.prompts_per_step x arm.steps_per_generation =
prompts per round, arm.num_iterations passes (docs/arms.md, harness/rounds.py). PAPO fork (verl/workers/actor/
dp_actor.py): loss = pg - kl_prcp_coef * KL_prcp(low_var_kl) + aug_entropy_coef * H_aug + ori_entropy_coef * H_ori,
H = -mean(log p): the harness's papo term with gamma, eta2, eta1 (docs/arms.md papo)."""

from __future__ import annotations

import harness.port.common as C
from harness.port.core import Ctx, Field, dist, exact, inactive_unless, info, lacks, mapped, not_impl, only, when

FORK_ONLY = ("algorithm.loss_avg_mode", "algorithm.use_kl_prcp", "algorithm.contrastive_type", "algorithm.kl_prcp_",
             "algorithm.aug_config", "algorithm.incorrect_weighting", "algorithm.use_aug_entropy_loss",
             "algorithm.aug_entropy_loss_coef", "algorithm.use_ori_entropy_loss", "algorithm.ori_entropy_loss_coef",
             "algorithm.use_sft_loss", "algorithm.sft_loss_coef", "data.aug_image_key", "worker.reward.reward_type",
             "trainer.save_best_checkpoint", "worker.actor.optim.warmup_style")


def prepare(ctx: Ctx) -> None:
    g = ctx.get
    ctx.facts["columns"] = {"image": g("data.image_key"), "question": g("data.prompt_key"), "answer": g("data.answer_key")}
    ctx.facts["fork"] = any(f.set and f.path.startswith(FORK_ONLY) for f in ctx.fields.values())
    ctx.facts["lora"] = (g("worker.actor.model.lora.rank") or 0) > 0
    ctx.facts["papo"] = bool(g("algorithm.use_kl_prcp"))
    ctx.facts["n"] = g("worker.rollout.n")
    ctx.facts["max_len"] = g("data.max_response_length")
    ctx.facts["ppo_epochs"] = g("worker.actor.ppo_epochs")
    ctx.facts["epochs"] = g("trainer.total_epochs")
    ctx.facts["epochs_field"] = "trainer.total_epochs"
    if g("trainer.max_steps") is not None:
        ctx.facts["rollout_steps"] = g("trainer.max_steps")
        ctx.facts["epochs_field"] = "trainer.max_steps"
    loss = g("worker.actor.loss_type")
    if loss in ("cispo", "sapo"):
        ctx.facts["loss_type_from_policy"] = loss
    C.round_shape(ctx, g("data.rollout_batch_size"), g("worker.actor.global_batch_size"),
                  "data.rollout_batch_size", "worker.actor.global_batch_size")
    ctx.facts["budget_note"] = C.derive_budget(ctx, ctx.facts.get("n_train"))
    C.warmup(ctx, "worker.actor.optim.lr_warmup_steps", "worker.actor.optim.lr_warmup_ratio")


# --- handlers


EASYR1_CALL = ("called as EasyR1's reward manager calls it (verl/workers/reward/function.py): {how}, each input "
               "{{response, response_length, ground_truth}} (the completion's text with special tokens skipped, its "
               "tokens up to and including end-of-sequence, the row's target), reward_function_kwargs by keyword; "
               "the reward is each result's 'overall'")


def _easyr1_fn(ctx: Ctx) -> tuple[str, str] | None:
    from harness.rewards.conventions import easyr1_target

    value = ctx.get("worker.reward.reward_function")
    return easyr1_target(str(value)) if value else None


def _declared_type(file: str) -> str | None:
    """The REWARD_TYPE the function's file declares (read, not imported), or None (absent or not readable here)."""
    from pathlib import Path

    from harness.rewards.conventions import declared_reward_type

    try:
        return declared_reward_type(Path(file).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _harness_type(ctx: Ctx, file: str) -> tuple[str, str]:
    """(batch | sequential as the harness will call the function, why)."""
    declared = _declared_type(file)
    if declared is not None:
        return declared, f"the file declares REWARD_TYPE = {declared!r}"
    return "batch", "no REWARD_TYPE in the file (or not readable from here): batch, EasyR1's default"


def reward_function(f: Field, ctx: Ctx):
    fn = _easyr1_fn(ctx)
    if fn is None:
        return ("informational_only", None, "unset (EasyR1 refuses to train without one): the harness scores with its "
                "built-in reward (relation-aware match + format - invalid penalty, docs/arms.md grpo)")
    file, name = fn
    rtype, why = _harness_type(ctx, file)
    how = ("one call with the list of every completion's input (REWARD_TYPE batch)" if rtype == "batch" else
           "one call per completion's input (REWARD_TYPE sequential)") + f": {why}"
    named = "" if ":" in str(f.value) else f"; no ':NAME' in the value: {name}, EasyR1's default"
    note = C.reward_function(f, ctx, file, f"{file}:{name}", "easyr1",
                             C.free_dict(ctx, "worker.reward.reward_function_kwargs"),
                             "worker.reward.reward_function_kwargs", EASYR1_CALL.format(how=how) + named)
    return "exact", "reward._target_", note


def reward_type(f: Field, ctx: Ctx):
    """The PAPO fork's field (upstream EasyR1 reads the module's REWARD_TYPE instead; so does the harness)."""
    fn = _easyr1_fn(ctx)
    if fn is None:
        return "informational_only", None, "inactive (no reward function)"
    if not ctx.facts["fork"]:
        return ("informational_only", None, "PAPO fork only: upstream EasyR1 reads the function module's REWARD_TYPE "
                "(batch when absent), as the harness does")
    rtype, why = _harness_type(ctx, fn[0])
    if f.value == rtype:
        return "exact", "reward.convention", f"the fork calls the function {f.value}-wise; the harness too: {why}"
    ctx.refuse(f, f"the PAPO fork calls the function {f.value}-wise from this field; the harness reads the module's "
                  f"REWARD_TYPE (upstream EasyR1's declaration): {why}",
               f"set REWARD_TYPE = {f.value!r} at the top level of {fn[0]} (upstream EasyR1 reads it too)")
    return "unsupported", None, "batch/sequential comes from the module's REWARD_TYPE in the harness"


def _papo(ctx: Ctx) -> bool:
    return ctx.facts["papo"]


def _kl_loss(ctx: Ctx) -> bool:
    return not ctx.get("algorithm.disable_kl") and bool(ctx.get("algorithm.use_kl_loss"))


def arm_choice(f: Field, ctx: Ctx):
    ctx.set("arm", "papo" if f.value else "grpo", f.path)
    return "exact", "arm", "true: arm=papo (GRPO + the implicit perception loss); false: arm=grpo"


def adv_estimator(f: Field, ctx: Ctx):
    if f.value in ("grpo", "dapo"):
        return "exact", None, ("group-normalized outcome advantage (r - mean) / (std + eps) over the n responses of a "
                               "prompt: TRL's GRPO advantage (dapo in the PAPO fork computes the same)")
    ctx.refuse(f, f"advantage estimator {f.value!r}: the harness's RL arms are GRPO-family (group-normalized "
                  "advantages, no critic)", "use adv_estimator=grpo")
    return "unsupported", None, "not GRPO's advantage"


def disable_kl(f: Field, ctx: Ctx):
    if f.value:
        ctx.set("arm.beta", 0.0, f.path)
        return "exact", "arm.beta", "no reference model: beta 0 (TRL then loads no reference)"
    return "exact", None, "the reference model is kept; use_kl_loss says how KL enters"


def use_kl_loss(f: Field, ctx: Ctx):
    if ctx.get("algorithm.disable_kl"):
        return "informational_only", None, "inactive (algorithm.disable_kl=true): does not change training"
    if f.value:
        return "exact", "arm.beta", "KL as a loss term (TRL's beta), coefficient algorithm.kl_coef"
    ctx.refuse(f, "KL in the reward (EasyR1's default when the KL is not disabled): TRL and the harness add KL only "
                  "as a loss term", "set algorithm.use_kl_loss=true (KL loss) or algorithm.disable_kl=true")
    return "unsupported", None, "KL in the reward"


def kl_penalty(f: Field, ctx: Ctx):
    if not _kl_loss(ctx):
        return "informational_only", None, "inactive (no KL loss): does not change training"
    return only(("low_var_kl", "k3"), "TRL's KL term is the k3 estimator (low_var_kl)")(f, ctx)


def kl_coef(f: Field, ctx: Ctx):
    if not _kl_loss(ctx):
        return "informational_only", None, "inactive (no KL loss): does not change training"
    ctx.set("arm.beta", float(f.value), f.path)
    return "exact", "arm.beta", "KL loss coefficient (TRL beta, k3 estimator)"


def entropy_pair(flag: str, coef: str, key: str, branch: str):
    def on(f: Field, ctx: Ctx):
        if f.path == flag:
            ctx.set(key, float(ctx.get(coef)) if f.value else 0.0, f.path)
            return "exact", key, f"{branch} entropy term on/off ({key} = {coef} when on, 0 when off)"
        if not ctx.get(flag):
            return "informational_only", None, f"inactive ({flag}=false): does not change training"
        return "exact", key, f"+ coef x (-mean log p) on the {branch} branch, as the harness's {key}"
    return inactive_unless(_papo, "algorithm.use_kl_prcp=false", on)


def aug_config(f: Field, ctx: Ctx):
    key = f.path.rsplit(".", 1)[-1]
    if not _papo(ctx):
        return "informational_only", None, "inactive (algorithm.use_kl_prcp=false): does not change training"
    if key == "black_prob":
        ctx.set("arm.mask_ratio", float(f.value), f.path)
        return ("exact", "arm.mask_ratio", "probability that a patch cell is blacked out (the fork draws it with "
                "np.random per image; the harness seeds each mask from run seed, step, slot and image: "
                "the same distribution, resumable)")
    if key == "patch_size":
        ctx.set("arm.patch_size", int(f.value), f.path)
        return "exact", "arm.patch_size", "masking cell size in pixels"
    if key == "aug_config":
        ctx.set("arm.patch_size", 14, f.path)
        return ("semantically_conformant", "arm.patch_size", "empty: random_patch_blackening's defaults, patch 14 and "
                "black_prob 0.6 (= arm.mask_ratio's default)")
    ctx.refuse(f, "random_patch_blackening takes patch_size and black_prob only (the fork would fail on it)",
               "drop it")
    return "unsupported", None, "not an argument of the fork's masking"


def ignore_eos(f: Field, ctx: Ctx):
    return only((False,), "the harness stops a completion at EOS")(f, ctx)


RULES = [
    # data
    ("data.train_files", C.train_files),
    ("data.val_files", C.val_files),
    ("data.prompt_key", C.column("question")),
    ("data.answer_key", C.column("answer")),
    ("data.image_key", C.column("image")),
    ("data.aug_image_key", inactive_unless(_papo, "algorithm.use_kl_prcp=false", not_impl(
        "a column of precomputed masked images: the harness masks each image on the fly (arm.mask_ratio, arm.patch_size)"))),
    ("data.video_key", info("video column: the harness's schema has images only")),
    ("data.video_fps", info("video only: the harness's schema has images only")),
    ("data.image_dir", info("a path of the source's data")),
    ("data.max_prompt_length", not_impl("the harness neither truncates nor filters prompts (no prompt cap); the data "
                                        "contract checks each prompt's token envelope")),
    ("data.max_response_length", C.MAX_RESPONSE),
    ("data.rollout_batch_size", C.ROLLOUT_BATCH),
    ("data.mini_rollout_batch_size", lambda f, ctx: (
        ("not_implemented", None, "generation batch of online filtering: the harness samples exactly one round of "
         "data.rollout_batch_size prompts") if ctx.get("algorithm.online_filtering") else
        ("informational_only", None, "generation in chunks until a rollout batch is full: the same round"
         if f.value is not None else "unset: one generation batch per rollout"))),
    ("data.val_batch_size", dist("eval batch size: memory and speed only (the harness: train.eval_batch_size)")),
    ("data.format_prompt", not_impl("the harness builds its own prompt (question, choices, and the "
                                    "<answer>...</answer> schema of harness.rewards.answers); the recipe's "
                                    "template is not used")),
    ("data.override_chat_template", lambda f, ctx: (
        "informational_only", None, "unset: the model's chat template") if f.value is None else (
        "not_implemented", None, "the harness uses the processor's chat template")),
    ("data.shuffle", only((True,), "the harness shuffles the training set (TRL shuffle_dataset=true)")),
    ("data.seed", mapped("locally_lowered", "seed", int, "the harness has one run seed: data order, sampling and "
                                                         "init (EasyR1's data.seed orders the data only)")),
    ("data.min_pixels", not_impl("the harness feeds each image at its stored size through the model's processor "
                                 "(its own min/max pixels)")),
    ("data.max_pixels", not_impl("the harness feeds each image at its stored size through the model's processor "
                                 "(its own min/max pixels)")),
    ("data.filter_overlong_prompts", not_impl("the harness does not filter prompts by length")),
    ("data.filter_overlong_prompts_workers", dist("worker processes of the prompt filter")),
    # algorithm
    ("algorithm.gamma", info("GAE discount: unused by GRPO")),
    ("algorithm.lam", info("GAE lambda: unused by GRPO")),
    ("algorithm.adv_estimator", adv_estimator),
    ("algorithm.disable_kl", disable_kl),
    ("algorithm.use_kl_loss", use_kl_loss),
    ("algorithm.kl_penalty", kl_penalty),
    ("algorithm.kl_coef", kl_coef),
    ("algorithm.kl_type", lambda f, ctx: ("informational_only", None, "the KL controller acts on KL in the reward only")
     if f.value == "fixed" or _kl_loss(ctx) or ctx.get("algorithm.disable_kl") else
     only(("fixed",), "the harness's beta is constant")(f, ctx)),
    ("algorithm.kl_horizon", info("adaptive KL controller only (KL in the reward)")),
    ("algorithm.kl_target", info("adaptive KL controller only (KL in the reward)")),
    ("algorithm.online_filtering", lambda f, ctx: (
        "not_implemented", None, "DAPO dynamic sampling (drop prompts whose mean score is <= filter_low or >= "
        "filter_high and sample again until the rollout batch is full): the harness trains on every prompt's group; "
        "a group whose rewards are all equal has zero advantage, so it adds no policy gradient but its tokens still "
        "count in the dapo normalizer and the budget") if f.value else
        ("informational_only", None, "off: every sampled group is trained on, as in the harness")),
    ("algorithm.filter_*", inactive_unless(lambda ctx: ctx.get("algorithm.online_filtering"), "online_filtering=false",
                                           not_impl("dynamic sampling threshold: the harness keeps every group"))),
    ("algorithm.loss_avg_mode", lambda f, ctx: C.loss_aggregation(f, ctx) if ctx.facts["fork"] else (
        "informational_only", None, "PAPO fork only (the recipe sets no fork field): upstream EasyR1 reads "
        "worker.actor.loss_avg_mode")),
    ("algorithm.use_kl_prcp", arm_choice),
    ("algorithm.contrastive_type", inactive_unless(_papo, "algorithm.use_kl_prcp=false", only(
        ("augmented",), "the masked view is the image with random patches blacked out (arm.mask_ratio)"))),
    ("algorithm.kl_prcp_schedule", inactive_unless(_papo, "algorithm.use_kl_prcp=false", only(
        ("fixed",), "the harness's arm.gamma is constant over the run"))),
    ("algorithm.kl_prcp_schedule_args**", lambda f, ctx: ("informational_only", None,
                                                         "annealing arguments: inactive with kl_prcp_schedule=fixed")),
    ("algorithm.kl_prcp_penalty", inactive_unless(_papo, "algorithm.use_kl_prcp=false", only(
        ("low_var_kl", "k3"), "KL_prcp is the k3 estimator (low_var_kl, clamped at 10 = arm.kappa)"))),
    ("algorithm.kl_prcp_coef", inactive_unless(_papo, "algorithm.use_kl_prcp=false", exact(
        "arm.gamma", float, "coefficient of KL_prcp, maximized (loss - coef x KL_prcp), as arm.gamma"))),
    ("algorithm.kl_prcp_apply_mode", inactive_unless(_papo, "algorithm.use_kl_prcp=false", only(
        ("all",), "KL_prcp on every response (the fork itself implements only 'all')"))),
    ("algorithm.aug_config**", aug_config),
    ("algorithm.incorrect_weighting", info("kl_prcp_apply_mode=weighted only: inactive")),
    ("algorithm.use_aug_entropy_loss", entropy_pair("algorithm.use_aug_entropy_loss", "algorithm.aug_entropy_loss_coef",
                                                    "arm.eta2", "masked")),
    ("algorithm.aug_entropy_loss_coef", entropy_pair("algorithm.use_aug_entropy_loss", "algorithm.aug_entropy_loss_coef",
                                                     "arm.eta2", "masked")),
    ("algorithm.use_ori_entropy_loss", entropy_pair("algorithm.use_ori_entropy_loss", "algorithm.ori_entropy_loss_coef",
                                                    "arm.eta1", "original")),
    ("algorithm.ori_entropy_loss_coef", entropy_pair("algorithm.use_ori_entropy_loss", "algorithm.ori_entropy_loss_coef",
                                                     "arm.eta1", "original")),
    ("algorithm.use_kl_prcp_clipping", when(
        lambda f, ctx: f.value and _papo(ctx),
        lambda f, ctx: mapped("exact", "arm.kappa", lambda v: float(ctx.get("algorithm.kl_prcp_clipping")),
                              "per-token KL_prcp clamped at kl_prcp_clipping = arm.kappa")(f, ctx),
        lambda f, ctx: ("exact", None, "off: low_var_kl's own clamp at 10 = arm.kappa's default"))),
    ("algorithm.kl_prcp_clipping", lambda f, ctx: ("exact", "arm.kappa", "the clamp of KL_prcp")
     if ctx.get("algorithm.use_kl_prcp_clipping") and _papo(ctx) else
     ("informational_only", None, "inactive (use_kl_prcp_clipping=false): does not change training")),
    ("algorithm.use_kl_prcp_token_level_mask", lacks((False,), "the harness applies KL_prcp on every token")),
    ("algorithm.kl_prcp_token_level_mask_top_p", info("use_kl_prcp_token_level_mask only: inactive")),
    ("algorithm.use_sft_loss", lacks((False,), "the harness's RL arms add no SFT loss")),
    ("algorithm.sft_loss_coef", info("use_sft_loss only: inactive")),
    # worker
    ("worker.hybrid_engine", dist("actor and rollout share the GPUs (the harness: rollout=vllm_colocate)")),
    ("worker.actor.strategy", dist("FSDP sharding: on GPUs add placement=fsdp (or ddp) placement.num_processes=N")),
    ("worker.actor.global_batch_size", lambda f, ctx: (
        "semantically_conformant", "arm.prompts_per_step", f"prompts per optimizer step (EasyR1 multiplies by n: "
        f"{f.value} x {ctx.get('worker.rollout.n')} responses), whatever the micro-batching")),
    ("worker.actor.micro_batch_size_per_device_for_*", dist(
        "micro-batch per GPU: memory only. The harness splits an optimizer step's completions over placement ranks x "
        "arm.gradient_accumulation_steps (the same update, tested)")),
    ("worker.actor.max_grad_norm", exact("arm.max_grad_norm", float)),
    ("worker.actor.clip_ratio_low", exact("arm.epsilon", float, "lower clip range of the importance ratio")),
    ("worker.actor.clip_ratio_high", exact("arm.epsilon_high", float, "upper clip range (DAPO clip-higher); TRL "
                                                                        "epsilon_high")),
    ("worker.actor.clip_ratio_dual", not_impl(
        "dual-clip PPO bound (for A < 0 the ratio's loss is capped at C): the harness does not expose TRL's `delta` "
        "(the same bound), so none applies. It binds only off-policy, on the later mini-batches of a round or "
        "ppo_epochs > 1")),
    ("worker.actor.loss_avg_mode", lambda f, ctx: ("informational_only", None, "overwritten by algorithm.loss_avg_mode "
                                                   "(PAPO fork post_init)") if ctx.facts["fork"] else C.loss_aggregation(f, ctx)),
    ("worker.actor.loss_type", lambda f, ctx: {
        "default": lambda: ("exact", None, "the clipped PPO/GRPO surrogate"),
        "gspo": lambda: (ctx.set("arm.importance_sampling_level", "sequence", f.path),
                         ("exact", "arm.importance_sampling_level", "sequence-level ratio (GSPO)"))[-1],
        "cispo": lambda: (ctx.set("arm.loss_type", "cispo", f.path),
                          ("locally_lowered", "arm.loss_type", "TRL's cispo (clipped IS weight x advantage x log p, "
                           "token-normalized); its upper clip is arm.epsilon_high"))[-1],
        "sapo": lambda: (ctx.set("arm.loss_type", "sapo", f.path),
                         ("exact", "arm.loss_type", "TRL's sapo (soft gate); temperatures below"))[-1],
    }.get(f.value, lambda: only(("default", "gspo", "cispo", "sapo"), "not a TRL loss")(f, ctx))()),
    ("worker.actor.ppo_epochs", exact("arm.num_iterations", int, "passes over each rollout (GRPO's mu)")),
    ("worker.actor.tau_*", lambda f, ctx: ("informational_only", None, "SAPO temperature: inactive (loss_type is not sapo)")
     if ctx.get("worker.actor.loss_type") != "sapo" else
     lacks(({"worker.actor.tau_positive": 1.0, "worker.actor.tau_negative": 1.05}[f.path],),
          "equal to TRL's sapo_temperature default (the harness does not expose it)")(f, ctx)),
    ("worker.actor.model.model_path", lambda f, ctx: C.model_path(
        f, ctx, ctx.get("worker.actor.model.lora.rank") or 0, ctx.get("worker.actor.model.lora.alpha"), None)),
    ("worker.actor.model.tokenizer_path", info("null = the model's own tokenizer (the harness: the model's processor)")),
    ("worker.actor.model.override_config**", lambda f, ctx: ("informational_only", None, "empty: the model as saved")
     if f.value in ({}, None) else ("not_implemented", None, "the harness builds the model as saved")),
    ("worker.actor.model.enable_gradient_checkpointing", lambda f, ctx: ("distributed_only", None, "memory only; the "
     "model is replaced") if "model" in ctx.replaced else (ctx.set("model.gradient_checkpointing", bool(f.value), f.path),
     ("distributed_only", "model.gradient_checkpointing", "memory only: the same gradients either way"))[-1]),
    ("worker.actor.model.trust_remote_code", info("loading flag: the harness loads Qwen-VL classes of transformers")),
    ("worker.actor.model.freeze_vision_tower", only((False,), "the harness trains the whole model (full) or its LoRA "
                                                              "adapters")),
    ("worker.actor.model.lora.rank", lambda f, ctx: ("exact", "model.tuning", "0: full fine-tuning; > 0: LoRA of this "
                                                     "rank (model.lora_r)")),
    ("worker.actor.model.lora.alpha", lambda f, ctx: ("exact", "model.lora_alpha", "LoRA alpha") if ctx.facts["lora"]
     else ("informational_only", None, "inactive (LoRA rank 0): does not change training")),
    ("worker.actor.model.lora.target_modules", C.lora_targets),
    ("worker.actor.model.lora.exclude_modules", info("modules kept out of LoRA: the harness's list adapts language "
                                                     "modules only")),
    ("worker.actor.optim.lr", exact("arm.learning_rate", float, "AdamW peak learning rate")),
    ("worker.actor.optim.betas", lacks(([0.9, 0.999],), "TRL's AdamW betas (the harness does not expose them)")),
    ("worker.actor.optim.weight_decay", exact("arm.weight_decay", float, "AdamW weight decay")),
    ("worker.actor.optim.strategy", lambda f, ctx: ("exact", None, "AdamW (TRL adamw_torch)") if f.value == "adamw" else
     ("not_implemented", None, "AdamW with bf16 states: the harness's AdamW keeps its states in the parameters' dtype")
     if f.value == "adamw_bf16" else only(("adamw", "adamw_bf16"), "AdamW only")(f, ctx)),
    ("worker.actor.optim.lr_warmup_ratio", C.warmup_ratio),
    ("worker.actor.optim.lr_warmup_steps", C.warmup_steps),
    ("worker.actor.optim.min_lr_ratio", lambda f, ctx: ("informational_only", None, "unset: decay to 0") if f.value in (None, 0, 0.0)
     else lacks((None,), "the harness's schedules decay to 0")(f, ctx)),
    ("worker.actor.optim.lr_scheduler_type", lambda f, ctx: C.scheduler(f, ctx) if not ctx.facts["fork"] else (
        "informational_only", None, "upstream EasyR1's name; the PAPO fork reads optim.warmup_style")),
    ("worker.actor.optim.warmup_style", lambda f, ctx: C.scheduler(f, ctx) if ctx.facts["fork"] else (
        "informational_only", None, "PAPO fork only (the recipe sets no fork field)")),
    ("worker.actor.optim.training_steps", info("auto key: set from the step count by the trainer")),
    ("worker.actor.fsdp.*", dist("FSDP sharding and mixed precision: on GPUs placement=fsdp; the harness computes in "
                                 "model.dtype (qwen: bfloat16, tiny models: float32)")),
    ("worker.actor.offload.*", dist("CPU offload of parameters / optimizer: memory only")),
    ("worker.actor.padding_free", dist("padding-free packing: speed only")),
    ("worker.actor.dynamic_batching", dist("token-balanced micro-batches: speed and memory only")),
    ("worker.actor.ulysses_size", dist("sequence parallel size")),
    ("worker.actor.use_torch_compile", dist("torch.compile: speed only")),
    ("worker.actor.*", info("auto key: PPOConfig.post_init overwrites it from algorithm.* / worker.actor.*")),
    ("worker.critic.**", info("the critic exists only for adv_estimator=gae (refused): unused")),
    ("worker.ref.fsdp.*", dist("FSDP of the reference model")),
    ("worker.ref.offload.*", dist("CPU offload of the reference model")),
    ("worker.ref.strategy", dist("sharding of the reference model")),
    ("worker.ref.*", info("auto key: WorkerConfig.post_init copies it from worker.actor")),
    ("worker.reward.reward_function", reward_function),
    ("worker.reward.reward_function_kwargs**", lambda f, ctx: ("informational_only", None, "empty")
     if f.value in ({}, None) else ("informational_only", None, "inactive (no reward function)")
     if not ctx.get("worker.reward.reward_function") else ("exact", "reward.kwargs", "a keyword argument of the "
                                                            "function on every call (EasyR1 binds them with partial)")),
    ("worker.reward.reward_type", reward_type),
    ("worker.reward.skip_special_tokens", inactive_unless(
        lambda ctx: bool(ctx.get("worker.reward.reward_function")), "no reward function",
        only((True,), "the function reads each completion as TRL decodes it, special tokens skipped"))),
    ("worker.reward.num_cpus", dist("reward worker CPUs")),
    ("worker.reward.reward_function_name", info("auto key: the function name of reward_function (reward._target_'s "
                                                ":NAME)")),
    ("worker.rollout.name", dist("rollout engine: on a GPU node add rollout=vllm_colocate (the same sampling "
                                 "distribution as the harness's hf rollout)")),
    ("worker.rollout.n", exact("arm.num_generations", int, "G: responses per prompt")),
    ("worker.rollout.temperature", exact("arm.temperature", float)),
    ("worker.rollout.top_p", exact("arm.top_p", float)),
    ("worker.rollout.top_k", C.top_k),
    ("worker.rollout.seed", info("vLLM's seed: the harness derives every sampling seed from its run seed")),
    ("worker.rollout.limit_images", info("vLLM's per-prompt image limit (0 = its default)")),
    ("worker.rollout.dtype", dist("vLLM weights dtype")),
    ("worker.rollout.gpu_memory_utilization", dist("vLLM's GPU memory share: rollout.gpu_memory_utilization with "
                                                   "rollout=vllm_colocate")),
    ("worker.rollout.tensor_parallel_size", dist("vLLM tensor parallel size: rollout.tensor_parallel_size with a vLLM "
                                                 "rollout")),
    ("worker.rollout.ignore_eos", ignore_eos),
    ("worker.rollout.val_override_config**", lambda f, ctx: ("informational_only", None, "empty: eval samples as training")
     if f.value in ({}, None) else ("locally_lowered", None, "eval sampling: the harness's eval is greedy (one "
                                    "sample, temperature 0, train.eval_max_new_tokens)")),
    ("worker.rollout.*", lambda f, ctx: ("informational_only", None, "auto key: PPOConfig.post_init sets it")
     if f.path.rsplit(".", 1)[-1] in ("prompt_length", "response_length", "trust_remote_code") else
     ("distributed_only", None, "vLLM engine setting: speed and memory only")),
    # trainer
    ("trainer.total_epochs", lambda f, ctx: ("informational_only", None, "superseded by trainer.max_steps")
     if ctx.facts.get("epochs_field") != f.path else ("semantically_conformant", "budget.max_steps", ctx.facts["budget_note"])),
    ("trainer.max_steps", lambda f, ctx: ("informational_only", None, "unset: total_epochs counts the steps")
     if f.value is None else ("semantically_conformant", "budget.max_steps", ctx.facts["budget_note"])),
    ("trainer.project_name", info("a name for the logger")),
    ("trainer.experiment_name", info("a name for the logger (the harness names its run dir from the plan)")),
    ("trainer.logger", info("loggers: the harness writes metrics.jsonl always; add logger=wandb / logger=tensorboard")),
    ("trainer.nnodes", dist("nodes: the harness's placement.num_processes counts processes")),
    ("trainer.n_gpus_per_node", dist("GPUs per node: on GPUs add placement=fsdp placement.num_processes=N")),
    ("trainer.max_try_make_batch", inactive_unless(lambda ctx: ctx.get("algorithm.online_filtering"),
                                                   "online_filtering=false", not_impl("dynamic sampling's retry cap"))),
    ("trainer.critic_warmup", info("no critic")),
    ("trainer.val_freq", C.EVAL_FREQ),
    ("trainer.val_before_train", exact("train.eval_before", bool, "evaluate the initial policy first")),
    ("trainer.val_only", lacks((False,), "evaluation without training is python -m harness.eval RUN_DIR")),
    ("trainer.val_generations_to_log", info("logging of eval samples (the harness writes every eval prediction)")),
    ("trainer.save_freq", C.SAVE_FREQ),
    ("trainer.save_limit", C.SAVE_LIMIT),
    ("trainer.save_model_only", info("checkpoint contents: the harness saves full resumable state")),
    ("trainer.save_checkpoint_path", info("a path: the harness's run dir is <output_root>/runs/<run_name>")),
    ("trainer.load_checkpoint_path", lambda f, ctx: ("informational_only", None, "unset") if f.value is None else (
        "not_implemented", None, "an EasyR1 checkpoint is not read: the harness resumes its own run dir")),
    ("trainer.ray_timeline", info("a profiling file")),
    ("trainer.find_last_checkpoint", info("resume: the same harness command resumes its run dir")),
    ("trainer.save_best_checkpoint", info("checkpoint selection by validation score")),
]

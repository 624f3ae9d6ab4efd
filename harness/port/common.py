"""Mappings both sources share: the model, the dataset, the batch round, the loss aggregation, the schedule and the
budget, each in the harness's units (docs/arms.md "Batch semantics"; TRL GRPOConfig, whose units the harness
passes on). Torch-free."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.port.core import Ctx, Field

# verl's loss_agg_mode / EasyR1's loss_avg_mode -> TRL's loss_type (trl GRPOConfig.loss_type help):
#   token-mean: sum over every token of the mini-batch / its token count  == TRL dapo (global accumulated batch)
#   seq-mean-token-mean: mean over sequences of each one's token mean     == TRL grpo (per-sequence length norm)
#   seq-mean-token-sum-norm: token sums / (sequences x response length)   == TRL dr_grpo (max_completion_length)
LOSS_AGG = {"token-mean": ("dapo", "exact", "token mean over the optimizer step's tokens, as TRL's dapo"),
            "token": ("dapo", "exact", "token mean over the optimizer step's tokens, as TRL's dapo"),
            "seq-mean-token-mean": ("grpo", "semantically_conformant",
                                    "each sequence's token mean, averaged over sequences: TRL's grpo"),
            "seq": ("grpo", "semantically_conformant", "each sequence's token mean, averaged over sequences: TRL's grpo"),
            "seq-mean-token-sum-norm": ("dr_grpo", "semantically_conformant",
                                        "token sums over (sequences x response length): TRL's dr_grpo divides by "
                                        "max_completion_length, the same constant")}


def loss_aggregation(f: Field, ctx: Ctx):
    if f.value not in LOSS_AGG:
        ctx.refuse(f, f"{f.value!r} has no TRL loss_type (TRL has token-mean = dapo, seq-mean-token-mean = grpo, "
                      "seq-mean-token-sum-norm = dr_grpo)", "use one of those, or port another recipe")
        return "unsupported", None, "no TRL equivalent"
    loss_type, cls, note = LOSS_AGG[f.value]
    if ctx.facts.get("loss_type_from_policy"):  # cispo / sapo choose TRL's loss_type themselves
        return "informational_only", None, f"superseded: arm.loss_type={ctx.facts['loss_type_from_policy']} sets the aggregation"
    ctx.set("arm.loss_type", loss_type, f.path)
    return cls, "arm.loss_type", note


# --- model


def _family(name: str) -> tuple[str, bool, int] | None:
    """(harness model.family, is_vlm, patch size) of a checkpoint name, or None when the harness cannot build it."""
    n = os.path.basename(name.rstrip("/")).lower().replace("_", "-").replace(".", "-")
    if "qwen3-vl" in n:
        return "qwen3_vl", True, 16
    if "qwen2-5-vl" in n:
        return "qwen2_5_vl", True, 14
    if "qwen2-vl" in n:
        return "qwen2_vl", True, 14
    if n.startswith(("qwen2-", "qwen2-5-")):
        return "qwen2", False, 14
    return None


def model_path(f: Field, ctx: Ctx, lora_rank: int, lora_alpha: int, lora_targets: Any):
    """model_path -> model=qwen with its family; LoRA rank 0 = full fine-tuning (the qwen option defaults to lora)."""
    if "model" in ctx.replaced:
        return "locally_lowered", "model", "replaced on purpose by --harness model=...: the recipe's checkpoint is not used"
    if not isinstance(f.value, str) or not f.value:
        ctx.refuse(f, "names no checkpoint", "set it to the recipe's model, or pass --harness model=tiny_vlm")
        return "unsupported", None, "no model"
    fam = _family(f.value)
    if fam is None:
        ctx.refuse(f, "the harness builds Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen2 text models only",
                   "port with --harness model=qwen model.path=DIR for a Qwen checkpoint, or --harness model=tiny_vlm")
        return "unsupported", None, "not a model family the harness builds"
    family, is_vlm, patch = fam
    local = f.value.startswith(("/", "./", "../", "~")) or Path(f.value).expanduser().exists()
    ctx.set("model", "qwen", f.path)
    ctx.set("model.path" if local else "model.hub_id", os.path.expanduser(f.value) if local else f.value, f.path)
    ctx.set("model.family", family, f.path)
    ctx.set("model.is_vlm", is_vlm, f.path)
    ctx.set("model.patch_size", patch, f.path)
    if lora_rank and lora_rank > 0:
        ctx.set("model.tuning", "lora", f.path)
        ctx.set("model.lora_r", int(lora_rank), f.path)
        ctx.set("model.lora_alpha", int(lora_alpha), f.path)
        tuning = f"LoRA r={lora_rank}, alpha={lora_alpha}"
    else:
        ctx.set("model.tuning", "full", f.path)
        tuning = "full fine-tuning (LoRA rank 0)"
    where = "model.path (a local checkpoint)" if local else "model.hub_id (looked up in the local HF cache, never downloaded)"
    return "exact", "model", f"model=qwen, family {family}, {where}; {tuning}"


def lora_targets(f: Field, ctx: Ctx):
    if "model" in ctx.replaced or not ctx.facts.get("lora"):
        return "informational_only", None, "inactive (no LoRA: full fine-tuning or the model is replaced)"
    value = f.value
    if value == "all-linear":
        mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        ctx.set("model.lora_target_modules", mods, f.path)
        return ("locally_lowered", "model.lora_target_modules",
                "all-linear -> the language model's attention and MLP projections (PEFT's all-linear also adapts the "
                "vision tower's linears, which the harness's list leaves out)")
    mods = [m.strip() for m in value.split(",")] if isinstance(value, str) else list(value)
    ctx.set("model.lora_target_modules", mods, f.path)
    return "exact", "model.lora_target_modules", "the same module names"


# --- data


def convert_command(dataset: str, ctx: Ctx) -> str:
    name, _, split = dataset.partition("@")
    cols = ctx.facts.get("columns", {})
    load = (f"python -c \"import datasets; datasets.load_dataset('{name}'"
            + (f", split='{split}'" if split else "") + ").save_to_disk('HF_DIR')\"")
    return (f"{load}; python -m harness.data convert-hf HF_DIR --out DIR --image-column {cols.get('image', 'images')} "
            f"--question-column {cols.get('question', 'prompt')} --answer-column {cols.get('answer', 'answer')}")


def train_files(f: Field, ctx: Ctx):
    if "data" in ctx.replaced:
        return "locally_lowered", "data", "replaced on purpose by --harness data=...: the recipe's dataset is not used"
    values = f.value if isinstance(f.value, list) else [f.value]
    first = str(values[0]) if values else ""
    ctx.set("data", "jsonl", f.path)
    if ctx.facts.get("user_data_path"):
        return ("locally_lowered", "data.path", f"the recipe's dataset converted into the harness schema at "
                f"{ctx.facts['user_data_path']} (--harness data.path); rows, images and answers as convert-hf wrote them")
    if first and (Path(first).expanduser() / "manifest.json").is_file():
        ctx.set("data.path", str(Path(first).expanduser()), f.path)
        return "exact", "data.path", "a dataset in the harness schema (docs/data.md)"
    cmd = convert_command(first, ctx)
    ctx.refuse(f, "a Hugging Face dataset or a parquet file, not a dataset in the harness schema (and no network here)",
               f"on a machine with network: {cmd}; then port again with --harness data.path=DIR "
               "(or --harness data=synthetic to try the recipe on the synthetic evidence set)")
    return "locally_lowered", "data.path", f"bring it into the harness schema: {cmd}; the preset then needs data.path=DIR"


def val_files(f: Field, ctx: Ctx):
    if "data" in ctx.replaced:
        return "informational_only", None, "the dataset is replaced by --harness data=...; its eval split is used"
    return ("locally_lowered", "data.eval_split", "the harness evaluates data.eval_split (test) of the training dataset's "
            "root: convert the validation set into the same DIR as split test (convert-hf --split-column)")


def column(role: str):
    def h(f: Field, ctx: Ctx):
        return "informational_only", None, f"a column name of the source dataset: convert-hf --{role}-column {f.value}"
    return h


# --- sampling


def top_k(f: Field, ctx: Ctx):
    k = 0 if f.value in (-1, 0, None) else int(f.value)
    ctx.set("arm.top_k", k, f.path)
    if k == 0:
        return "semantically_conformant", "arm.top_k", f"{f.value} (off in vLLM) -> 0 (off in TRL)"
    return "exact", "arm.top_k", "same meaning"


# --- schedule


def scheduler(f: Field, ctx: Ctx):
    """constant / cosine, with warmup: HF's `constant` ignores warmup, so constant + warmup -> constant_with_warmup."""
    kind = {"constant": "constant", "cosine": "cosine", "linear": "linear"}.get(str(f.value))
    if kind is None:
        ctx.refuse(f, f"schedule {f.value!r} is not one of the harness's (constant, constant_with_warmup, linear, cosine)",
                   "use constant or cosine")
        return "unsupported", None, "no harness schedule"
    warm = ctx.facts.get("warmup_ratio", 0.0) or 0.0
    if kind == "constant" and warm > 0:
        kind = "constant_with_warmup"
    ctx.set("arm.lr_scheduler_type", kind, f.path)
    note = "same schedule" if kind == f.value else "constant after a warmup = HF's constant_with_warmup (HF's constant ignores warmup)"
    return "exact" if kind == f.value else "semantically_conformant", "arm.lr_scheduler_type", note


def warmup(ctx: Ctx, steps_field: str, ratio_field: str) -> None:
    """The warmup as a ratio of the planned steps (facts["warmup_ratio"]); the source counts warmup steps in rollout
    steps (its scheduler steps once per rollout), the harness's ratio is of optimizer steps: the same fraction."""
    steps, ratio = ctx.get(steps_field), ctx.get(ratio_field) or 0.0
    ctx.facts["warmup_ratio"] = ratio
    if steps not in (None, -1, 0) and ctx.facts.get("rollouts"):
        ctx.facts["warmup_ratio"] = min(0.99, round(int(steps) / ctx.facts["rollouts"], 6))


def warmup_steps(f: Field, ctx: Ctx):
    if f.value in (None, -1, 0):
        return "informational_only", None, "unset: the warmup ratio applies"
    if not ctx.facts.get("rollouts"):
        ctx.refuse(f, "warmup in steps needs the planned steps, which need the dataset's size",
                   "set the warmup ratio instead, or give the dataset (--harness data.path=DIR)")
        return "unsupported", None, "no step count to convert with"
    ratio = ctx.facts["warmup_ratio"]
    ctx.set("arm.warmup_ratio", ratio, f.path)
    longer = " (longer than the whole run here: capped at 0.99)" if int(f.value) >= ctx.facts["rollouts"] else ""
    return ("semantically_conformant", "arm.warmup_ratio",
            f"{f.value} of {ctx.facts['rollouts']} rollout steps -> ratio {ratio:.4g} of the optimizer steps{longer} "
            "(the harness's schedule steps per optimizer step, the source's once per rollout)")


def warmup_ratio(f: Field, ctx: Ctx):
    if ctx.facts.get("warmup_ratio") != (f.value or 0.0):
        return "informational_only", None, "superseded by the warmup in steps, which is set"
    ctx.set("arm.warmup_ratio", float(f.value or 0.0), f.path)
    return "exact", "arm.warmup_ratio", "fraction of the planned steps"


# --- the round and the budget


def round_shape(ctx: Ctx, prompts_per_rollout: int, prompts_per_update: int, by_rollout: str, by_update: str) -> None:
    """prompts per rollout (generation round) and per optimizer step -> arm.prompts_per_step, arm.steps_per_generation."""
    ctx.facts["prompts_per_rollout"] = prompts_per_rollout
    if prompts_per_update <= 0 or prompts_per_rollout % prompts_per_update:
        ctx.problems.append(_problem(by_update, prompts_per_update,
                                     f"must divide the prompts per rollout ({by_rollout} = {prompts_per_rollout}): the source refuses it too",
                                     f"set {by_update} to a divisor of {prompts_per_rollout}"))
        return
    ctx.set("arm.prompts_per_step", prompts_per_update, by_update)
    ctx.set("arm.steps_per_generation", prompts_per_rollout // prompts_per_update, by_rollout)
    ctx.facts["steps_per_rollout"] = prompts_per_rollout // prompts_per_update


def _problem(field: str, value: Any, why: str, fix: str):
    from harness.errors import Problem

    return Problem(field, value, why, fix)


def derive_budget(ctx: Ctx, n_train: int | None) -> str:
    """budget.max_steps and budget.max_completion_tokens from the source's epochs (or step count) and the harness
    dataset's size; returns the note of the field that set them."""
    f = ctx.facts
    per_round = f.get("prompts_per_rollout")
    cycle = f.get("steps_per_rollout", 1) * f.get("ppo_epochs", 1)
    if not per_round:
        return "no round shape: budget left at the harness's"
    rollouts = f.get("rollout_steps")
    how = f"{rollouts} rollout steps (the source's step count)"
    if rollouts is None:
        if n_train is None:
            return (f"{f.get('epochs')} epochs: the dataset's size is needed to count steps; without it the harness's "
                    "budget (conf/budget/default.yaml) applies")
        rollouts = f.get("epochs", 1) * (n_train // per_round)
        how = (f"{f.get('epochs')} epochs x floor({n_train} training rows / {per_round} prompts per rollout) = "
               f"{rollouts} rollout steps (the source drops the last partial batch)")
    if rollouts < 1:
        ctx.problems.append(_problem(f.get("epochs_field", "epochs"), f.get("epochs"),
                                     f"gives no rollout step: {n_train} training rows < {per_round} prompts per rollout",
                                     "use a larger dataset or a smaller rollout batch"))
        return "no rollout step fits the dataset"
    steps = rollouts * cycle
    f["rollouts"] = rollouts
    tokens = rollouts * per_round * f.get("n", 1) * f.get("max_len", 1)
    ctx.set("budget.max_steps", steps, f.get("epochs_field", "epochs"))
    ctx.set("budget.max_completion_tokens", tokens, f.get("epochs_field", "epochs"))
    return (f"{how} x {cycle} optimizer steps each (rollout/update batch x ppo epochs) = budget.max_steps {steps}; the "
            f"source has no token budget, so budget.max_completion_tokens = {tokens} (every completion of those "
            f"rollouts at max length: the step count binds, as in the source; lower it for a budget-bound comparison)")


# --- handlers both tables use as they are


def _max_response(f: Field, ctx: Ctx):
    ctx.set("arm.max_completion_length", int(f.value), f.path)
    ctx.set("arm.mask_truncated_completions", False, f.path)
    return ("exact", "arm.max_completion_length", "sampled tokens per response at most; the source trains on truncated "
            "responses too, so also arm.mask_truncated_completions=false (the harness's default masks them)")


def _every_rollouts(key: str, off: tuple[str, str], extra: str = ""):
    """A frequency the source counts in rollout steps (-1/0/null: off) -> `key` in optimizer steps."""
    def h(f: Field, ctx: Ctx):
        if f.value in (-1, 0, None):
            return off[0], None, off[1]
        cycle = ctx.facts.get("steps_per_rollout", 1) * (ctx.facts.get("ppo_epochs") or 1)
        ctx.set(key, int(f.value) * cycle, f.path)
        return "semantically_conformant", key, f"every {f.value} rollout steps = {f.value} x {cycle} optimizer steps{extra}"
    return h


_save_freq = _every_rollouts("train.save_steps", ("locally_lowered", "no saving: the harness always checkpoints "
                                                  "(train.save_steps) to resume"))
# verl trainer.test_freq / EasyR1 trainer.val_freq: a validation every N rollout steps
_eval_freq = _every_rollouts("train.eval_steps", ("informational_only", "no periodic eval (the harness evaluates "
                                                  "before and after training)"),
                             "; greedy on data.eval_split (the source validates with its rollout's sampling settings "
                             "on its val files)")


def _rollout_batch(f: Field, ctx: Ctx):
    """verl data.train_batch_size / EasyR1 data.rollout_batch_size: prompts per generation round."""
    return ("semantically_conformant", "arm.steps_per_generation",
            f"prompts per rollout = arm.prompts_per_step x arm.steps_per_generation ({f.value} = "
            f"{ctx.overrides.get('arm.prompts_per_step')} x {ctx.overrides.get('arm.steps_per_generation')}): one "
            "generation round, trained on in that many optimizer steps")


def _save_limit(f: Field, ctx: Ctx):
    if f.value in (-1, 0, None):
        return "locally_lowered", None, "no limit: the harness keeps train.keep_last + the final checkpoint"
    ctx.set("train.keep_last", int(f.value), f.path)
    return "exact", "train.keep_last", "resumable checkpoints kept"


MAX_RESPONSE, SAVE_FREQ, SAVE_LIMIT, EVAL_FREQ, ROLLOUT_BATCH = (_max_response, _save_freq, _save_limit, _eval_freq,
                                                                 _rollout_batch)


# --- the recipe's reward function (harness.rewards.conventions: reward._target_ called as its framework calls it)


def free_dict(ctx: Ctx, prefix: str) -> dict:
    """The free-form node `prefix` (kwargs) as a nested dict, rebuilt from its leaf fields."""
    out: dict = {}
    for path, f in ctx.fields.items():
        if path == prefix and isinstance(f.value, dict):
            continue  # the empty node itself
        if not path.startswith(prefix + "."):
            continue
        node = out
        *parents, leaf = path[len(prefix) + 1:].split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = f.value
    return out


def reward_function(f: Field, ctx: Ctx, file: str | None, target: str, convention: str, kwargs: dict,
                    kwargs_field: str, how: str):
    """Sets reward._target_ / reward.convention / reward.kwargs; returns the entry's note (the caller's class).
    `file`: the function's file as the recipe names it (None for a module); `how`: how the source calls it."""
    from harness.rewards.conventions import kwargs_problem

    ctx.set("reward._target_", target, f.path)
    ctx.set("reward.convention", convention, f.path)
    if kwargs:
        why = kwargs_problem(kwargs)
        if why:
            ctx.problems.append(_problem(kwargs_field, kwargs, why, "rename the function's keyword argument (the "
                                         "harness passes its columns under those names)"))
        ctx.set("reward.kwargs", kwargs, kwargs_field)
    if file is None:
        where = "its module is imported from the Python path"
    elif Path(file).expanduser().is_file():
        where = "its file is read relative to the directory the harness runs in (found from here)"
    else:
        where = ("its file is read relative to the directory the harness runs in: not found from here, so run the "
                 "harness from the recipe's checkout or give --harness reward._target_=/abs/path.py:NAME")
    return (f"reward._target_={target} reward.convention={convention}"
            + (f" reward.kwargs={kwargs}" if kwargs else "") + f": the recipe's function itself, {how}; "
            f"{where}. The completions answer the harness's prompt (<answer>...</answer>, not the recipe's template): "
            "a function that parses another format (\\boxed{}, ####) finds no answer in them")

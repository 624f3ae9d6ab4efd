"""Every cross-field rule of a composed config, checked before torch is imported.

Each check appends Problems (errors: the run is refused) or warnings (printed, recorded in the
plan). `run_checks` runs them all so the user sees every problem at once, not the first.
"""

from __future__ import annotations

import dataclasses
import math
import importlib.util
import re
import os
import shutil
from pathlib import Path

from arms import registry
from harness.config.schema import (
    Config,
    Family,
    JsonlData,
    PlacementKind,
    RolloutBackend,
    RolloutConfig,
    RolloutMode,
    Source,
    SyntheticData,
    Tuning,
)
from harness.config.paths import REPO_ROOT
from harness.errors import Problem


class Findings:
    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def error(self, field: str, value, why: str, fix: str) -> None:
        self.problems.append(Problem(field, value, why, fix))

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def run_checks(cfg: Config) -> Findings:
    out = Findings()
    check_bounds(cfg, "", out)
    check_model(cfg, out)
    check_arm(cfg, out)
    check_data(cfg, out)
    check_reward(cfg, out)
    check_warm_start(cfg, out)
    check_rollout_and_placement(cfg, out)
    check_objective(cfg, out)
    check_push(cfg, out)
    return out


def check_objective(cfg: Config, out: Findings) -> None:
    import difflib

    from harness.metrics import METRIC_TITLES

    if cfg.objective not in METRIC_TITLES:
        best = difflib.get_close_matches(cfg.objective, list(METRIC_TITLES), n=1)
        out.error("objective", cfg.objective, "is not a metric of a finished run (harness.report)",
                  f"did you mean objective={best[0]}?" if best else f"use one of: {', '.join(METRIC_TITLES)}")


# --- generic: the ge/gt/le/lt bounds declared on schema fields


def check_bounds(obj, prefix: str, out: Findings) -> None:
    ops = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"),
           "le": (lambda v, b: v <= b, "<="), "lt": (lambda v, b: v < b, "<")}
    for fld in dataclasses.fields(obj):
        value = getattr(obj, fld.name)
        path = prefix + fld.name
        if dataclasses.is_dataclass(value):
            check_bounds(value, path + ".", out)
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):  # nan passes no bound check and inf passes a lower one
            out.error(path, value, f"must be a finite number ({fld.metadata.get('help', '')})",
                      f"set {path} to a finite value")
            continue
        for key, (ok, sym) in ops.items():
            if key in fld.metadata and not ok(value, fld.metadata[key]):
                bound = fld.metadata[key]
                out.error(path, value, f"must be {sym} {bound} ({fld.metadata.get('help', '')})",
                          f"set {path} to a value {sym} {bound}")


# --- model


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def find_cached_snapshot(hub_id: str) -> Path | None:
    """The snapshot of `hub_id` in the local HF cache that refs/main names (else the newest), without importing
    huggingface_hub."""
    repo = hf_cache_dir() / ("models--" + hub_id.replace("/", "--"))
    snaps = repo / "snapshots"
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (snaps / main / "config.json").exists():
        return snaps / main
    found = [p for p in snaps.glob("*") if (p / "config.json").exists()] if snaps.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def checkpoint_path(m) -> str | None:
    """Where a pretrained model's files are: model.path, else model.hub_id's snapshot in the local HF cache."""
    if m.path:
        return m.path
    snap = find_cached_snapshot(m.hub_id) if m.hub_id else None
    return str(snap) if snap else None


def check_checkpoint(cfg: Config, out: Findings) -> None:
    """A pretrained model: the checkpoint exists, holds what the harness loads (config, weights, tokenizer, image
    processor, chat template) and agrees with model.family / is_vlm / patch_size (harness.models.pretrained)."""
    from harness.models.pretrained import checkpoint_problems

    m = cfg.model
    if not m.path and not m.hub_id:
        out.error("model.path", None, "source=pretrained needs a checkpoint", "set model.path or model.hub_id")
        return
    path = checkpoint_path(m)
    if path is None:
        out.error("model.hub_id", m.hub_id,
                  f"is not in the local Hugging Face cache ({hf_cache_dir()}); nothing is downloaded at run time",
                  "set model.path=/path/to/checkpoint, or put the checkpoint in the HF cache (HF_HOME)")
        return
    info, problems = checkpoint_problems(path, family=m.family.value, is_vlm=m.is_vlm, patch_size=m.patch_size)
    lo, hi = m.min_pixels or info.min_pixels, m.max_pixels or info.max_pixels
    if lo and hi and lo > hi and not (m.min_pixels and m.max_pixels):  # both set: check_model says so
        which, value, other = (("model.max_pixels", m.max_pixels, f"the checkpoint's min_pixels ({lo})")
                               if m.max_pixels else ("model.min_pixels", m.min_pixels,
                                                     f"the checkpoint's max_pixels ({hi})"))
        out.error(which, value, f"conflicts with {other}: the image processor would enlarge small images past it",
                  "set model.min_pixels and model.max_pixels together (min <= max)")
    for field_, why, fix in problems:
        value = m.path if field_ == "model.path" else getattr(m, field_.split(".", 1)[1])
        if field_ == "model.path" and not m.path:
            field_, value, why = "model.hub_id", m.hub_id, f"its cached snapshot {path} {why}"
        out.error(field_, getattr(value, "value", value), why, fix)


def check_model(cfg: Config, out: Findings) -> None:
    m = cfg.model
    if m.source is Source.tiny:
        if m.tiny is None:
            out.error("model.tiny", None, "source=tiny builds the model from these parameters",
                      "use model=tiny_vlm or model=tiny_lm, or set model.tiny")
        else:
            t = m.tiny
            if t.num_heads % t.num_kv_heads:
                out.error("model.tiny.num_kv_heads", t.num_kv_heads,
                          f"must divide model.tiny.num_heads ({t.num_heads}) for grouped-query attention",
                          f"use a divisor of {t.num_heads}")
        if m.tuning is Tuning.lora:
            out.warn("model.tuning=lora on a tiny random model: measured, LoRA on a random base keeps the sampled "
                     "distribution near flat and GRPO gets no reward signal; use model.tuning=full")
    else:
        check_checkpoint(cfg, out)
    if m.min_pixels and m.max_pixels and m.min_pixels > m.max_pixels:
        out.error("model.min_pixels", m.min_pixels, f"is above model.max_pixels ({m.max_pixels})",
                  "lower model.min_pixels or raise model.max_pixels")
    expected_patch = 16 if m.family is Family.qwen3_vl else 14
    if m.is_vlm and m.patch_size != expected_patch:
        out.warn(f"model.patch_size={m.patch_size} but {m.family.value} uses {expected_patch}-pixel patches")
    if m.family is Family.qwen2 and m.is_vlm:
        out.error("model.is_vlm", True, "family qwen2 is text-only", "set model.is_vlm=false or a VL family")


# --- arm and budget


def check_arm(cfg: Config, out: Findings) -> None:
    """The registry knows the arm; the arm's config checks its own rules (arms/<name>/config.py)."""
    arms = registry()
    if cfg.arm.name not in arms:
        out.error("arm.name", cfg.arm.name, f"is not a registered arm ({', '.join(arms)})",
                  "use one of the registered arms, or add the package arms/<name>/ (its ARM entry and config) "
                  "and conf/arm/<name>.yaml")
        return
    cfg.arm.check(cfg, out)


# --- data


def check_data(cfg: Config, out: Findings) -> None:
    d = cfg.data
    if d.eval_split == d.train_split:
        out.error("data.eval_split", d.eval_split, "equals data.train_split: eval must be held out",
                  "use data.eval_split=test or val")
    if isinstance(d, SyntheticData):
        if d.val_fraction + d.test_fraction >= 1.0:
            out.error("data.test_fraction", d.test_fraction,
                      f"with data.val_fraction ({d.val_fraction}) leaves no base item for training",
                      "keep val_fraction + test_fraction below 1")
        if d.image_size is not None and cfg.model.is_vlm and d.image_size % cfg.model.patch_size:
            out.error("data.image_size", d.image_size, f"is not a multiple of model.patch_size ({cfg.model.patch_size})",
                      f"use {4 * cfg.model.patch_size} (4 image tokens after the 2x2 merge) or null")
        if not cfg.model.is_vlm:
            out.warn(f"model {cfg.model.name} is text-only: the synthetic questions are about images it cannot see")
    if isinstance(d, JsonlData) and not d.path:
        out.error("data.path", None, "data=jsonl needs the dataset root", "add data.path=DIR (a dataset in the harness schema)")
    elif isinstance(d, JsonlData) and not Path(d.path).is_dir():
        out.error("data.path", d.path, "is not a directory", "point data.path at a dataset root (see harness.data validate)")
    elif isinstance(d, JsonlData):
        check_jsonl_splits(d, out)


def check_jsonl_splits(d: JsonlData, out: Findings) -> None:
    """A dataset of your own has a manifest listing the training and the eval split (read from manifest.json only;
    `python -m harness.data validate` checks the files against it when the run starts)."""
    from harness.data.spec import manifest_splits

    splits = manifest_splits(d.path)
    if splits is None:
        out.error("data.path", d.path, "has no readable manifest.json (a dataset is complete only once it has one)",
                  f"run python -m harness.data manifest {d.path} (or build it with python -m harness.data init)")
        return
    for key, split in (("data.train_split", d.train_split), ("data.eval_split", d.eval_split)):
        if not splits.get(split):
            have = ", ".join(f"{s} ({n} rows)" for s, n in sorted(splits.items())) or "none"
            out.error(key, split, f"the dataset has no rows in split {split!r} (its splits: {have})",
                      f"add records/{split}.jsonl and re-run python -m harness.data manifest {d.path}, or set {key} "
                      "to one of its splits")


# --- reward


def check_reward(cfg: Config, out: Findings) -> None:
    """reward._target_ and reward.components name functions that exist, with a signature their convention can
    call (read from the source: nothing of the user's is imported at plan time)."""
    import json

    from harness.identity import to_jsonable
    from harness.rewards.functions import reward_problems

    reward = to_jsonable(cfg.reward)
    for p in reward_problems(reward):
        out.problems.append(p)
    for name, value in [("reward.kwargs", reward.get("kwargs"))] + [
            (f"reward.components.{k}.kwargs", v.get("kwargs")) for k, v in (reward.get("components") or {}).items()]:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            out.error(name, value, f"is not plain JSON ({exc})", "use numbers, strings, lists and mappings")


def check_warm_start(cfg: Config, out: Findings) -> None:
    """The warm start's format check reads its final eval: without one it cannot check, and the plan says so."""
    b, rl = cfg.budget, registry().get(cfg.arm.name)
    if rl is None or not rl.kind.samples or getattr(cfg.arm, "init", None) != "sft":
        return
    if b.sft_warm_start_min_format > 0 and not cfg.train.eval_after:
        out.warn(f"budget.sft_warm_start_min_format={b.sft_warm_start_min_format} is not checked: it reads the SFT warm "
                 "start's final eval, which train.eval_after=false turns off (RL starts whether or not the warm start "
                 "writes the answer format)")


# --- rollout and placement


def cuda_visible() -> bool:
    """Torch-free: is there an NVIDIA device this process may use?"""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


REPO = REPO_ROOT


def check_sharded_placement(cfg: Config, out: Findings) -> None:
    """ddp / fsdp / deepspeed: the Accelerate file exists and the GPU-only placements see a GPU (whether an
    arm's forwards suit sharded parameters is the arm's own check)."""
    p = cfg.placement
    if p.accelerate_config and not (REPO / p.accelerate_config).is_file():
        out.error("placement.accelerate_config", p.accelerate_config, "no such file in the repository",
                  "use a placement option (conf/placement/*.yaml) or point at an Accelerate config under accelerate/")
    if p.kind is PlacementKind.deepspeed:
        if p.zero_stage not in (2, 3):
            out.error("placement.zero_stage", p.zero_stage, "DeepSpeed runs ZeRO stage 2 or 3 here",
                      "use placement=deepspeed (ZeRO-2) or placement=deepspeed_zero3")
        if importlib.util.find_spec("deepspeed") is None:
            out.error("placement", p.name, "deepspeed is not installed", "pip install deepspeed, or use placement=ddp/fsdp")
    elif p.zero_stage is not None:
        out.error("placement.zero_stage", p.zero_stage, f"applies to DeepSpeed only (placement={p.name})",
                  "unset it, or use placement=deepspeed / deepspeed_zero3")
    if p.kind in (PlacementKind.fsdp, PlacementKind.deepspeed) and not cuda_visible():
        # measured: on CPU the Trainer makes MULTI_CPU ranks and ignores the FSDP plugin (plain data parallel)
        out.error("placement", p.name, f"{p.kind.value} needs CUDA devices and none is visible (on CPU the Trainer "
                  "would silently run plain data parallel instead)",
                  "use placement=ddp on CPU (gloo), or run on a GPU node")


def check_correction_caps(r: RolloutConfig, out: Findings) -> None:
    """TRL's importance-sampling caps (vLLM's correction, off-policy rounds'): TRL's GRPOConfig refuses clip_min >=
    clip_max too, but only once the model is loaded (on a GPU node)."""
    if r.importance_sampling_clip_min >= r.importance_sampling_clip_max:
        out.error("rollout.importance_sampling_clip_min", r.importance_sampling_clip_min,
                  f"must be below rollout.importance_sampling_clip_max ({r.importance_sampling_clip_max})",
                  "lower clip_min (0.0 masks nothing from below) or raise clip_max")


#: Why an arm cannot train on rounds sampled ahead of it (rollout=async); grpo can.
NOT_OFF_POLICY = {
    "papo": "its masked-image KL and entropy terms score the sampled completions under the current policy with no "
            "importance weight, so rounds sampled by older weights would bias them",
    "evi_po": "its evidence and direction terms re-score the sampled completions under the current policy with no "
              "importance weight, so rounds sampled by older weights would bias them",
    "opd": "TRL's distillation trainer samples inside its own loss and has no importance-sampling correction",
    "sft": "it samples nothing",
}


def check_offpolicy(cfg: Config, out: Findings) -> None:
    """rollout=async (harness.offpolicy): what the sampler process and the decoupled correction can honour."""
    r = cfg.rollout
    if r.mode is not RolloutMode["async"]:
        for key in ("lag", "max_policy_age"):
            default = next(f.default for f in dataclasses.fields(RolloutConfig) if f.name == key)
            if getattr(r, key) != default:
                out.error(f"rollout.{key}", getattr(r, key), "applies to off-policy rounds only (rollout.mode=sync)",
                          f"use rollout=async, or drop rollout.{key}")
        return
    if cfg.arm.name in NOT_OFF_POLICY:
        out.error("rollout", r.name, f"arm={cfg.arm.name} cannot train on rounds sampled ahead of it: "
                  f"{NOT_OFF_POLICY[cfg.arm.name]}", f"use rollout=hf with arm={cfg.arm.name}, or arm=grpo")
    if r.backend is not RolloutBackend.hf:
        out.error("rollout.backend", r.backend.value, "the off-policy sampler generates with transformers (vLLM's "
                  "asynchronous path is TRL's AsyncGRPOTrainer, which this harness does not map: docs/off-policy.md)",
                  "use rollout=async (backend=hf)")
    if cfg.placement.world_size != 1:
        out.error("placement", cfg.placement.name, f"the off-policy sampler feeds one trainer rank, the job has "
                  f"{cfg.placement.world_size}", "use placement=single with rollout=async")
    if r.lag is not None and r.lag > r.max_policy_age:
        out.error("rollout.lag", r.lag, f"from round {r.max_policy_age + 1} on every round would be older than "
                  f"rollout.max_policy_age={r.max_policy_age} and dropped", f"lower rollout.lag to at most "
                  f"{r.max_policy_age}, or raise rollout.max_policy_age")
    if not r.importance_sampling_correction:
        out.error("rollout.importance_sampling_correction", False, "off-policy rounds are trained through the "
                  "decoupled correction (TRL's importance-sampling ratio between the sampling and the training "
                  "weights); without it the update is biased by the lag", "set it true (the default)")
    else:
        check_correction_caps(r, out)


def check_rollout_and_placement(cfg: Config, out: Findings) -> None:
    r, p = cfg.rollout, cfg.placement
    if r.backend is RolloutBackend.vllm:
        if r.vllm_mode is None:
            out.error("rollout.vllm_mode", None, "backend=vllm needs a mode", "use rollout=vllm_colocate or rollout=vllm_server")
        if importlib.util.find_spec("vllm") is None:
            out.error("rollout", r.name, "vllm is not installed in this environment",
                      "install vllm (GPU nodes only), or use rollout=hf")
        if not cuda_visible():
            out.error("rollout", r.name, "vLLM rollouts need a CUDA device and none is visible",
                      "run on a GPU node, or use rollout=hf")
        if cfg.arm.name in registry() and not registry()[cfg.arm.name].kind.samples:
            out.error("rollout", r.name, f"arm={cfg.arm.name} samples nothing", f"use rollout=hf with arm={cfg.arm.name}")
        if r.importance_sampling_correction:
            check_correction_caps(r, out)
    elif r.vllm_mode is not None:
        out.error("rollout.vllm_mode", r.vllm_mode.value, "is set but rollout.backend=hf", "unset it or use a vllm rollout")
    check_offpolicy(cfg, out)
    if p.kind is PlacementKind.single and p.num_processes != 1:
        out.error("placement.num_processes", p.num_processes, "placement=single runs one process",
                  "use placement=ddp (or fsdp/deepspeed) for several processes")
    check_machines(cfg, out)
    if p.device not in ("auto", "cpu", "cuda"):
        out.error("placement.device", p.device, "must be auto, cpu or cuda", "use placement.device=auto")
    elif p.device == "cuda" and not cuda_visible():
        out.error("placement.device", p.device, "no CUDA device is visible", "use placement.device=auto or cpu")
    elif cfg.model.dtype.value != "float32" and (p.device == "cpu" or (p.device == "auto" and not cuda_visible())):
        out.warn(f"model.dtype={cfg.model.dtype.value} on the CPU: the weights train in {cfg.model.dtype.value} without "
                 "autocast (slow, and the optimizer's updates round away); for a CPU check use model.dtype=float32")
    check_sharded_placement(cfg, out)
    if cfg.train.eval_steps and (p.kind is PlacementKind.fsdp or p.zero_stage == 3):
        out.error("train.eval_steps", cfg.train.eval_steps, f"a periodic eval generates on rank 0 alone, and "
                  f"placement={p.name} shards the weights over the ranks", "use placement=ddp, or train.eval_steps=0 "
                  "(then `python -m harness.eval RUN_DIR policy=checkpoint-N` scores a kept checkpoint afterwards)")
    if cfg.logger.wandb_mode not in ("online", "offline", "disabled"):
        out.error("logger.wandb_mode", cfg.logger.wandb_mode, "must be online, offline or disabled",
                  "use logger.wandb_mode=offline (no network here)")
    if cfg.logger.trackio and importlib.util.find_spec("trackio") is None:
        out.error("logger.trackio", True, "trackio is not installed", "pip install -c constraints.txt -e '.[track]' "
                  "(scripts/ensure_venv.sh installs it), or drop trackio from logger=[...]")
    project = cfg.logger.trackio_project
    if cfg.logger.trackio and (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", project) or project.startswith("registry-")):
        out.error("logger.trackio_project", project, "is not a trackio project name (letters, digits, '.', '_', '-'; "
                  "'registry-' is reserved: the project is a file name)", "use e.g. logger.trackio_project=harness")


def check_machines(cfg: Config, out: Findings) -> None:
    """placement.num_machines > 1: a distributed placement, one launch per machine (not the smoke self-test's)."""
    p = cfg.placement
    if p.num_machines == 1:
        return
    if p.kind is PlacementKind.single:
        out.error("placement.num_machines", p.num_machines, "placement=single runs one process on one machine",
                  f"use placement=ddp (placement.num_processes ranks on each of the {p.num_machines} machines)")
    if cfg.run_mode.value == "smoke":
        out.error("run_mode", "smoke", f"the smoke self-test relaunches its run on this machine, and "
                  f"placement.num_machines={p.num_machines} spans several",
                  "run the smoke test with placement.num_machines=1 (the same world size: num_processes x num_machines)")


# --- the push to the Hub


def check_push(cfg: Config, out: Findings) -> None:
    """train.push_to_hub needs a repo, a token and a reachable Hub, known now rather than after training."""
    t = cfg.train
    if not t.push_to_hub:
        return
    if not t.hub_model_id:
        out.error("train.hub_model_id", None, "train.push_to_hub=true pushes final_policy/ to this Hub repo",
                  "set train.hub_model_id=<user or org>/<name>, or train.push_to_hub=false")
    from harness.hub import push_problem

    problem = push_problem()
    if problem:
        why, fix = problem
        out.error("train.push_to_hub", True, why, f"{fix}, or set train.push_to_hub=false (final_policy/ is kept in "
                  "the run dir either way; push it later with huggingface_hub's upload_folder)")

"""Typed configuration: one dataclass schema per config group, stored in Hydra's ConfigStore by
harness.config.store.

conf/<group>/<option>.yaml extends the schema stored at /schema/<group>/<schema> (see
harness.config.store), so a misspelled key or a value of the wrong type fails at compose time, before
anything is planned. Every field carries `help` (one line: meaning, units, range, paper) and,
where it matters, bounds (`ge`, `gt`, `le`, `lt`) that plan checks, and `semantic=False` for
fields that do not change what is trained (logging, paths, worker counts, placement): those
are left out of `semantic_sha256`, so resuming with another logger is accepted and resuming
with another learning rate is refused.

Torch-free by design: this module is imported by compose, plan, verify and report. An arm's schema is
its own config dataclass (arms/<name>/config.py), found through the arm registry.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from arms import registry
from harness.config.fields import (  # noqa: F401  (the vocabularies are read from here too)
    ArmConfig,
    DType,
    Family,
    ISCorrectionMode,
    Mode,
    RolloutMode,
    PlacementKind,
    Resume,
    RewardConvention,
    TEACHER,
    RolloutBackend,
    RunMode,
    Scheduler,
    Source,
    Tuning,
    VllmMode,
    f,
)


# --- model


@dataclass
class TinySpec:
    """Build parameters of a tiny random model (model.source=tiny); they key its on-disk cache."""

    hidden_size: int = f(128, "text hidden size (units)", ge=16)
    num_layers: int = f(4, "text decoder layers", ge=1)
    num_heads: int = f(4, "attention heads", ge=1)
    num_kv_heads: int = f(2, "key/value heads (GQA); must divide num_heads", ge=1)
    head_dim: int = f(32, "per-head dimension; mrope sections sum to head_dim/2", ge=8)
    intermediate_size: int = f(256, "MLP width", ge=16)
    vision_width: int = f(64, "vision tower width (VLMs only)", ge=16)
    vision_depth: int = f(2, "vision tower blocks (VLMs only)", ge=1)
    vocab_size: int = f(512, "target BPE vocabulary size of the locally trained tokenizer", ge=300)
    init_seed: int = f(0, "seed of the random weights (independent of the run seed)", ge=0)


@dataclass
class ModelConfig:
    name: str = f(MISSING, "option name (conf/model/<name>.yaml); part of run_name")
    family: Family = f(Family.qwen2_vl, "architecture: qwen2_vl | qwen2_5_vl | qwen3_vl | qwen2 (text-only)")
    source: Source = f(Source.tiny, "tiny: built locally with seeded random weights; pretrained: a real checkpoint")
    hub_id: Optional[str] = f(None, "Hugging Face repo id looked up in the local HF cache (never downloaded)")
    path: Optional[str] = f(None, "local checkpoint directory; wins over hub_id", semantic=False)
    is_vlm: bool = f(True, "the model takes images (false for tiny_lm and text-only checkpoints)")
    patch_size: int = f(14, "vision patch size in pixels: 14 for Qwen2/2.5-VL, 16 for Qwen3-VL", ge=1)
    min_pixels: Optional[int] = f(
        None, "a resized image has at least this many pixels (the Qwen-VL image processor's min_pixels; it decides "
        "how many image tokens an image becomes); null = the checkpoint's own", ge=1)
    max_pixels: Optional[int] = f(
        None, "a resized image has at most this many pixels (the Qwen-VL image processor's max_pixels); null = the "
        "checkpoint's own", ge=1)
    tuning: Tuning = f(Tuning.full, "full fine-tuning (tiny random models) or lora (real checkpoints)")
    lora_r: int = f(16, "LoRA rank (tuning=lora)", ge=1)
    lora_alpha: int = f(32, "LoRA alpha; the update is scaled by alpha/r", ge=1)
    lora_dropout: float = f(0.0, "LoRA dropout probability", ge=0.0, lt=1.0)
    lora_target_modules: list[str] = f(
        help="module names LoRA adapts", factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    dtype: DType = f(DType.float32, "weight dtype; float32 on CPU")
    attn_implementation: str = f("sdpa", "transformers attention backend (eager | sdpa | flash_attention_2)")
    gradient_checkpointing: bool = f(
        True, "recompute activations in the backward pass (less memory, more time: a tiny-model step 0.264 -> 0.295 s); the same gradients "
        "either way. TRL's default; off in the tiny models' options", semantic=False)
    image_cache_mb: int = f(
        16, "LRU of preprocessed images per image digest (rollouts, re-scoring, eval; 16 MB holds ~200 "
        "56x56 images, many steps of the tiny job); the same tensors as "
        "without it; 0 = off", semantic=False, ge=0)
    dedupe_rows: bool = f(
        True, "the processor handles each distinct prompt row (text and image pixels) of a call once and gathers the "
        "rows back (TRL repeats a prompt and its image G times); the same tensors bit for bit; the tiny models' "
        "processor", semantic=False)
    share_vision_features: bool = f(
        False, "outside autograd (generation's prefill, eval, no-grad re-scoring) encode each distinct image of a batch "
        "once; the same features up to float rounding only (a CPU matmul's rows can depend on the batch: evi_po's "
        "loss moved by 2e-7 in two steps), so off; Qwen2-VL / Qwen2.5-VL", semantic=False)
    rope_cache: bool = f(
        True, "M-RoPE positions computed once per row layout (LRU); the same integers; Qwen2-VL", semantic=False)
    cache_dir: str = f("${output_root}/cache/models", "where built tiny models are cached", semantic=False)
    tiny: Optional[TinySpec] = f(None, "build parameters when source=tiny")


# --- data, rewards


@dataclass
class DataConfig:
    name: str = f(MISSING, "option name (conf/data/<name>.yaml); part of run_name")
    path: Optional[str] = f(None, "dataset root (JSONL records + images + manifest); synthetic: null = cache", semantic=False)
    cache_dir: str = f("${output_root}/cache/data", "where generated synthetic datasets are cached", semantic=False)
    train_split: str = f("train", "split the arms train on")
    eval_split: str = f("test", "held-out split for eval before/after training")
    eval_max_items: Optional[int] = f(None, "evaluate at most this many views (null = the whole split)", ge=1)
    num_workers: int = f(0, "dataloader / validation worker processes", semantic=False, ge=0)


@dataclass
class SyntheticData(DataConfig):
    n_base: int = f(1200, "base items; each yields four views (FULL, CONTROL, MISSING, SUBSTITUTE)", ge=4)
    data_seed: int = f(0, "generator seed; independent of the run seed so every arm and seed sees the same data", ge=0)
    image_size: Optional[int] = f(None, "image side in pixels; null = 4 x model.patch_size (56 or 64)", ge=14)
    val_fraction: float = f(0.1, "fraction of base items in split val", ge=0.0, lt=1.0)
    test_fraction: float = f(0.15, "fraction of base items in split test", gt=0.0, lt=1.0)


@dataclass
class JsonlData(DataConfig):
    path: Optional[str] = f(None, "required: dataset root in the schema of docs/data.md (see harness.data validate)", semantic=False)
    # semantic=False: it decides whether validation refuses, not what is trained (the data's content digest, in the
    # run name, already tells a leaking dataset apart); so existing runs keep their semantic hash and run name.
    allow_split_overlap: bool = f(
        False, "accept held-out views (splits other than data.train_split, relation not MISSING) whose image is a byte "
        "copy of a training image: validation then warns with the count instead of refusing the dataset (eval would "
        "score inputs the model trained on)", semantic=False)


#: The built-in reward (relation-aware exact match over the <answer> schema): the default reward._target_.
BUILTIN_REWARD = "harness.rewards:answer_reward"


@dataclass
class RewardConfig:
    _target_: str = f(
        BUILTIN_REWARD, "the reward function: 'path/to/file.py:name' (relative to the directory you run in) or "
        "'package.module:name', with TRL's signature f(prompts, completions, completion_ids, **columns) -> list[float] "
        "(columns: target, answer_type, relation, question, key, choices, meta, truncated, data_source, trainer_state); "
        "the default is the built-in relation-aware exact match (reward.correct / format_weight / invalid_penalty)")
    convention: RewardConvention = f(
        RewardConvention.trl, "how _target_ is called: trl (TRL's reward_funcs), verl (verl's custom_reward_function: "
        "compute_score(data_source, solution_str, ground_truth, extra_info) per completion), easyr1 (EasyR1's "
        "reward_function)")
    kwargs: dict[str, Any] = f(help="keyword arguments passed to _target_ on every call (e.g. a tolerance)", factory=dict)
    components: dict[str, Any] = f(
        help="named shaping terms added to the reward: NAME -> {_target_, weight (1.0), convention (trl), kwargs ({})}, "
        "total = main + sum(weight x term); e.g. '+reward.components.short={_target_: file.py:fn, weight: 0.1}'",
        factory=dict)
    success_threshold: float = f(
        1.0, "a custom reward._target_: a completion counts as correct (eval accuracy, the trace's `correct`) when "
        "its main reward is at least this; the built-in reward uses its relation-aware match")
    correct: float = f(1.0, "built-in reward: reward for a parsed answer equal to the view's target (relation-aware)")
    format_weight: float = f(0.0, "built-in reward: added for a well-formed <answer>...</answer> completion, right or wrong", ge=0.0)
    invalid_penalty: float = f(0.5, "built-in reward: subtracted for an unparsable or truncated completion", ge=0.0)


# --- rollout, placement, logging, budget, training schedule


@dataclass
class RolloutConfig:
    name: str = f(MISSING, "option name (conf/rollout/<name>.yaml)")
    backend: RolloutBackend = f(RolloutBackend.hf, "hf: transformers generate; vllm: TRL's vLLM integration")
    vllm_mode: Optional[VllmMode] = f(None, "colocate (same GPUs) or server (trl vllm-serve)")
    gpu_memory_utilization: float = f(0.3, "vLLM share of GPU memory (colocate)", semantic=False, gt=0.0, le=1.0)
    tensor_parallel_size: int = f(1, "vLLM tensor parallel size", semantic=False, ge=1)
    enable_sleep_mode: bool = f(False, "vLLM sleep mode between generations (colocate)", semantic=False)
    server_host: str = f("127.0.0.1", "vllm-serve host (server mode)", semantic=False)
    server_port: int = f(8000, "vllm-serve port (server mode)", semantic=False, ge=1, le=65535)
    structured_output: bool = f(True, "constrain sampling to the answer-schema regex (vLLM only)")
    importance_sampling_correction: bool = f(True, "correct the sampling/training mismatch (vLLM; always on with rollout=async)")
    importance_sampling_mode: ISCorrectionMode = f(ISCorrectionMode.sequence_mask, "set explicitly: TRL's docstring and code disagree on the default")
    importance_sampling_clip_max: float = f(3.0, "upper cap of the IS ratio", gt=0.0)
    importance_sampling_clip_min: float = f(0.0, "lower cap of the IS ratio (mask modes)", ge=0.0)
    mode: RolloutMode = f(RolloutMode.sync, "sync: the trainer samples each round from the weights it trains (on-policy); "
                          "async: a sampler process samples rounds ahead into a buffer in the run dir, corrected by "
                          "TRL's importance-sampling ratio (rollout=async, docs/off-policy.md)")
    lag: Optional[int] = f(1, "rollout=async: the round trained at round r is sampled by the weights at the start of "
                           "round max(0, r - lag) (rounds = optimizer steps when arm.steps_per_generation x "
                           "num_iterations = 1); deterministic and resumable bit for bit. null: free running, each round "
                           "sampled by the newest version, never older than rollout.max_policy_age", ge=0)
    sampler_threads: Optional[int] = f(None, "rollout=async on CPU: torch threads of the sampler process; null: half of "
                                       "the trainer's, the trainer keeps the rest (the two share the cores)",
                                       semantic=False, ge=1)
    max_policy_age: int = f(4, "rollout=async: the cap on a trained round's policy age (rounds between the weights that "
                            "sampled it and the weights that train it); rollout.lag must not exceed it", ge=1)


@dataclass
class PlacementConfig:
    name: str = f(MISSING, "option name (conf/placement/<name>.yaml)", semantic=False)
    kind: PlacementKind = f(PlacementKind.single, "single | ddp | fsdp | deepspeed", semantic=False)
    num_processes: int = f(1, "processes (ranks) per machine: the job's world size is num_machines x num_processes", semantic=False, ge=1)
    num_machines: int = f(
        1, "machines (nodes) the job spans, each running placement.num_processes ranks; hydra/launcher=slurm submits one "
        "job over that many nodes (srun starts the driver on each), elsewhere run the same command on every machine with "
        "NODE_RANK, MASTER_ADDR and MASTER_PORT set (docs/scale-out.md). 2 machines x 1 process trains what 1 x 2 does",
        semantic=False, ge=1)
    collective_timeout_s: int = f(
        1800, "seconds a rank waits in a collective (all-reduce, barrier, broadcast) before it stops with an error: "
        "what bounds the wait when another rank's process or node died (torch.distributed's timeout, "
        "TrainingArguments.ddp_timeout; a gloo peer that died ends the collective at once)", semantic=False, ge=10)
    cpus_per_process: Optional[int] = f(
        None, "hydra/launcher=slurm: CPUs asked per rank (the job's cpus_per_task = num_processes x this); null = 8 "
        "on a GPU placement, 1 with placement.device=cpu or hydra/launcher=slurm_cpu", semantic=False, ge=1)
    mem_gb_per_process: Optional[int] = f(
        None, "hydra/launcher=slurm: memory asked per rank in GB (the job's mem_gb = num_processes x this); null = 32 "
        "on a GPU placement, 4 with placement.device=cpu or hydra/launcher=slurm_cpu", semantic=False, ge=1)
    accelerate_config: Optional[str] = f(None, "Accelerate config file (accelerate/<placement>.yaml in the repo)", semantic=False)
    zero_stage: Optional[int] = f(None, "DeepSpeed ZeRO stage, 2 or 3 (placement=deepspeed / deepspeed_zero3 only)", semantic=False)
    device: str = f("auto", "auto (cuda when present, else cpu) | cpu | cuda", semantic=False)

    @property
    def world_size(self) -> int:
        """The ranks of the job: num_machines x num_processes (what the budget, the round and the ledgers split over)."""
        return self.num_machines * self.num_processes


@dataclass
class LoggerConfig:
    name: str = f(MISSING, "option name (conf/logger/<name>.yaml)", semantic=False)
    tensorboard: bool = f(False, "also write tensorboard events under the run dir", semantic=False)
    wandb: bool = f(False, "also log to Weights & Biases", semantic=False)
    wandb_mode: str = f("offline", "online | offline | disabled", semantic=False)
    wandb_project: str = f("harness", "wandb project", semantic=False)
    trackio: bool = f(False, "also log to trackio (local-first: <output_root>/trackio unless TRACKIO_DIR is set)", semantic=False)
    trackio_project: str = f("harness", "trackio project (one database per project: the runs of a sweep side by side)", semantic=False)
    console: bool = f(True, "one concise line per logged step on stderr", semantic=False)


@dataclass
class BudgetConfig:
    name: str = f("default", "option name (conf/budget/<name>.yaml)")
    max_completion_tokens: int = f(MISSING, "sampled completion tokens a run may spend (all ranks), never exceeded; what stops an RL arm: the run ends after the last step whose successor could exceed it", ge=1)
    max_loss_tokens: int = f(MISSING, "SFT: loss-bearing tokens a run may train on (longest prefix of one epoch that fits)", ge=1)
    max_steps: int = f(MISSING, "optimizer steps at most: a safety cap above the token budget (set it so the budget binds, or a comparison is bound by steps)", ge=1, derived=(TEACHER,))
    sft_warm_start_steps: int = f(150, "RL arms with arm.init=sft: optimizer steps of the SFT warm start, over as many passes of the training split as they need (each pass in a fresh seeded order)", ge=1)
    sft_warm_start_epochs: Optional[int] = f(None, "RL arms with arm.init=sft: size the warm start in passes over the training split instead (its steps = ceil(epochs x train rows / the SFT batch size), shown by mode=plan); null = budget.sft_warm_start_steps", ge=1)
    sft_warm_start_min_format: float = f(0.5, "RL arms with arm.init=sft: the share of eval views whose greedy answer the warm start must write well-formed (<answer>...</answer>) before RL starts; below it the run stops with the fix (an RL run from a policy that never writes the format gets one reward for every completion and makes no update); 0 = do not check", semantic=False, ge=0.0, le=1.0)
    sft_warm_start_max_length: Optional[int] = f(None, "RL arms with arm.init=sft: the warm start's arm.max_length (tokens per SFT row: prompt with its image tokens + answer); null = conf/arm/sft.yaml's. Raise it for large images (harness's prompt preflight says how far)", ge=8)
    stop_after_steps: Optional[int] = f(None, "pause: stop after this optimizer step with a checkpoint (status paused, exit 0); the same command without it continues to the planned end", semantic=False, ge=1, derived=())


@dataclass
class TrainConfig:
    logging_steps: int = f(1, "log metrics every N optimizer steps", semantic=False, ge=1)
    save_steps: int = f(20, "checkpoint every N optimizer steps", semantic=False, ge=1, derived=(TEACHER,))
    keep_last: int = f(2, "resumable checkpoints kept besides the permanent final one", semantic=False, ge=1)
    eval_before: bool = f(True, "RL arms: evaluate the init policy before training")
    eval_after: bool = f(True, "evaluate the final policy after training")
    eval_steps: int = f(0, "also evaluate greedily every N optimizer steps, as the final eval does (same split and views): the curve of accuracy vs sampled tokens; the checkpoint of each such step is kept (not rotated); 0 = off", semantic=False, ge=0)
    eval_batch_size: int = f(64, "prompts per greedy eval batch", semantic=False, ge=1)
    eval_max_new_tokens: int = f(16, "greedy eval: tokens generated per answer at most", ge=1)
    max_nonfinite_steps: int = f(3, "optimizer steps whose gradient is not finite (NaN/inf loss or gradient) that are skipped (no optimizer or scheduler update; their sampled tokens still count) before the run stops with an error", semantic=False, ge=0)
    push_to_hub: bool = f(False, "after the final eval, push final_policy/ (weights, processor, model card) to the Hugging Face Hub repo train.hub_model_id; refused at plan time without an HF token or a reachable Hub", semantic=False, derived=())
    hub_model_id: Optional[str] = f(None, "the Hub repo (<user or org>/<name>) train.push_to_hub pushes to; required with it", semantic=False, derived=())
    hang_timeout_s: Optional[float] = f(None, "hang watchdog: when no optimizer step completes in this many seconds, every thread's stack goes to <run_dir>/diagnostics/hang-<rank>-<time>.txt (training goes on); null = off", semantic=False, gt=0)
    signal_window: int = f(4, "RL: the learning-signal monitor's window in generation rounds: when this many rounds in a row give the reward no way to move the policy (every group's rewards equal, or with the built-in reward no well-formed answer), the console says so once with the cause and the fixes, and completion.json's learning_signal records it; the run goes on (budget parity first)", semantic=False, ge=1)


@dataclass
class Config:
    """The root schema (conf/config.yaml composes the groups into it)."""

    seed: int = f(0, "run seed: initialization, sampling and data order (not the dataset)", ge=0)
    output_root: str = f("outputs", "root of run dirs (<output_root>/runs/<run_name>) and caches", semantic=False)
    mode: Mode = f(Mode.train, "train, or plan: print the plan as JSON and write nothing", semantic=False, derived=())
    run_mode: RunMode = f(RunMode.normal, "normal, or smoke: checkpoint, die, resume in a new process, verify", semantic=False, derived=())
    resume: Resume = f(Resume.auto, "auto: continue a run dir of the same identity; must: refuse when none; never: refuse when it exists", semantic=False)
    resume_from: Optional[str] = f(None, "a checkpoint dir to resume from; must be the run's newest complete one (no silent rollback)", semantic=False)
    objective: str = f("eval/accuracy", "what a multirun job returns to its sweeper (hydra/sweeper=optuna optimizes it): a metric of the finished run as python -m harness.report names it, e.g. eval/accuracy, eval/FULL/accuracy, train/reward_last10pct", semantic=False)
    model: ModelConfig = MISSING
    arm: ArmConfig = f(MISSING, "the method and its knobs (conf/arm/<name>.yaml)", derived=())  # each run its own arm
    data: DataConfig = MISSING
    rollout: RolloutConfig = f(MISSING, "how completions are sampled (conf/rollout/<name>.yaml)", derived=(TEACHER,))  # SFT samples nothing
    placement: PlacementConfig = MISSING
    logger: LoggerConfig = MISSING
    budget: BudgetConfig = MISSING
    reward: RewardConfig = f(help="the reward function(s) every RL arm trains on and eval scores with", factory=RewardConfig)
    train: TrainConfig = f(help="logging, checkpoint and eval schedule", factory=TrainConfig)


# --- registration

#: group -> {schema name -> dataclass}; conf/<group>/<option>.yaml extends /schema/<group>/<name>.
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"model": ModelConfig},
    "arm": {name: spec.config for name, spec in registry().items()},  # arms/<name>/config.py
    "data": {"synthetic": SyntheticData, "jsonl": JsonlData},
    "rollout": {"rollout": RolloutConfig},
    "placement": {"placement": PlacementConfig},
    "logger": {"logger": LoggerConfig},
    "budget": {"budget": BudgetConfig},
}


def iter_fields(cls: type, prefix: str = ""):
    """Yield (dotted path, dataclasses.Field) for every field of a schema class, nested ones included."""
    hints = typing.get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        path = f"{prefix}{fld.name}"
        yield path, fld
        for cand in (hints[fld.name], *typing.get_args(hints[fld.name])):
            if dataclasses.is_dataclass(cand):
                yield from iter_fields(cand, path + ".")
                break

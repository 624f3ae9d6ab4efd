"""rollout=vllm_* maps onto TRL 1.16's GRPOConfig fields, every IS-correction knob set explicitly (planned as on a
GPU node with vllm installed; the plan checks are torch-free and look only at these)."""

from __future__ import annotations

import dataclasses

import pytest

from arms.common import BuildContext
from arms.grpo.trainer import grpo_config_kwargs


@pytest.fixture
def vllm_node(monkeypatch):
    import importlib.util

    import harness.config.checks

    real = importlib.util.find_spec
    monkeypatch.setattr(harness.config.checks, "cuda_visible", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))


@pytest.mark.parametrize("option, mode", [("vllm_colocate", "colocate"), ("vllm_server", "server")])
def test_vllm_rollout_maps_to_grpo_config(vllm_node, plan_of, tmp_path, option, mode):
    from trl import GRPOConfig

    from harness.rewards.answers import ANSWER_REGEX

    plan = plan_of(f"rollout={option}", "rollout.importance_sampling_mode=token_truncate",
                   "rollout.importance_sampling_clip_max=2.0", "rollout.tensor_parallel_size=2")
    kw = grpo_config_kwargs(BuildContext(plan=plan, run_dir=tmp_path, model=None, processor=None,
                                         train_dataset=None))
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(kw) <= fields, sorted(set(kw) - fields)
    assert kw["use_vllm"] is True and kw["vllm_mode"] == mode
    assert kw["vllm_importance_sampling_correction"] is True
    assert kw["vllm_importance_sampling_mode"] == "token_truncate"  # set explicitly, never TRL's default
    assert kw["vllm_importance_sampling_clip_max"] == 2.0 and kw["vllm_importance_sampling_clip_min"] == 0.0
    assert kw["vllm_tensor_parallel_size"] == 2 and kw["vllm_structured_outputs_regex"] == ANSWER_REGEX


def test_hf_rollout_sets_no_vllm_field(plan_of, tmp_path):
    kw = grpo_config_kwargs(BuildContext(plan=plan_of(), run_dir=tmp_path, model=None, processor=None,
                                         train_dataset=None))
    assert not [k for k in kw if "vllm" in k]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("option, mode", [("vllm_colocate", "colocate"), ("vllm_server", "server")])
def test_vllm_mapping_builds_a_grpo_config_that_keeps_every_field(vllm_node, plan_of, tmp_path, option, mode, device):
    """The mapped kwargs construct TRL's real GRPOConfig (its __post_init__ validates them: IS clip bounds, the
    generation batch, num_generations), and the built config holds the harness's values, not TRL's defaults
    (every knob below differs from its TRL default). device: what train.py passes in BuildContext, "cpu" here
    and "cuda" on a GPU node (use_cpu=False); the float32 tiny model keeps bf16 off, so both construct on this
    CPU machine. A bfloat16 model on a GPU node sets bf16=True, which TrainingArguments refuses without a GPU
    ("Your setup doesn't support bf16/gpu"): that case is the gpu tests' (tests/integration/test_gpu.py)."""
    from trl import GRPOConfig

    from harness.rewards.answers import ANSWER_REGEX

    plan = plan_of(f"rollout={option}", "rollout.gpu_memory_utilization=0.45", "rollout.tensor_parallel_size=2",
                   "rollout.enable_sleep_mode=true", "rollout.server_host=10.0.0.7", "rollout.server_port=8123",
                   "rollout.importance_sampling_mode=sequence_truncate", "rollout.importance_sampling_clip_max=2.5",
                   "rollout.importance_sampling_clip_min=0.25", "arm.steps_per_generation=2")
    kw = grpo_config_kwargs(BuildContext(plan=plan, run_dir=tmp_path, model=None, processor=None,
                                         train_dataset=None, device=device))
    cfg = GRPOConfig(**kw)
    assert cfg.use_vllm is True and cfg.vllm_mode == mode
    assert cfg.vllm_gpu_memory_utilization == 0.45 and cfg.vllm_tensor_parallel_size == 2
    assert cfg.vllm_enable_sleep_mode is True
    assert (cfg.vllm_server_host, cfg.vllm_server_port) == ("10.0.0.7", 8123)
    assert cfg.vllm_importance_sampling_correction is True
    assert cfg.vllm_importance_sampling_mode == "sequence_truncate"
    assert (cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max) == (0.25, 2.5)
    assert cfg.vllm_structured_outputs_regex == ANSWER_REGEX
    assert cfg.use_cpu is (device == "cpu") and cfg.bf16 is False
    # one generation round survives TRL's own batch arithmetic: prompts_per_step x num_generations completions per
    # optimizer step, steps_per_generation steps per round (TRL counts micro-batches of one per-device batch)
    a = plan.config["arm"]
    per_step = a["prompts_per_step"] * a["num_generations"]
    assert cfg.num_generations == a["num_generations"]
    assert cfg.generation_batch_size == per_step * a["steps_per_generation"] == 64
    assert cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps == per_step
    assert cfg.steps_per_generation == a["steps_per_generation"] * a["gradient_accumulation_steps"]


def test_clip_min_not_below_clip_max_is_refused_at_plan_time(vllm_node, plan_of):
    """TRL's GRPOConfig refuses vllm_importance_sampling_clip_min >= clip_max, but only once the trainer is built on
    the GPU node (after the model loaded): the plan refuses it first, naming the field."""
    from harness.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        plan_of("rollout=vllm_colocate", "rollout.importance_sampling_clip_min=3.0",
                "rollout.importance_sampling_clip_max=3.0")
    assert [p.field for p in err.value.problems] == ["rollout.importance_sampling_clip_min"]
    assert "fix:" in str(err.value)
    plan_of("rollout=vllm_colocate", "rollout.importance_sampling_clip_min=0.5")  # below clip_max 3.0: accepted

"""harness.rollout.rollout_kwargs reads the typed rollout config: the GRPOConfig fields it gives are TRL's plain
values, exactly the serialized config's (the plan JSON's) for every rollout option."""

from __future__ import annotations

import enum

import pytest
from omegaconf import OmegaConf

from harness.rewards.answers import ANSWER_REGEX
from harness.config.compose import compose
from harness.identity import to_jsonable
from harness.rollout import rollout_kwargs

TRL_FIELDS = {  # GRPOConfig field -> the rollout config's (trl/trainer/grpo_config.py)
    "vllm_mode": "vllm_mode", "vllm_gpu_memory_utilization": "gpu_memory_utilization",
    "vllm_tensor_parallel_size": "tensor_parallel_size", "vllm_enable_sleep_mode": "enable_sleep_mode",
    "vllm_server_host": "server_host", "vllm_server_port": "server_port",
    "vllm_importance_sampling_correction": "importance_sampling_correction",
    "vllm_importance_sampling_mode": "importance_sampling_mode",
    "vllm_importance_sampling_clip_max": "importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min": "importance_sampling_clip_min"}


def _rollout(*overrides: str):
    cfg, _ = compose(list(overrides))
    return OmegaConf.to_object(cfg).rollout


@pytest.mark.parametrize("option", ["vllm_colocate", "vllm_server"])
@pytest.mark.parametrize("structured", [True, False])
def test_vllm_fields_are_the_serialized_configs_plain_values(option, structured):
    r = _rollout(f"rollout={option}", f"rollout.structured_output={structured}",
                 "rollout.importance_sampling_mode=token_mask", "rollout.server_port=8123")
    kw = rollout_kwargs(r)
    serialized = to_jsonable(r)
    assert kw.pop("use_vllm") is True
    assert kw.pop("vllm_structured_outputs_regex", None) == (ANSWER_REGEX if structured else None)
    assert kw == {trl: serialized[ours] for trl, ours in TRL_FIELDS.items()}
    assert kw["vllm_importance_sampling_mode"] == "token_mask" and kw["vllm_server_port"] == 8123
    assert kw["vllm_mode"] == option.split("_")[1]
    assert not [k for k, v in kw.items() if isinstance(v, enum.Enum)]  # TRL compares them with its own strings


def test_hf_passes_nothing():
    assert rollout_kwargs(_rollout("rollout=hf")) == {}

"""rollout=vllm_* maps onto TRL 1.16's GRPOConfig fields, every IS-correction knob set explicitly (planned as on a
GPU node with vllm installed; the plan checks are torch-free and look only at these)."""

from __future__ import annotations

import dataclasses

import pytest

from arms.common import BuildContext
from arms.grpo import grpo_config_kwargs


@pytest.fixture
def vllm_node(monkeypatch):
    import importlib.util

    import harness.checks

    real = importlib.util.find_spec
    monkeypatch.setattr(harness.checks, "cuda_visible", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))


@pytest.mark.parametrize("option, mode", [("vllm_colocate", "colocate"), ("vllm_server", "server")])
def test_vllm_rollout_maps_to_grpo_config(vllm_node, plan_of, tmp_path, option, mode):
    from trl import GRPOConfig

    from harness.answers import ANSWER_REGEX

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

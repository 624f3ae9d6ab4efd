"""The rollout backend -> TRL mapping: what GRPOConfig receives for `rollout.*` (one module per concern:
a new backend is added here and in conf/rollout/). Torch-free: returns keyword arguments only.

hf: TRL's transformers generate (nothing to pass). vllm: TRL's vLLM integration, colocated or as a
server (`trl vllm-serve`), with the importance-sampling correction of the rollout/training mismatch
and, optionally, sampling constrained to the answer schema's regex.
"""

from __future__ import annotations

from harness.rewards.answers import ANSWER_REGEX
from harness.config.fields import RolloutBackend, RolloutMode
from harness.config.schema import RolloutConfig


def correction_kwargs(r: RolloutConfig) -> dict:
    """TRL's importance-sampling correction of the sampling/training mismatch (vLLM's, or off-policy rounds')."""
    return dict(
        vllm_importance_sampling_correction=r.importance_sampling_correction,
        vllm_importance_sampling_mode=r.importance_sampling_mode.value,
        vllm_importance_sampling_clip_max=r.importance_sampling_clip_max,
        vllm_importance_sampling_clip_min=r.importance_sampling_clip_min,
    )


def rollout_kwargs(r: RolloutConfig) -> dict:
    """GRPOConfig fields of the plan's typed rollout config (`plan.cfg.rollout`), as the plain values TRL compares
    against its own strings (the enums' values). rollout=async (harness.offpolicy) takes the correction's fields:
    its trainer turns TRL's correction on for the buffer's rounds (arms.offpolicy)."""
    if r.mode is RolloutMode["async"]:
        return correction_kwargs(r)
    if r.backend is not RolloutBackend.vllm:
        return {}
    kw = dict(
        use_vllm=True,
        vllm_mode=r.vllm_mode.value if r.vllm_mode is not None else None,
        vllm_gpu_memory_utilization=r.gpu_memory_utilization,
        vllm_tensor_parallel_size=r.tensor_parallel_size,
        vllm_enable_sleep_mode=r.enable_sleep_mode,
        vllm_server_host=r.server_host,
        vllm_server_port=r.server_port,
        **correction_kwargs(r),
    )
    if r.structured_output:
        kw["vllm_structured_outputs_regex"] = ANSWER_REGEX
    return kw

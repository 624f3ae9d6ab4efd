"""GPU paths: skipped without a CUDA device (marker gpu). Run them as one prepared script on a GPU node:

    ./test.sh -m gpu tests/integration/test_gpu.py

They use the tiny local model, so no checkpoint download is needed; the vLLM and multi-GPU tests skip
themselves when vllm is missing or fewer than two GPUs are visible.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from harness.verify import verify
from tests.conftest import run_harness

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _completed(out: Path, arm: str) -> dict:
    (run,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    assert verify(run) == []
    return json.loads((run / "completion.json").read_text())


@pytest.mark.parametrize("arm", ["grpo", "papo", "evi_po"])
def test_single_gpu_run(tmp_path, arm):
    proc = run_harness(f"arm={arm}", "debug=tiny", "placement.device=cuda", f"output_root={tmp_path}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    comp = _completed(tmp_path, arm)
    assert comp["peak_cuda_mb"] and comp["peak_cuda_mb"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_colocate_rollout(tmp_path):
    proc = run_harness("rollout=vllm_colocate", "rollout.gpu_memory_utilization=0.2", "debug=tiny",
                       f"output_root={tmp_path}", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    comp = _completed(tmp_path, "grpo")
    assert comp["realized_completion_tokens"] <= comp["completion_token_ceiling"]


@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("placement", ["ddp", "fsdp"])
def test_two_gpu_placements(tmp_path, placement):
    proc = run_harness("arm=papo", f"placement={placement}", "placement.num_processes=2", "debug=tiny",
                       f"output_root={tmp_path}", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    comp = _completed(tmp_path, "papo")
    assert comp["world_size"] == 2


def test_offpolicy_sampler_on_its_own_device(tmp_path):
    """rollout=async on a GPU: with two visible the sampler process takes the second (its CUDA_VISIBLE_DEVICES),
    with one it shares the trainer's; either way verify reads every completion's policy age."""
    proc = run_harness("rollout=async", "debug=tiny", "placement.device=cuda", f"output_root={tmp_path}",
                       timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _completed(tmp_path, "grpo")
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("grpo-")]
    log = (run / "offpolicy/sampler.log").read_text()
    assert "built in" in log and " on cuda" in log, log[-2000:]
    if _gpus() >= 2:
        assert "on GPU 1 of its own" in log and "CUDA_VISIBLE_DEVICES=1)" in log, log[-2000:]
    else:
        assert "on the trainer's device" in log, log[-2000:]

"""The GPU check's pure logic (bench/gpu_check_figures.py, bench/gpu_check_parts.py, bench/gpu_check.py): how its
figures come out of a run dir, a trials file and step timestamps, how steps and parts get their status, and what
each part runs. A wrong figure or a wrong command line is found here on CPU, not on the GPU node's short lease."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402
import gpu_check_figures as figs  # noqa: E402
import gpu_check_parts as parts  # noqa: E402


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_step_figures_leave_the_first_step_out():
    metrics = [{"step": 1, "step_time": 9.0}, {"step": 2, "step_time": 2.0}, {"step": 3, "step_time": 4.0},
               {"step": 3, "loss": 0.1}]  # a row without step_time (an eval row) is ignored
    ledger = [{"step": 0, "tokens": 100}, {"step": 1, "tokens": 30}, {"step": 1, "tokens": 10},
              {"step": 2, "tokens": 20}]
    f = figs.step_figures(metrics, ledger)
    assert f["step_time_s"] == [9.0, 2.0, 4.0] and f["steps_timed"] == 2
    assert f["step_s"] == 3.0  # median of steps 2 and 3
    assert f["sampled_tokens_per_s"] == 10.0  # (40 + 20) tokens / (2 + 4) s; step 1's 100 tokens are not in it


def test_step_figures_one_step_and_none():
    assert figs.step_figures([{"step": 1, "step_time": 2.0}], [{"step": 0, "tokens": 8}])["sampled_tokens_per_s"] == 4.0
    empty = figs.step_figures([{"step": 1, "loss": 1.0}], [])
    assert empty["step_s"] is None and empty["sampled_tokens_per_s"] is None and empty["steps_timed"] == 0


def test_intervals_pair_each_end_with_the_latest_start():
    assert figs.intervals([0.0, 10.0, 20.0], [3.0, 12.5, 21.0]) == [3.0, 2.5, 1.0]
    assert figs.intervals([0.0, 10.0], [12.0]) == [2.0]  # a start without its end (an aborted step) is dropped
    assert figs.intervals([], [1.0]) == [] and figs.intervals([5.0], [1.0]) == []


def test_tokens_per_s_ratio_and_median():
    assert figs.tokens_per_s([999, 100, 300], [50.0, 1.0, 3.0]) == 100.0
    assert figs.tokens_per_s([], []) is None
    assert figs.median_after_first([10.0, 1.0, 3.0, 2.0]) == 2.0 and figs.median_after_first([]) is None
    assert figs.ratio(3.0, 2.0) == 1.5 and figs.ratio(None, 2.0) is None and figs.ratio(1.0, 0) is None


def _run_dir(tmp_path: Path, *, sft: bool = False) -> Path:
    run = tmp_path / "runs" / "grpo-x"
    arm = "sft" if sft else "grpo"
    (run / "run_manifest.json").parent.mkdir(parents=True)
    (run / "run_manifest.json").write_text(json.dumps({"status": "completed", "plan": {"config": {
        "arm": {"name": arm}, "model": {"tuning": "lora", "dtype": "bfloat16"}}}}))
    comp = {"optimizer_steps": 4, "train_runtime_s": 10.0, "peak_cuda_mb": 1234.5, "phases_s": {"train": 10.0},
            "checkpoints": ["checkpoint-2", "checkpoint-10", "checkpoint-4"]}
    (run / "completion.json").write_text(json.dumps(comp))
    if not sft:
        _jsonl(run / "metrics.jsonl", [{"step": s, "step_time": 1.0 + s} for s in (1, 2, 3, 4)])
        _jsonl(run / "ledgers" / "rank-0.jsonl", [{"step": s, "tokens": 8} for s in range(4)])
    ckpt = run / "checkpoints" / "checkpoint-10"
    ckpt.mkdir(parents=True)
    for i, name in enumerate(("config.json", "model.safetensors", figs.CHECKPOINT_MANIFEST)):
        (ckpt / name).write_bytes(b"x" * 1024)
        os.utime(ckpt / name, (1000.0 + 2 * i, 1000.0 + 2 * i))
    return run


def test_run_figures_from_a_run_dir(tmp_path):
    f = figs.run_figures(_run_dir(tmp_path), verify_fn=lambda d: [])
    assert f["verify"] == "ok" and f["arm"] == "grpo" and f["tuning"] == "lora" and f["peak_cuda_mb"] == 1234.5
    assert f["step_s"] == 4.0 and f["sampled_tokens_per_s"] == round(24 / 12, 1)
    assert f["checkpoint"] == {"name": "checkpoint-10", "size_mb": round(3 / 1024, 1), "save_s_files": 4.0}


def test_run_figures_sft_falls_back_to_the_mean_and_reports_violations(tmp_path):
    f = figs.run_figures(_run_dir(tmp_path, sft=True), verify_fn=lambda d: ["ledger does not sum"])
    assert f["step_s"] == 2.5 and f["sampled_tokens_per_s"] is None  # 10 s / 4 steps: SFT logs no step_time
    assert f["verify"] == ["ledger does not sum"]


def test_run_figures_of_an_unfinished_run(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "run_manifest.json").write_text(json.dumps({"status": "failed"}))
    assert figs.run_figures(run, verify_fn=lambda d: [])["status"] == "failed"


def test_part_status():
    assert parts.part_status(["ok", "ok"]) == "ok"
    assert parts.part_status(["ok", "skipped"]) == "ok"
    assert parts.part_status(["skipped"]) == "skipped"
    assert parts.part_status(["ok", "timeout"]) == "timeout"
    assert parts.part_status(["timeout", "failed"]) == "failed"
    assert parts.part_status(["ok", "running"]) == "running"


def test_collect_trials_ratio_and_missing_jobs(tmp_path):
    results = tmp_path / "lora.jsonl"
    _jsonl(results, [
        {"name": "grpo-lora", "ok": True, "wall_s_per_step": 6.0, "step_s": 5.0, "wall_step_s": [9, 6, 6],
         "completion_tokens": [256] * 4},
        {"name": "grpo-lora-bare", "ok": True, "wall_s_per_step": 5.0, "step_s": 5.0, "completion_tokens": [256] * 4},
        {"name": "papo-lora", "ok": False, "error": "RuntimeError: CUDA out of memory"}])
    out, problems = parts.collect_trials(results, ["grpo-lora", "papo-lora", "grpo-lora-bare", "grpo-full"])
    assert out["harness_over_bare"] == {"wall_step": 1.2, "trl_step_time": 1.0, "same_completions": True, "steps": 3}
    assert "completion_tokens" not in out["runs"]["grpo-lora"]
    assert problems == ["papo-lora: failed: RuntimeError: CUDA out of memory", "grpo-full: did not finish"]


def test_collect_multirun_maps_arms_and_verifies_every_run(tmp_path):
    root = tmp_path / "out"
    runs = {}
    for arm in parts.ARMS:
        run = root / "runs" / f"{arm}-x"
        run.mkdir(parents=True)
        (run / "run_manifest.json").write_text(json.dumps({"status": "completed"}))
        runs[arm] = run
    (root / "runs" / "sft-warm").mkdir()  # a warm start: verified, not an arm's run
    sweep = {"failed": [], "runs": [{"job": i, "overrides": [f"arm={a}", "debug=tiny"], "run_dir": str(runs[a])}
                                    for i, a in enumerate(parts.ARMS) if a != "opd"]}
    _jsonl(root / "sweeps" / "t" / "sweep.json", [])
    (root / "sweeps" / "t" / "sweep.json").write_text(json.dumps(sweep))
    out, problems = parts.collect_multirun(root)
    assert sorted(out["runs"]) == sorted(a for a in parts.ARMS if a != "opd")
    assert "opd: no run" in problems
    assert set(out["other_runs_verify"]) == {"opd-x", "sft-warm"}
    assert any(p.startswith("sft-warm: ") for p in problems)  # no manifest there: harness.verify says so


def test_merge_keeps_both_steps_runs():
    into = {"runs": {"grpo-lora": 1}, "build": {"build_s": 3}}
    gpu_check.merge(into, {"runs": {"grpo-full": 2}, "harness_over_bare": {"wall_step": 1.0}})
    assert into == {"runs": {"grpo-lora": 1, "grpo-full": 2}, "build": {"build_s": 3},
                    "harness_over_bare": {"wall_step": 1.0}}


@pytest.mark.parametrize("cpu", [True, False])
def test_plan_steps_commands(tmp_path, cpu):
    cfg = parts.Config(cpu=cpu, work=tmp_path, python="py", steps=3, full_steps=2)
    env, lanes, trials = parts.plan_steps(cfg, set(parts.PARTS))
    steps = {s.name: s for s in [env, *(s for lane in lanes for s in lane), *trials]}
    assert set(steps) == {"env", "arms_tiny.multirun", "arms_tiny.smoke", "fixtures.build", "parity",
                          "arms_fixture.multirun", "arms_fixture.full", "qwen3b.build", "qwen3b.lora", "qwen3b.full"}
    dev = "cpu" if cpu else "cuda"
    for name, s in steps.items():
        if name.startswith("arms_"):
            assert f"placement.device={dev}" in s.argv and "debug=tiny" in s.argv
    assert "arm=sft,grpo,papo,evi_po,opd" in steps["arms_fixture.multirun"].argv
    assert "model.tuning=full" in steps["arms_fixture.full"].argv
    assert (2 in steps["parity"].skip_rc) is cpu  # no torchvision is a skip on CPU, a failure on a GPU node
    assert steps["qwen3b.lora"].needs == ("qwen3b.build",) and steps["parity"].needs == ("fixtures.build",)
    spec = json.loads((tmp_path / "trials" / "lora.json").read_text())
    assert [(j["name"], j["kind"]) for j in spec["jobs"]] == [("grpo-lora", "harness"), ("grpo-lora-bare", "bare"),
                                                              ("papo-lora", "harness")]
    assert steps["qwen3b.lora"].go and steps["qwen3b.full"].go  # started ahead, they wait for their turn
    o = spec["jobs"][0]["overrides"]
    for want in ("arm.init=scratch", "arm.num_generations=8", "arm.prompts_per_step=4", "train.eval_before=false",
                 "train.eval_after=false", "budget.max_steps=3", "model.tuning=lora", f"placement.device={dev}"):
        assert want in o
    assert f"data.image_size={56 if cpu else 448}" in o and f"arm.max_completion_length={32 if cpu else 256}" in o
    full = json.loads((tmp_path / "trials" / "full.json").read_text())["jobs"]
    assert [j["name"] for j in full] == ["grpo-full", "papo-full"] and "budget.max_steps=2" in full[0]["overrides"]
    assert ("3b" in steps["qwen3b.build"].argv) is not cpu


def test_summary_lines_of_a_partial_report(tmp_path):
    report = {"mode": "cuda", "wall_s": 12.0, "budget_s": 480, "ok": False, "failed": ["qwen3b"],
              "parts": {p: {"status": "pending", "steps": {}, "figures": {}} for p in parts.PARTS}}
    report["parts"]["qwen3b"] = {"status": "timeout", "wall_s": 300.0, "figures": {
        "build": {"build_s": 30.1, "size_gb": 7.5},
        "runs": {"grpo-lora": {"wall_s_per_step": 8.0, "step_s": 7.5, "wall_tokens_per_s": 1000.0,
                               "peak_cuda_mb_job": 30720.0, "checkpoint_save_s": [0.5],
                               "checkpoint": {"size_mb": 100.0}, "job_wall_s": 60.0}}},
        "steps": {"qwen3b.full": {"status": "timeout", "reason": "killed after 300 s"}}}
    text = "\n".join(parts.summary_lines(report, tmp_path))
    assert "FAILED: qwen3b" in text and "killed after 300 s" in text and "build 30.1 s (7.5 GB)" in text
    assert "grpo-lora" in text and "30.00" in text  # peak GB

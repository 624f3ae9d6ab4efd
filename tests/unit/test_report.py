"""`python -m harness.report`: fixture run dirs with chosen numbers, checked against hand-computed values."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.cli import build_report, main
from harness.report.runs import read_curve, train_reward_last
from tests.conftest import REPO, heavy_imports

RELS = ("FULL", "CONTROL", "MISSING", "SUBSTITUTE")
DATA = "d" * 64
MODEL = "m" * 64
NON_SEMANTIC = ["output_root", "mode", "data.cache_dir", "train.logging_steps"]

# --- fixture run dirs


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")


def _eval(acc: float, rel: dict | None, direction: float | None, abst_full: float) -> dict:
    rel = rel or {r: acc for r in RELS}
    block = {"n": 64, "accuracy": acc, "abstention_rate": 0.25, "format_valid": 1.0, "truncated": 0.0,
             "per_relation": {r: {"n": 16, "accuracy": rel[r], "abstention_rate": abst_full if r == "FULL" else 0.0,
                                  "format_valid": 1.0, "truncated": 0.0} for r in RELS}}
    if direction is not None:
        block["direction_accuracy"] = direction
    return block


def make_run(root: Path, arm: str, seed: int, acc: float | None = None, *, before: float | None = None,
             rel: dict | None = None, knobs: dict | None = None, data: str = DATA, steps: int = 10,
             tokens: tuple[int, int] = (30, 20), rewards: list[float] | None = None, ceiling: int = 1000,
             parent: str | None = None, complete: bool = True, direction: float | None = None,
             abst_full: float = 0.0, wall: float = 10.0, subdir: str = "runs", stopped_by: str = "max_steps",
             max_steps: int | None = None, steps_per_generation: int = 1, sft_rows: int = 40,
             plan_budget: bool = True, model: str | dict = MODEL, periodic: dict | None = None,
             metrics_rows: list[dict] | None = None, teacher: dict | None = None) -> Path:
    """A minimal but faithful run dir: manifest (plan with its budget summary, identity), completion.json,
    eval/test(-before).json, and for RL arms two ranks of ledger (tokens[r] per step each) and trace rows
    (rewards[step]). RL rounds: 2 prompts x 4 generations per step, max_completion_length 16 (a step's
    bound 128 tokens), `steps_per_generation` steps per round. `max_steps` (default `steps`) is the cap.
    `model`: the model's files_sha256, or a whole identity.model block. `periodic`: {step: (tokens, accuracy)}
    written as train.eval_steps artifacts; `metrics_rows`: metrics.jsonl."""
    max_steps = steps if max_steps is None else max_steps
    rl = arm != "sft"
    round_knobs = {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 16,
                   "steps_per_generation": steps_per_generation, "num_iterations": 1} if rl else {}
    config = {"seed": seed, "output_root": str(root), "mode": "train",
              "arm": {"name": arm, "learning_rate": 1e-4, **round_knobs, **(knobs or {})},
              "budget": {"max_completion_tokens": ceiling, "max_steps": max_steps},
              "data": {"name": "synthetic", "eval_split": "test", "cache_dir": str(root / "cache")},
              "train": {"logging_steps": 1}}
    semantic = {k: v for k, v in config.items() if k not in ("output_root", "mode")}
    sem = hashlib.sha256(json.dumps([semantic, data] + ([model] if model != MODEL else []),
                                    sort_keys=True).encode()).hexdigest()
    name = f"{arm}-tiny-s{seed}-{sem[:8]}"
    run_dir = root / subdir / name
    ident = {"config_sha256": sem, "semantic_sha256": sem, "non_semantic_fields": NON_SEMANTIC,
             "data": {"kind": "synthetic", "spec_sha256": "s" * 64, "content_sha256": data, "root": str(root / "d")},
             "model": model if isinstance(model, dict) else {"kind": "tiny", "spec_sha256": "t" * 64, "files_sha256": model,
                                                              "base_path": str(root / "m")},
             "code": {"commit": "abc123" * 6 + "abcd", "dirty": False, "diff_sha256": None}}
    if teacher is not None:  # opd: what its completion and manifest record (the plan's, before the teacher ran: None)
        ident["teacher"] = teacher
    planned = {**ident, "data": {**ident["data"], "content_sha256": None}, "model": {**ident["model"], "files_sha256": None}}
    if teacher is not None:
        planned["teacher"] = {**teacher, "weights_sha256": None, "eval_accuracy": None}
    a = config["arm"]
    if rl:  # harness.plan.budget_summary
        per_step = a["prompts_per_step"] * a["num_generations"] * a["max_completion_length"]
        budget = {"kind": "completion_tokens", "completion_token_ceiling": ceiling, "per_step_upper_bound": per_step,
                  "completions_per_step": a["prompts_per_step"] * a["num_generations"], "max_steps": max_steps,
                  "guaranteed_steps": min(max_steps, ceiling // per_step), "rule": "..."}
    else:
        budget = {"kind": "loss_tokens", "loss_token_ceiling": 2000, "max_steps": max_steps, "rule": "..."}
    plan = {"run_name": name, "run_dir": str(run_dir), "identity": planned, "choices": {"arm": arm}, "config": config}
    if plan_budget:
        plan["budget"] = budget
    _write(run_dir / "run_manifest.json", {
        "manifest_version": 1, "run_name": name, "status": "completed" if complete else "running", "identity": ident,
        "plan": plan,
        "parent": {"run_name": parent, "run_dir": str(root / "runs" / parent)} if parent else None,
    })
    if not complete:
        return run_dir
    comp = {"status": "completed", "run_name": name, "arm": arm, "optimizer_steps": steps, "stopped_by": stopped_by,
            "identity": ident, "wall_time_s": wall,
            "parent": {"run_name": parent, "run_dir": str(root / "runs" / parent)} if parent else None}
    if rl:
        comp.update(realized_completion_tokens=steps * sum(tokens), completion_token_ceiling=ceiling,
                    realized_completion_count=steps * 8, world_size=2,
                    ranks=[{"rank": r, "completion_tokens": steps * tokens[r], "completions": steps * 4} for r in (0, 1)])
        rewards = rewards if rewards is not None else [0.1 * s for s in range(steps)]
        for rank in (0, 1):
            ledger = [{"completion_id": f"{sem[:8]}:{s}:{rank}:{g}", "step": s, "tokens": tokens[rank] // 4 + (g == 0) * (tokens[rank] % 4),
                       "terminated": True, "view": "v"} for s in range(steps) for g in range(4)]
            trace = [{"completion_id": r["completion_id"], "step": r["step"], "reward": rewards[r["step"]],
                      "correct": True, "relation": "FULL"} for r in ledger]
            (run_dir / "ledgers").mkdir(parents=True, exist_ok=True)
            (run_dir / "traces").mkdir(parents=True, exist_ok=True)
            (run_dir / "ledgers" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
            (run_dir / "traces" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    else:
        comp.update(realized_loss_tokens=500, planned_loss_tokens=500, loss_token_ceiling=2000, sft_rows=sft_rows,
                    world_size=1)
    if acc is not None:
        after = _eval(acc, rel, direction, abst_full)
        _write(run_dir / "eval" / "test.json", {"split": "test", "label": "final", **after})
        comp["eval_after"] = after
    if before is not None:
        b = _eval(before, None, None, 0.0)
        _write(run_dir / "eval" / "test-before.json", {"split": "test", "label": "before", **b})
        comp["eval_before"] = b
    for step, (spent, a) in (periodic or {}).items():
        _write(run_dir / "eval" / f"test-checkpoint-{step}.json",
               {"split": "test", "label": f"checkpoint-{step}", "step": step, "checkpoint": f"checkpoint-{step}",
                "completion_tokens": spent, **_eval(a, None, None, 0.0)})
    if metrics_rows is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_rows))
    _write(run_dir / "completion.json", comp)
    return run_dir


GRPO = (0.50, 0.60, 0.70)
PAPO = (0.55, 0.70, 0.72)


@pytest.fixture
def basic(tmp_path):
    """grpo and papo, seeds 0..2, from SFT warm starts (seeds 0..2), plus one incomplete grpo run."""
    root = tmp_path / "out"
    sft = [make_run(root, "sft", s, 0.40 + 0.01 * s, steps=20) for s in range(3)]
    for s in range(3):
        make_run(root, "grpo", s, GRPO[s], before=0.40 + 0.01 * s, parent=sft[s].name)
        make_run(root, "papo", s, PAPO[s], before=0.40 + 0.01 * s, parent=sft[s].name, knobs={"gamma": 0.02})
    make_run(root, "grpo", 3, None, complete=False)
    return root


def _cond(rep: dict, label: str, group: int = 0) -> dict:
    found = [c for c in rep["groups"][group]["conditions"] if c["label"] == label]
    assert found, [c["label"] for c in rep["groups"][group]["conditions"]]
    return found[0]


def _pair(rep: dict, cond: str, metric: str, group: int = 0) -> dict:
    return next(p for p in rep["groups"][group]["paired"] if p["condition"] == cond and p["metric"] == metric)


# --- tests


def test_means_t_intervals_and_exact_bootstrap(basic):
    rep, md = build_report(basic)
    assert md == basic / "report" / "report.md" and md.is_file()
    assert json.loads((basic / "report" / "report.json").read_text()) == rep
    g = _cond(rep, "grpo")["metrics"]
    # grpo 0.50, 0.60, 0.70: mean 0.6, sd 0.1, hw = 4.302653 * 0.1 / sqrt(3) = 0.248414
    assert g["eval/accuracy"]["n"] == 3 and g["eval/accuracy"]["mean"] == pytest.approx(0.6)
    assert g["eval/accuracy"]["half_width"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3))
    p = _cond(rep, "papo")["metrics"]
    # papo 0.55, 0.70, 0.72: mean 197/300; deviations -32, 13, 19 (/300); sd = sqrt((1024+169+361)/2)/300 = sqrt(777)/300
    assert p["eval/accuracy"]["mean"] == pytest.approx(197 / 300)
    assert p["eval/accuracy"]["sd"] == pytest.approx(math.sqrt(777) / 300)
    assert p["eval/accuracy"]["half_width"] == pytest.approx(4.302653 * math.sqrt(777) / 300 / math.sqrt(3))
    # change = after - before per seed: grpo 0.10, 0.19, 0.28 -> mean 0.19
    assert g["eval/accuracy_change"]["mean"] == pytest.approx(0.19)
    assert g["eval/accuracy_before"]["mean"] == pytest.approx(0.41)
    # paired papo - grpo, seeds 0,1,2: d = 0.05, 0.10, 0.02; exact bootstrap, n = 3: [min, max] = [0.02, 0.10]
    acc = _pair(rep, "papo", "eval/accuracy")
    assert acc["seeds"] == [0, 1, 2] and acc["n"] == 3 and acc["method"] == "exact"
    assert acc["mean"] == pytest.approx(0.17 / 3)
    assert (acc["low"], acc["high"]) == (pytest.approx(0.02), pytest.approx(0.10))
    assert {q["metric"] for q in rep["groups"][0]["paired"] if q["condition"] == "papo"} >= {
        "eval/accuracy", "eval/FULL/accuracy", "eval/CONTROL/accuracy", "eval/MISSING/accuracy",
        "eval/SUBSTITUTE/accuracy"}
    assert rep["groups"][0]["baseline"] == "grpo"
    text = md.read_text()
    assert "0.600 ± 0.248 (n=3)" in text and "[+0.020, +0.100]" in text


def test_budget_reward_and_steps(basic):
    rep, _ = build_report(basic)
    g = _cond(rep, "grpo")["metrics"]
    # 10 steps x (30 + 20) tokens over two ranks = 500 of a 1000-token ceiling
    assert g["budget/tokens"]["mean"] == 500 and g["budget/ceiling"]["mean"] == 1000
    assert g["budget/fraction"]["mean"] == pytest.approx(0.5)
    # rewards 0.0, 0.1, ..., 0.9 over 10 steps; last 10% = the last step -> 0.9
    assert g["train/reward_last10pct"]["mean"] == pytest.approx(0.9)
    assert g["train/optimizer_steps"]["mean"] == 10 and _cond(rep, "grpo")["stopped_by"] == {"max_steps": 3}
    s = _cond(rep, "sft (warm start)")
    assert s["budget_kind"] == "loss" and s["metrics"]["budget/tokens"]["mean"] == 500
    assert s["metrics"]["train/reward_last10pct"]["n"] == 0  # no traces: shown as "–"


def test_curve_sums_ranks_per_step_and_last_ten_percent(tmp_path):
    run = make_run(tmp_path, "grpo", 0, 0.5, steps=20, tokens=(7, 5), rewards=[float(s) for s in range(20)])
    notes: list[str] = []
    curve = read_curve(run, notes)
    assert notes == [] and curve["step"] == list(range(20))
    assert curve["tokens"] == [12] * 20  # 7 (rank 0) + 5 (rank 1) per step
    assert curve["reward"][3] == 3.0
    # 20 steps: last ceil(2.0) = 2 steps, rewards 18 and 19, 8 completions each -> 18.5
    assert train_reward_last(curve) == pytest.approx(18.5)


def test_warm_start_label_and_fixed_order(basic):
    make_run(basic, "zeta", 0, 0.3)
    make_run(basic, "evi_po", 0, 0.6)
    rep, _ = build_report(basic)
    labels = [c["label"] for c in rep["groups"][0]["conditions"]]
    assert labels == ["sft (warm start)", "grpo", "papo", "evi_po", "zeta"]
    assert _cond(rep, "sft (warm start)")["warm_start"] is True


def test_incomplete_run_listed_not_averaged(basic):
    rep, md = build_report(basic)
    inc = rep["incomplete_runs"]
    assert len(inc) == 1 and inc[0]["seed"] == 3 and inc[0]["manifest_status"] == "running"
    assert "no completion.json" in inc[0]["status"]
    assert _cond(rep, "grpo")["seeds"] == [0, 1, 2]
    assert rep["counts"]["incomplete"] == 1
    assert "## Incomplete runs" in md.read_text() and inc[0]["run"] in md.read_text()


def test_ablation_labels_and_order(tmp_path):
    root = tmp_path / "o"
    for s, (a, b) in enumerate([(0.5, 0.6), (0.55, 0.65)]):
        make_run(root, "grpo", s, 0.5)
        make_run(root, "papo", s, a, knobs={"gamma": 0.5})
        make_run(root, "papo", s, b, knobs={"gamma": 0.02})
    rep, _ = build_report(root)
    labels = [c["label"] for c in rep["groups"][0]["conditions"]]
    assert labels == ["grpo", "papo (arm.gamma=0.02)", "papo (arm.gamma=0.5)"]  # 0.02 < 0.5 numerically
    assert _cond(rep, "papo (arm.gamma=0.5)")["fields"] == {"arm.gamma": 0.5}
    # paired vs grpo: gamma=0.02: d = 0.1, 0.15 -> exact n=2 interval [0.10, 0.15], mean 0.125
    p = _pair(rep, "papo (arm.gamma=0.02)", "eval/accuracy")
    assert p["n"] == 2 and p["mean"] == pytest.approx(0.125)
    assert (p["low"], p["high"]) == (pytest.approx(0.10), pytest.approx(0.15))
    # --baseline by label
    rep2, _ = build_report(root, baseline="papo (arm.gamma=0.5)")
    assert rep2["groups"][0]["baseline"] == "papo (arm.gamma=0.5)"
    # --baseline papo is ambiguous: said in the report, not an error
    rep3, md3 = build_report(root, baseline="papo")
    assert rep3["groups"][0]["baseline"] is None and rep3["groups"][0]["paired"] == []
    assert "ambiguous" in rep3["groups"][0]["baseline_note"] and "ambiguous" in md3.read_text()
    rep4, _ = build_report(root, baseline="evi_po")
    assert "not among" in rep4["groups"][0]["baseline_note"]


def test_a_field_left_out_at_its_default_sorts_as_its_value(tmp_path):
    """A run at a field's default that older runs had (harness.identity.OMIT_AT_DEFAULT: e.g. rollout.lag=1 of
    sweep=staleness) lacks the field in its identity; its condition sorts by that value, not last."""
    root = tmp_path / "o"
    for epochs in (4, None, 2):
        make_run(root, "grpo", 0, 0.5, knobs={"epochs": epochs} if epochs else None)
    rep, _ = build_report(root)
    labels = [c["label"] for c in rep["groups"][0]["conditions"]]
    assert labels == ["grpo (arm.epochs=1)", "grpo (arm.epochs=2)", "grpo (arm.epochs=4)"], labels


def test_pairs_only_common_seeds(tmp_path):
    root = tmp_path / "o"
    for s in range(3):
        make_run(root, "grpo", s, GRPO[s])
    for s, acc in ((1, 0.65), (2, 0.62), (5, 0.90)):
        make_run(root, "evi_po", s, acc)
    rep, _ = build_report(root)
    p = _pair(rep, "evi_po", "eval/accuracy")
    # common seeds 1, 2: d = 0.65 - 0.60 = 0.05, 0.62 - 0.70 = -0.08; mean -0.015; n=2 interval [-0.08, 0.05]
    assert p["seeds"] == [1, 2] and p["n"] == 2
    assert p["mean"] == pytest.approx(-0.015)
    assert (p["low"], p["high"]) == (pytest.approx(-0.08), pytest.approx(0.05))
    # the table still averages all three evi_po seeds
    assert _cond(rep, "evi_po")["metrics"]["eval/accuracy"]["mean"] == pytest.approx((0.65 + 0.62 + 0.90) / 3)


def test_groups_split_on_data_identity(tmp_path):
    root = tmp_path / "o"
    for s in range(2):
        make_run(root, "grpo", s, 0.5 + 0.1 * s)
    other = "e" * 64
    make_run(root, "grpo", 0, 0.9, data=other)
    rep, md = build_report(root)
    assert rep["counts"]["groups"] == 2 and len(rep["groups"]) == 2
    assert rep["identity_note"].startswith("2 groups: runs differ in data identity")
    assert "dddddddddddd" in rep["identity_note"] and "eeeeeeeeeeee" in rep["identity_note"]
    assert _cond(rep, "grpo", 0)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.55)  # never averaged with 0.9
    assert _cond(rep, "grpo", 1)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.9)
    assert "2 groups: runs differ in data identity" in md.read_text()
    for k in (1, 2):
        assert (root / "report" / f"eval_accuracy_by_relation-g{k}.png").is_file()
    # one group again: the -g<k> plots of the earlier report are removed, not left to mislead
    import shutil

    shutil.rmtree(next(p for p in (root / "runs").iterdir() if other in (p / "run_manifest.json").read_text()))
    rep, _ = build_report(root)
    assert len(rep["groups"]) == 1 and rep["identity_note"] is None
    assert sorted(p.name for p in (root / "report").glob("*.png")) == [
        "budget_use.png", "eval_accuracy_by_relation.png", "reward_vs_tokens.png"]


def test_groups_split_on_model_identity(tmp_path):
    """Runs identical but for the model (its files_sha256) land in separate groups and are never averaged
    together; identical runs share one group (and one condition)."""
    root = tmp_path / "o"
    for s in range(2):
        make_run(root, "grpo", s, 0.5 + 0.1 * s)  # model MODEL ("mmm...")
    other = "f" * 64
    make_run(root, "grpo", 0, 0.9, model=other)
    rep, md = build_report(root)
    assert rep["counts"]["runs"] == 3 and len(rep["groups"]) == 2
    assert [g["model"] for g in rep["groups"]] == ["files_sha256 " + "m" * 12, "files_sha256 " + "f" * 12]  # larger first
    assert rep["identity_note"].startswith("2 groups: runs differ in model identity")
    assert _cond(rep, "grpo", 0)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.55)  # never averaged with 0.9
    assert _cond(rep, "grpo", 0)["metrics"]["eval/accuracy"]["n"] == 2
    assert _cond(rep, "grpo", 1)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.9)
    assert "2 groups: runs differ in model identity" in md.read_text()


def test_groups_split_on_model_identity_without_file_digests(tmp_path):
    """A pretrained model identity without files_sha256 is keyed by its other fields (hub id, revision, config
    digest; paths ignored): another checkpoint is another group, the same one at another path is not."""
    root = tmp_path / "o"

    def qwen(hub_id: str, revision: str, path: str) -> dict:
        return {"kind": "pretrained", "hub_id": hub_id, "path": path, "revision": revision,
                "config_sha256": hashlib.sha256(hub_id.encode()).hexdigest(), "files_sha256": None}

    make_run(root, "grpo", 0, 0.5, model=qwen("Qwen/Qwen2.5-VL-3B-Instruct", "r1", "/a/snap"))
    make_run(root, "grpo", 1, 0.7, model=qwen("Qwen/Qwen2.5-VL-3B-Instruct", "r1", "/b/elsewhere"))
    make_run(root, "grpo", 0, 0.9, model=qwen("Qwen/Qwen2.5-VL-7B-Instruct", "r1", "/a/snap"))
    rep, _ = build_report(root)
    assert len(rep["groups"]) == 2 and rep["identity_note"].startswith("2 groups: runs differ in model identity")
    assert _cond(rep, "grpo", 0)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.6)  # the 3B seeds 0, 1
    assert _cond(rep, "grpo", 1)["metrics"]["eval/accuracy"]["mean"] == pytest.approx(0.9)  # the 7B run alone


def test_second_run_of_a_seed_is_listed_not_averaged(tmp_path):
    make_run(tmp_path, "grpo", 0, 0.5, subdir="a/runs")
    make_run(tmp_path, "grpo", 0, 0.5, subdir="b/runs")  # the same run copied into another folder
    make_run(tmp_path, "grpo", 1, 0.7, subdir="a/runs")
    rep, _ = build_report(tmp_path)
    c = _cond(rep, "grpo")
    assert c["seeds"] == [0, 1] and len(c["duplicates"]) == 1
    assert any("second run" in n for n in rep["notes"])


def test_sweep_folder_failed_jobs_and_job_runs_only(tmp_path):
    root = tmp_path / "o"
    sft = make_run(root, "sft", 0, 0.4)
    run = make_run(root, "grpo", 0, 0.5, parent=sft.name)
    sweep = root / "sweeps" / "2026-01-01_00-00-00"
    (sweep / "multirun.yaml").parent.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    _write(sweep / "jobs" / "0.json", {"job": 0, "overrides": ["arm=grpo", "seed=0"], "status": "completed",
                                       "exit_code": 0, "error": None, "run_dir": str(run)})
    _write(sweep / "jobs" / "1.json", {"job": 1, "overrides": ["arm=papo", "seed=0"], "status": "failed",
                                       "exit_code": None, "run_dir": None,
                                       "error": {"type": "RuntimeError", "message": "CUDA out of memory\nmore",
                                                 "traceback": "..."}})
    rep, md = build_report(sweep)
    assert rep["source"] == "sweep"
    assert [c["label"] for c in rep["groups"][0]["conditions"]] == ["grpo"]  # the SFT parent is not a job
    (job,) = rep["failed_jobs"]
    assert job["job"] == 1 and job["overrides"] == ["arm=papo", "seed=0"]
    assert job["error"] == "RuntimeError: CUDA out of memory" and job["exit_code"] is None
    text = md.read_text()
    assert "## Failed jobs" in text and "arm=papo seed=0" in text and "CUDA out of memory" in text
    # the output_root lists every run under runs/ and the same failed job
    rep_root, _ = build_report(root)
    assert rep_root["source"] == "output_root" and len(rep_root["failed_jobs"]) == 1
    assert {c["label"] for c in rep_root["groups"][0]["conditions"]} == {"sft (warm start)", "grpo"}


def test_a_job_whose_run_a_later_command_completed_is_not_a_failure(tmp_path):
    """A sweep stopped with SIGTERM records its running job as interrupted; the same command then completes that
    run in a second sweep dir. The first record stays, and the report says what happened instead of 'failed'."""
    root = tmp_path / "o"
    run = make_run(root, "grpo", 0, 0.5)
    first, again = root / "sweeps" / "2026-01-01_00-00-00", root / "sweeps" / "2026-01-01_01-00-00"
    _write(first / "jobs" / "0.json", {"job": 0, "overrides": ["arm=grpo", "seed=0"], "status": "interrupted",
                                       "exit_code": 143, "error": None, "run_dir": str(run)})
    _write(first / "jobs" / "1.json", {"job": 1, "overrides": ["arm=grpo", "seed=1"], "status": "interrupted",
                                       "exit_code": 143, "error": None, "run_dir": str(root / "runs" / "grpo-x-s1")})
    _write(again / "jobs" / "0.json", {"job": 0, "overrides": ["arm=grpo", "seed=0"], "status": "completed",
                                       "exit_code": 0, "error": None, "run_dir": str(run)})
    rep, md = build_report(root)
    assert [(Path(j["sweep"]).name, j["job"]) for j in rep["failed_jobs"]] == [(first.name, 1)]  # never finished
    assert any(f"{first.name} job 0 (arm=grpo seed=0) ended interrupted; its run {run.name} was completed later"
               in n for n in rep["notes"])


def test_direction_accuracy_shown_when_present(tmp_path):
    root = tmp_path / "o"
    make_run(root, "grpo", 0, 0.5)
    rep, md = build_report(root)
    assert "direction accuracy" not in md.read_text()
    make_run(root, "evi_po", 0, 0.6, direction=0.8)
    rep, md = build_report(root)
    assert _cond(rep, "evi_po")["metrics"]["eval/direction_accuracy"]["mean"] == pytest.approx(0.8)
    assert "direction accuracy" in md.read_text()


def test_pngs_are_valid(basic):
    import matplotlib.image as mpimg

    build_report(basic, out=basic / "elsewhere")
    for name in ("reward_vs_tokens.png", "eval_accuracy_by_relation.png", "budget_use.png"):
        p = basic / "elsewhere" / name
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600 and img.shape[2] in (3, 4)
    assert not (basic / "report").exists()


def test_cli_stdout_and_empty_dir(basic, tmp_path, capsys):
    assert main([str(basic)]) == 0
    out = capsys.readouterr().out
    assert str(basic / "report" / "report.md") in out and "papo" in out and "0.600" in out
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(empty) in err and "run_manifest.json" in err and "fix:" in err
    assert main([str(tmp_path / "missing")]) == 2


def test_torch_free_subprocess(basic):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness.report", str(basic)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert heavy_imports(proc.stderr) == []
    assert not any(line.rsplit("|", 1)[-1].strip().split(".")[0] == "datasets"
                   for line in proc.stderr.splitlines() if "|" in line)
    assert "report.md" in proc.stdout


def test_start_phases_per_run_and_time_to_first_step_per_condition(tmp_path):
    """The cold start is visible: the time to the first optimizer step of the process that finished each run (a
    condition's mean over seeds), and every start of each run (a resumed run has several)."""
    root = tmp_path / "out"
    firsts = {0: [14.9, 3.25], 1: [12.0]}  # seed 0 was resumed once
    for seed, seconds in firsts.items():
        run = make_run(root, "grpo", seed, 0.5 + 0.1 * seed, before=0.4)
        m = json.loads((run / "run_manifest.json").read_text())
        m["start_phases"] = [{"pid": 1 + i, "started_at": "t", "seconds": {"imports": 3.0, "first_step": s}}
                             for i, s in enumerate(seconds)]
        _write(run / "run_manifest.json", m)
        comp = json.loads((run / "completion.json").read_text())
        comp["start_phases_s"] = {"imports": 3.0, "first_step": seconds[-1]}
        _write(run / "completion.json", comp)
    rep, md = build_report(root)
    g = _cond(rep, "grpo")
    assert g["metrics"]["perf/first_step_s"]["mean"] == pytest.approx((3.25 + 12.0) / 2)
    assert [r["starts"][-1]["seconds"]["first_step"] for r in g["runs"]] == [3.25, 12.0]
    text = md.read_text()
    assert "time to first step (s)" in text
    assert "; 2 starts, first step at 14.9 s, 3.2 s" in text and "; 1 start, first step at 12.0 s" in text


def test_cells_never_print_an_interval_outside_the_range_nor_one_from_two_seeds():
    """`MISSING 0.500 ± 6.353` (two seeds, t with 1 df) and `85.6% ± 52.3%` were what a researcher saw."""
    from harness.report.render import cell
    from harness.report.stats import mean_ci

    assert cell("eval/MISSING/accuracy", mean_ci([0.0, 1.0])) == "0.500 (n=2: too few seeds for an interval)"
    assert cell("budget/fraction", mean_ci([0.5, 0.9])) == "70.0% (n=2: too few seeds for an interval)"
    wide = cell("eval/accuracy", mean_ci([0.1, 0.9, 1.0]))  # mean 0.667, t interval -0.57 .. 1.90
    assert wide == "0.667 [0.000, 1.000] (n=3, t interval cut at the range)", wide
    assert cell("eval/accuracy_change", mean_ci([-0.9, 0.8, 0.9])).endswith("(n=3, t interval cut at the range)")
    assert cell("eval/accuracy", mean_ci([0.5, 0.6, 0.7])) == "0.600 ± 0.248 (n=3)"  # inside [0, 1]: as before
    assert cell("perf/wall_time_s", mean_ci([1.0, 30.0, 2.0])).startswith("11.0 ± ")  # unbounded: a plain interval


def test_accuracy_vs_tokens_curve_and_diagnostic_panels(tmp_path):
    """The curve of a run: eval before at 0 tokens, each periodic eval at the tokens before its step, the final eval
    at all the run's tokens; a `python -m harness.eval ... policy=checkpoint-N` artifact (no step) is not a point.
    Diagnostics: the shared series for every RL condition, an arm's own terms for that arm only."""
    root = tmp_path / "out"
    rows = lambda arm: [{"step": k, "reward": 0.1 * k, "loss": 0.5, "kl": 0.01 * k, "entropy": 1.0,  # noqa: E731
                         **({"loss/papo": -0.02, "papo/entropy_masked": 1.5} if arm == "papo" else {}),
                         "budget/tokens_used_rank0": 30 * k, "eval_accuracy": 0.5} for k in range(1, 11)]
    for s in range(3):
        make_run(root, "grpo", s, 0.6, before=0.4, periodic={4: (200, 0.45), 8: (400, 0.55)}, metrics_rows=rows("grpo"))
        make_run(root, "papo", s, 0.7, before=0.4, knobs={"gamma": 0.02}, periodic={5: (250, 0.5)},
                 metrics_rows=rows("papo"))
    manual = next((root / "runs").glob("grpo-*-s0-*")) / "eval" / "test-checkpoint-2.json"
    _write(manual, {"split": "test", "label": "checkpoint-2", **_eval(0.9, None, None, 0.0)})  # no step: not a point
    from harness.report.runs import read_run

    run = read_run(next((root / "runs").glob("grpo-*-s0-*")))
    assert [(p["tokens"], p["accuracy"], p["label"]) for p in run.eval_curve] == [
        (0.0, 0.4, "before"), (200.0, 0.45, "test-checkpoint-4.json"), (400.0, 0.55, "test-checkpoint-8.json"),
        (500.0, 0.6, "final")]
    assert set(run.diagnostics) == {"reward", "loss", "kl", "entropy"}
    assert run.diagnostics["kl"][10] == pytest.approx(0.1)
    rep, md = build_report(root)
    plots = rep["groups"][0]["plots"]
    assert plots["accuracy_vs_tokens"]["points_per_run"] == {"grpo": 4, "papo": 3}
    assert plots["accuracy_vs_tokens"]["init_accuracy"] == pytest.approx(0.4)
    panels = plots["diagnostics"]["panels"]
    assert list(panels)[:4] == ["reward", "loss", "kl", "entropy"]
    assert panels["loss/papo"] == ["papo"] and panels["papo/entropy_masked"] == ["papo"]
    assert panels["reward"] == ["grpo", "papo"]
    text = md.read_text()
    for name in ("accuracy_vs_tokens.png", "diagnostics.png"):
        assert f"({name})" in text and (root / "report" / name).read_bytes()[:4] == b"\x89PNG"


def test_a_distilled_condition_draws_its_teachers_accuracy_and_names_each_teacher(tmp_path):
    """opd runs record their teacher (identity.teacher: run, arm, final eval): the curve gets a reference line at
    the teachers' mean final accuracy on the report's split, and each seed's line in Conditions names its teacher."""
    root = tmp_path / "out"
    for s, t_acc in enumerate((0.9, 0.8)):
        g = make_run(root, "grpo", s, t_acc, before=0.4)
        make_run(root, "opd", s, 0.85, before=0.4, teacher={
            "spec": "grpo", "run_name": g.name, "arm": "grpo", "path": str(g / "final_policy"),
            "weights_sha256": "w" * 64, "semantic_sha256": "x" * 64, "eval_accuracy": t_acc, "eval_split": "test"})
    other = make_run(root, "opd", 0, 0.5, before=0.4, knobs={"beta": 0.5}, teacher={
        "spec": "/some/policy", "path": "/some/policy", "weights_sha256": "v" * 64, "eval_accuracy": 0.7,
        "eval_split": "val"})  # evaluated on another split: named, not drawn
    rep, md = build_report(root)
    plot = rep["groups"][0]["plots"]["accuracy_vs_tokens"]
    (label, acc), = plot["teacher_accuracy"].items()  # the condition of beta 0.5 has no teacher on `test`
    assert label.startswith("opd") and "beta=0.5" not in label and acc == pytest.approx(0.85)
    text = md.read_text()
    for s, t_acc in enumerate((0.9, 0.8)):
        g = next((root / "runs").glob(f"grpo-*-s{s}-*"))
        assert f"teacher `{g.name}` (grpo, accuracy {t_acc:.3f} on test)" in text
    assert "teacher `/some/policy` (a policy directory, accuracy 0.700 on val)" in text and other.name in text


def test_without_periodic_evals_the_curve_has_its_two_ends(basic):
    rep, _ = build_report(basic)
    assert rep["groups"][0]["plots"]["accuracy_vs_tokens"]["points_per_run"] == {"grpo": 2, "papo": 2}
    assert rep["groups"][0]["plots"]["diagnostics"]["file"] is None  # no metrics.jsonl in these fixtures


def test_a_folder_of_links_to_run_dirs_picks_those_runs(tmp_path):
    """`python -m harness.report PICK` where PICK holds links to some runs of an output_root (e.g. grpo and opd)."""
    from harness.report.runs import MANIFEST, find_run_dirs

    for name in ("grpo-a", "opd-b", "sft-c"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / MANIFEST).write_text("{}")
    pick = tmp_path / "pick"
    pick.mkdir()
    for name in ("grpo-a", "opd-b"):
        (pick / name).symlink_to(tmp_path / "runs" / name, target_is_directory=True)
    runs, sweeps = find_run_dirs(pick)
    assert [r.name for r in runs] == ["grpo-a", "opd-b"] and sweeps == []


def test_a_condition_on_the_built_in_reward_is_labelled_so(tmp_path):
    """grpo on the built-in reward against grpo on a reward file: the built-in one was labelled
    `grpo (reward._target_=–)` (its reward._target_ is left out of the run's semantic fields at its old default)."""
    root = tmp_path / "o"
    import shutil

    builtin = make_run(root, "grpo", 0, 0.5)
    mine = shutil.copytree(builtin, builtin.with_name(builtin.name + "-mine"))
    m = json.loads((mine / "run_manifest.json").read_text())
    m["run_name"] = mine.name
    m["plan"]["config"]["reward"] = {"_target_": "/home/me/rewards/my_reward.py:colour"}
    _write(mine / "run_manifest.json", m)
    rep, md = build_report(root)
    labels = {c["label"]: c["fields"] for c in rep["groups"][0]["conditions"]}
    assert sorted(labels) == ["grpo (reward._target_=built-in)", "grpo (reward._target_=my_reward.py:colour)"]
    assert labels["grpo (reward._target_=built-in)"] == {"reward._target_": "harness.rewards:answer_reward"}
    assert "–" not in "".join(labels)


def test_wall_times_of_runs_that_ran_at_the_same_time_carry_a_caveat(tmp_path):
    """Two runs whose wall-clock intervals overlap slowed each other (2 cores): the report says so under the
    wall-time column instead of comparing their seconds as if measured alike."""
    root = tmp_path / "o"
    runs = [make_run(root, "grpo", s, 0.5, wall=100.0) for s in (0, 1, 2)]
    ends = ["2026-12-05T10:01:40+00:00", "2026-12-05T10:02:30+00:00", "2026-12-05T11:00:00+00:00"]  # 0 and 1 overlap
    for run, end in zip(runs, ends):
        comp = json.loads((run / "completion.json").read_text())
        _write(run / "completion.json", {**comp, "completed_at": end})
    rep, md = build_report(root)
    note = rep["groups"][0]["wall_time_note"]
    assert note.startswith("Wall time compares runs only when they ran under the same machine load")
    assert "2 of these 3 runs ran at the same time as another run of this group" in note
    assert note in md.read_text()


def test_two_versions_of_a_reward_file_are_two_conditions(tmp_path):
    """A reward file edited between two runs of the same config and seed (two run names: the code digest) was one
    condition with a duplicate seed; the reward's code digest now sets them apart, and the label says which."""
    import shutil

    root = tmp_path / "o"
    first = make_run(root, "grpo", 0, 0.5)
    second = shutil.copytree(first, first.with_name(first.name + "-v2"))
    for run, code in ((first, "a" * 64), (second, "b" * 64)):
        m = json.loads((run / "run_manifest.json").read_text())
        m["run_name"] = run.name
        m["plan"]["config"]["reward"] = {"_target_": "/home/me/my_reward.py:colour"}
        m["plan"]["identity"]["reward"] = {"code_sha256": code}
        _write(run / "run_manifest.json", m)
    rep, _ = build_report(root)
    conds = rep["groups"][0]["conditions"]
    assert sorted(c["label"] for c in conds) == ["grpo (reward.code_sha256=aaaaaaaa)", "grpo (reward.code_sha256=bbbbbbbb)"]
    assert all(not c["duplicates"] for c in conds)

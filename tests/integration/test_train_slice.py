"""The training slice end to end, with the real TRL trainers on the tiny local VLM (no mocks).

One `python -m harness debug=tiny` run (GRPO, with its SFT warm start run first) is shared by
the tests of this module; each checks one invariant of the run directory.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.accounting import read_rows
from harness.checkpoint import CHECKPOINT_MANIFEST, complete_checkpoints
from harness.verify import verify
from tests.conftest import run_harness


def _run_dir(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    proc = run_harness("debug=tiny", f"output_root={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, _run_dir(out, "grpo"), proc


def test_completion_matches_the_ledger(grpo_run):
    _, run, _ = grpo_run
    comp = json.loads((run / "completion.json").read_text())
    ledger = list(read_rows(run / "ledgers/rank-0.jsonl"))
    assert comp["status"] == "completed" and comp["optimizer_steps"] >= 1
    assert sum(r["tokens"] for r in ledger) == comp["realized_completion_tokens"] <= comp["completion_token_ceiling"]
    assert len(ledger) == comp["realized_completion_count"] == comp["optimizer_steps"] * 32
    ids = [r["completion_id"] for r in ledger]
    assert len(set(ids)) == len(ids)
    assert all(r["tokens"] >= 1 for r in ledger)
    trace = list(read_rows(run / "traces/rank-0.jsonl"))
    assert [t["completion_id"] for t in trace] == ids
    assert all(t["provenance"]["semantic_sha256"] == comp["identity"]["semantic_sha256"] for t in trace)
    assert comp["unique_prompt_groups"] == comp["optimizer_steps"] * 4


def test_budget_rule_holds_step_by_step(grpo_run):
    _, run, _ = grpo_run
    comp = json.loads((run / "completion.json").read_text())
    per_step = Counter()
    for r in read_rows(run / "ledgers/rank-0.jsonl"):
        per_step[r["step"]] += r["tokens"]
    used, bound, ceiling = 0, 4 * 8 * 16, comp["completion_token_ceiling"]
    steps = sorted(per_step)
    for i, s in enumerate(steps):
        used += per_step[s]
        if i < len(steps) - 1:
            assert used + bound <= ceiling, f"the run continued after step {s} although the next could overflow"
    if comp["stopped_by"] == "budget":
        assert used + bound > ceiling


def test_checkpoints_published_and_retained(grpo_run):
    _, run, _ = grpo_run
    complete = complete_checkpoints(run)
    assert complete, "no published checkpoint"
    final = json.loads((complete[-1] / CHECKPOINT_MANIFEST).read_text())
    comp = json.loads((run / "completion.json").read_text())
    assert final["permanent"] and final["step"] == comp["optimizer_steps"]
    assert final["frontier"]["rank-0"]["ledger"]["rows"] == comp["realized_completion_count"]
    assert set(final["state_digests"]["rank-0"]) == {"params", "adapters", "optimizer", "scheduler", "rng"}
    non_permanent = [p for p in complete if not json.loads((p / CHECKPOINT_MANIFEST).read_text())["permanent"]]
    assert len(non_permanent) <= 2  # debug=tiny keeps the latest 2 besides the permanent final


def test_final_policy_loads_back_with_the_model_class(grpo_run):
    """final_policy/ reloads with the model class to exactly the trained parameters (digest of the final checkpoint)."""
    from transformers import AutoModelForImageTextToText

    from harness.statedigest import params_digest

    _, run, _ = grpo_run
    model = AutoModelForImageTextToText.from_pretrained(run / "final_policy")
    final = json.loads((complete_checkpoints(run)[-1] / CHECKPOINT_MANIFEST).read_text())
    assert params_digest(model) == final["state_digests"]["rank-0"]["params"]
    policy = json.loads((run / "final_policy" / "harness_policy.json").read_text())
    assert policy["tuning"] == "full" and "model.safetensors" in policy["files"]


def test_eval_before_and_after_with_identity(grpo_run):
    _, run, _ = grpo_run
    comp = json.loads((run / "completion.json").read_text())
    for name in ("test-before.json", "test.json"):
        ev = json.loads((run / "eval" / name).read_text())
        assert ev["identity"]["semantic_sha256"] == comp["identity"]["semantic_sha256"]
        assert set(ev["per_relation"]) == {"FULL", "CONTROL", "MISSING", "SUBSTITUTE"}
        assert ev["n"] == 64
    assert comp["eval_before"]["accuracy"] is not None and comp["eval_after"]["accuracy"] is not None


def test_metrics_one_row_per_logged_step(grpo_run):
    _, run, _ = grpo_run
    steps = [r["step"] for r in read_rows(run / "metrics.jsonl")]
    comp = json.loads((run / "completion.json").read_text())
    assert steps == list(range(1, comp["optimizer_steps"] + 1))


def test_parent_sft_run_is_recorded_and_complete(grpo_run):
    out, run, _ = grpo_run
    manifest = json.loads((run / "run_manifest.json").read_text())
    parent = Path(manifest["parent"]["run_dir"])
    assert parent == _run_dir(out, "sft")
    assert json.loads((parent / "run_manifest.json").read_text())["status"] == "completed"
    assert verify(parent) == []


def test_verify_passes_and_rerun_leaves_the_run_unchanged(grpo_run):
    out, run, _ = grpo_run
    assert verify(run) == []
    proc = run_harness(str(run), module="harness.verify")
    assert proc.returncode == 0, proc.stderr
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != "run.lock"}
    again = run_harness("debug=tiny", f"output_root={out}", timeout=300)
    assert again.returncode == 0 and "already complete" in again.stderr
    after = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != "run.lock"}
    assert before == after


def test_console_shows_progress_lines_and_summary(grpo_run):
    _, _, proc = grpo_run
    assert "[harness] step 1/" in proc.stderr and "tokens" in proc.stderr
    assert "before -> after" in proc.stderr and "Traceback" not in proc.stderr


def test_sft_loss_tokens_match_the_collator_and_the_cap(tmp_path):
    proc = run_harness("arm=sft", "debug=tiny", "budget.max_loss_tokens=700", f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run_dir(tmp_path, "sft")
    comp = json.loads((run / "completion.json").read_text())
    # counted up front (collator, row by row) == counted in compute_loss (what was trained on) <= cap
    assert comp["realized_loss_tokens"] == comp["planned_loss_tokens"] <= 700 == comp["loss_token_ceiling"]
    assert comp["planned_loss_tokens"] > 700 - 20  # the longest prefix: one more row would not fit
    assert verify(run) == []


def test_lora_policy_is_an_adapter_that_loads_with_peft(tmp_path):
    """tuning=lora saves a PEFT adapter as final_policy/ (arm=sft keeps it quick; the warning says why
    LoRA on a random base is not the default)."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    proc = run_harness("arm=sft", "debug=tiny", "model.tuning=lora", "budget.max_loss_tokens=400",
                       f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "LoRA on a random base" in proc.stderr
    run = _run_dir(tmp_path, "sft")
    policy = json.loads((run / "final_policy" / "harness_policy.json").read_text())
    assert policy["tuning"] == "lora" and "adapter_config.json" in policy["files"]
    base = AutoModelForImageTextToText.from_pretrained(policy["base_path"])
    model = PeftModel.from_pretrained(base, run / "final_policy")
    assert any("lora_" in n for n, _ in model.named_parameters())
    assert verify(run) == []


def test_text_only_model_trains(tmp_path):
    proc = run_harness("arm=sft", "model=tiny_lm", "debug=tiny", "budget.max_loss_tokens=400",
                       f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run_dir(tmp_path, "sft")
    comp = json.loads((run / "completion.json").read_text())
    assert comp["realized_loss_tokens"] == comp["planned_loss_tokens"] <= 400
    assert verify(run) == []

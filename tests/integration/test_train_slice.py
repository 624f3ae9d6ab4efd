"""The training slice end to end, with the real TRL trainers on the tiny local VLM (no mocks).

One `python -m harness debug=tiny` run (GRPO, with its SFT warm start run first) is shared by
the tests of this module; each checks one invariant of the run directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, complete_checkpoints
from harness.verify import verify
from tests.conftest import run_harness


def _run_dir(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


@pytest.fixture(scope="module")
def grpo_run(tiny, tmp_path_factory):
    """(output_root, the grpo run dir): a copy of this session's debug=tiny pipeline (tests/conftest.py)."""
    out = tiny.copy(tmp_path_factory.mktemp("grpo") / "out")
    return out, _run_dir(out, "grpo"), tiny


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
    # debug=tiny saves every 2 steps (non-permanent below the final step); keep_last=2 keeps the latest 2 of those
    # besides the permanent final one (which does not count against it)
    assert [p.name for p in non_permanent] == [f"checkpoint-{s}" for s in range(2, comp["optimizer_steps"], 2)][-2:]


def test_final_policy_loads_back_with_the_model_class(grpo_run):
    """final_policy/ reloads with the model class to exactly the trained parameters (digest of the final checkpoint)."""
    from transformers import AutoModelForImageTextToText

    from harness.accounting.statedigest import params_digest

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
    out, run, tiny = grpo_run
    manifest = json.loads((run / "run_manifest.json").read_text())
    parent = Path(manifest["parent"]["run_dir"])
    assert parent == tiny.sft  # the warm start under the output_root the run trained in (`out` is a copy of it)
    assert json.loads((parent / "run_manifest.json").read_text())["status"] == "completed"
    assert verify(parent) == []


def test_verify_passes_and_rerun_leaves_the_run_unchanged(grpo_run):
    out, run, _ = grpo_run
    assert verify(run) == []
    proc = run_harness(str(run), module="harness.verify")
    assert proc.returncode == 0, proc.stderr
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != "run.lock"}
    again = run_harness("debug=tiny", f"output_root={out}", timeout=300)  # (the copy: its identity is unchanged)
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


@pytest.mark.slow  # ~20 s; a text-only model's GRPO step: tests/unit/test_models_tiny.py
def test_text_only_model_trains(tmp_path):
    proc = run_harness("arm=sft", "model=tiny_lm", "debug=tiny", "budget.max_loss_tokens=400",
                       f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = _run_dir(tmp_path, "sft")
    comp = json.loads((run / "completion.json").read_text())
    assert comp["realized_loss_tokens"] == comp["planned_loss_tokens"] <= 400
    assert verify(run) == []


# --- python -m harness.eval on the same run


def _provenance_bytes(run: Path) -> dict:
    keep = ("run_manifest.json", "completion.json", "ledgers", "traces", "checkpoints", "final_policy", "metrics.jsonl")
    return {p: p.read_bytes() for p in run.rglob("*")
            if p.is_file() and p.relative_to(run).parts[0] in keep}


def test_eval_cli_reuses_the_training_eval_and_refuses_other_settings(grpo_run):
    _, run, _ = grpo_run
    test_json = run / "eval" / "test.json"
    mtime = test_json.stat().st_mtime_ns
    same = run_harness(str(run), module="harness.eval", timeout=120)
    assert same.returncode == 0, same.stderr
    assert "already evaluated" in same.stdout and test_json.stat().st_mtime_ns == mtime
    other = run_harness(str(run), "max_items=16", module="harness.eval", timeout=120)
    assert other.returncode == 2 and "--force" in other.stderr and "max_items" in other.stderr
    assert test_json.stat().st_mtime_ns == mtime


def test_eval_cli_refuses_bad_input_before_importing_torch(grpo_run):
    from tests.conftest import heavy_imports

    _, run, _ = grpo_run
    for args, field in ((["split=nope"], "split"), (["policy=checkpoint-999"], "policy"), (["policy=best"], "policy"),
                        (["max_items=0"], "max_items"), (["splt=val"], "splt")):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness.eval", str(run), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert f"- {field} = " in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
        assert heavy_imports(proc.stderr) == [], args
        assert " hydra" not in proc.stderr, args  # the eval CLI composes nothing (it used to load the ConfigStore)
    proc = run_harness(str(run.parent), module="harness.eval", timeout=60)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr


def test_eval_cli_on_a_checkpoint_writes_a_derived_artifact_only(grpo_run):
    from harness.accounting.weights import weights_digest

    _, run, _ = grpo_run
    ckpt = complete_checkpoints(run)[0]
    before = _provenance_bytes(run)
    proc = run_harness(str(run), f"policy={ckpt.name}", "split=val", "max_items=all", module="harness.eval",
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = run / "eval" / f"val-{ckpt.name}.json"
    ev = json.loads(art.read_text())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert ev["identity"]["semantic_sha256"] == manifest["identity"]["semantic_sha256"]
    assert ev["identity"]["data"]["content_sha256"] == manifest["identity"]["data"]["content_sha256"]
    assert ev["policy_sha256"] == weights_digest(ckpt) and ev["label"] == ckpt.name and ev["max_items"] is None
    val_rows = (Path(manifest["identity"]["data"]["root"]) / "records" / "val.jsonl").read_text().splitlines()
    assert ev["n"] == len(val_rows) == sum(b["n"] for b in ev["per_relation"].values())
    preds = (run / "eval" / f"val-{ckpt.name}.predictions.jsonl").read_text().splitlines()
    assert len(preds) == ev["n"]
    rows = [json.loads(x) for x in preds]  # the summary is the mean of the per-view records, per relation too
    assert ev["direction_accuracy"] == pytest.approx(sum(r["direction_correct"] for r in rows) / len(rows))
    full = [r for r in rows if r["relation"] == "FULL"]
    assert ev["per_relation"]["FULL"]["direction_accuracy"] == pytest.approx(
        sum(r["direction_correct"] for r in full) / len(full))
    assert ev["accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
    assert _provenance_bytes(run) == before  # the run's provenance is never rewritten
    assert verify(run) == []


def test_eval_cli_with_force_reproduces_the_training_eval(grpo_run):
    """Greedy eval is deterministic: re-evaluating the final policy gives the numbers training recorded."""
    _, run, _ = grpo_run
    recorded = json.loads((run / "eval" / "test.json").read_text())
    proc = run_harness(str(run), "--force", module="harness.eval", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((run / "eval" / "test.json").read_text())
    keys = ("n", "accuracy", "abstention_rate", "format_valid", "direction_accuracy", "per_relation", "policy_sha256")
    assert {k: again[k] for k in keys} == {k: recorded[k] for k in keys}
    assert again["evaluated_by"]["command"] == "harness.eval"


def test_direction_scores_match_an_unbatched_computation(grpo_run):
    """The batched, left-padded candidate scoring equals scoring each (view, candidate) alone, unpadded."""
    import torch
    from PIL import Image

    from harness.rewards.answers import candidate_tokens
    from harness.rewards.answers import format_answer
    from harness.data import load_split
    from harness.eval.greedy import direction_scores, eval_rows, prompt_messages
    from harness.policy import load_policy
    from harness.data.trainsets import group_candidates, view_links

    _, run, _ = grpo_run
    manifest = json.loads((run / "run_manifest.json").read_text())
    root = Path(manifest["identity"]["data"]["root"])
    rows = eval_rows(load_split(root, "test"), 8)
    model, proc = load_policy(run / "final_policy", trainable=False)
    batched = direction_scores(model, proc, root, rows, is_vlm=True, batch_size=64)
    tok = proc.tokenizer
    links = group_candidates(rows)
    for row, (scores, target) in zip(rows, batched):
        cands = json.loads(view_links(root, row, links))["candidates"]
        assert scores is not None and len(scores) == len(cands) >= 2
        prefix, conts, n_scored = candidate_tokens([tok(format_answer(c), add_special_tokens=False)["input_ids"]
                                                    for c in cands])
        text = proc.apply_chat_template(prompt_messages(row, True), add_generation_prompt=True, tokenize=False)
        enc = proc(text=[text], images=[[Image.open(root / row["images"][0]["path"]).convert("RGB")]],
                   return_tensors="pt")
        for c, (cont, n) in enumerate(zip(conts, n_scored)):
            ids = torch.cat([enc["input_ids"], torch.tensor([prefix + cont])], dim=1)
            tt = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(prefix + cont), dtype=torch.long)], dim=1)
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=enc["pixel_values"],
                               image_grid_thw=enc["image_grid_thw"], mm_token_type_ids=tt).logits[0].float()
            P = enc["input_ids"].shape[1] + len(prefix)
            logp = torch.log_softmax(logits[P - 1:P - 1 + n], -1).gather(-1, torch.tensor(cont[:n])[:, None])
            assert abs(float(logp.mean()) - scores[c]) < 1e-4, (row["group_id"], c)
        assert target == json.loads(view_links(root, row, links))["target_index"]


def test_eval_before_is_the_warm_starts_final_eval_reused_and_equals_a_recomputation(grpo_run):
    """The GRPO run's init is the SFT warm start's final policy, which the SFT run has just evaluated with the
    same settings: its eval is reused (recorded as such, with the weights digest), and it is what evaluating
    those weights again gives (eval CLI --force on the warm start)."""
    _, run, proc = grpo_run
    comp = json.loads((run / "completion.json").read_text())
    parent = Path(comp["parent"]["run_dir"])
    reused = json.loads((run / "eval" / "test-before.json").read_text())
    assert reused["reused_from"]["artifact"] == str(parent / "eval" / "test.json")
    assert reused["policy_sha256"] == reused["reused_from"]["policy_sha256"] == comp["eval_before"]["policy_sha256"]
    assert comp["eval_before"]["reused_from"] == reused["reused_from"]
    assert reused["label"] == "before" and reused["identity"]["semantic_sha256"] == comp["identity"]["semantic_sha256"]
    assert (run / "eval/test-before.predictions.jsonl").read_bytes() == \
        (parent / "eval/test.predictions.jsonl").read_bytes()
    assert "(the SFT warm start's final eval of the same weights" in proc.stderr
    again = run_harness(str(parent), "--force", module="harness.eval", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    fresh = json.loads((parent / "eval" / "test.json").read_text())
    keys = ("n", "accuracy", "abstention_rate", "format_valid", "direction_accuracy", "per_relation", "policy_sha256")
    assert {k: fresh[k] for k in keys} == {k: reused[k] for k in keys}
    assert verify(run) == [] and verify(parent) == []


def test_completion_records_phase_times_and_the_summary_shows_them(grpo_run):
    _, run, proc = grpo_run
    comp = json.loads((run / "completion.json").read_text())
    phases = comp["phases_s"]
    assert list(phases) == ["parent", "imports", "data", "model", "eval_before", "train", "eval_after", "finalize"]
    assert all(v >= 0 for v in phases.values()) and phases["parent"] > 0 and phases["train"] > 0
    assert sum(phases.values()) - phases["parent"] - phases["imports"] <= comp["wall_time_s"] + 0.5
    # the reuse is said, and what it cost is a copy, not an eval (no absolute time: "0.0" failed at 0.4 s on a loaded machine)
    assert "phases (s): parent" in proc.stderr and re.search(r"eval before \d+\.\d \(reused\)", proc.stderr)
    assert comp["eval_before"]["reused_from"] and phases["eval_before"] < phases["eval_after"] + 1.0
    assert comp["image_cache"]["hits"] > 0


@pytest.mark.slow  # the default suite stays near 15 min; the reuse itself stays
def test_eval_before_is_recomputed_when_the_warm_start_was_evaluated_otherwise(tmp_path):
    """The SFT warm start was evaluated with another batch size (a setting that changes the padding, so not the
    same evaluation; not semantic, so the same warm start): the next GRPO run evaluates its init itself."""
    import shutil

    first = run_harness("debug=tiny", "budget.max_steps=2", "train.eval_batch_size=16", f"output_root={tmp_path}",
                        timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(_run_dir(tmp_path, "grpo"))
    proc = run_harness("debug=tiny", "budget.max_steps=2", f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running the SFT warm start first" not in proc.stderr  # complete since the first run
    assert "the SFT warm start's eval differs in decoding; evaluating" in proc.stderr
    before = json.loads((_run_dir(tmp_path, "grpo") / "eval" / "test-before.json").read_text())
    assert "reused_from" not in before and before["decoding"]["batch_size"] == 64

"""arm=opd end to end (debug=tiny): a student distills from a finished run's final policy under the token budget,
with the RL arms' accounting; a changed teacher refuses the resume with the field that changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import run_harness

TINY = ("debug=tiny", "arm.init=scratch")  # the student starts from the base model: the teacher is the SFT run


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """(output_root, the SFT run's name): a finished debug=tiny SFT run to distill from."""
    out = tmp_path_factory.mktemp("opd")
    proc = run_harness("arm=sft", "debug=tiny", f"output_root={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (out / "runs").iterdir()
    return out, run.name


@pytest.mark.slow  # ~60 s with its teacher; the default suite: tests/unit/test_opd.py, opd in test_invariance
def test_a_student_distills_under_the_budget_with_the_rl_accounting(teacher):
    out, sft = teacher
    proc = run_harness("arm=opd", *TINY, f"arm.teacher=run:{sft}", f"output_root={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (p for p in (out / "runs").iterdir() if p.name.startswith("opd-"))
    comp = json.loads((run / "completion.json").read_text())
    manifest = json.loads((run / "run_manifest.json").read_text())
    # the budget, not max_steps, stopped it, under its ceiling
    assert comp["stopped_by"] == "budget" and comp["optimizer_steps"] < manifest["plan"]["budget"]["max_steps"]
    assert comp["realized_completion_tokens"] <= comp["completion_token_ceiling"]
    # every sampled completion has one ledger and one trace row; the ledger is what the budget counted
    ledger = list(read_rows(run / "ledgers" / "rank-0.jsonl"))
    trace = list(read_rows(run / "traces" / "rank-0.jsonl"))
    assert sum(r["tokens"] for r in ledger) == comp["realized_completion_tokens"]
    assert [r["completion_id"] for r in ledger] == [r["completion_id"] for r in trace]
    # each trace row carries the divergence the loss trained on, over exactly the completion's sampled tokens
    assert all(r["kl_tokens"] == l["tokens"] and r["kl"] >= 0 and r["kl_sum"] == pytest.approx(r["kl"] * r["kl_tokens"])
               for r, l in zip(trace, ledger))
    assert len(ledger) == 32 * comp["optimizer_steps"]  # one completion per prompt, 32 prompts a step
    assert {r["step"] for r in ledger} == set(range(comp["optimizer_steps"]))
    # the teacher is the SFT run's final policy, recorded with its digest and its run's identity
    t = manifest["plan"]["identity"]["teacher"]
    assert t["run_name"] == sft and t["arm"] == "sft" and t["path"] == str((out / "runs" / sft / "final_policy").resolve())
    assert len(t["weights_sha256"]) == 64
    assert t["weights_sha256"] in (run / "final_policy" / "README.md").read_text()  # the model card names it
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST

    ckpts = sorted((run / "checkpoints").glob(f"checkpoint-*/{CHECKPOINT_MANIFEST}"))
    assert ckpts and all(json.loads(c.read_text())["identity"]["teacher"] == t for c in ckpts)
    rows = list(read_rows(run / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, comp["optimizer_steps"] + 1))
    assert all(r["loss"] > 0 and "reward" in r for r in rows)  # the divergence, and the samples' recorded reward
    # the logged loss of a step is its completions' token-weighted divergence (one micro-batch per step here)
    for r in rows:
        step_rows = [t for t in trace if t["step"] == r["step"] - 1]
        assert r["loss"] == pytest.approx(sum(t["kl_sum"] for t in step_rows) / sum(t["kl_tokens"] for t in step_rows),
                                          rel=1e-3), r["step"]
    assert comp["eval_before"]["n"] == comp["eval_after"]["n"] == 64
    assert verify(run) == []


@pytest.mark.slow  # ~20 s; the teacher in the identity: tests/unit/test_opd.py
def test_a_changed_teacher_refuses_the_resume_with_the_field(teacher, tmp_path):
    out, sft = teacher
    mine = tmp_path / "teacher"
    shutil.copytree(out / "runs" / sft / "final_policy", mine)
    args = ("arm=opd", *TINY, f"arm.teacher={mine}", f"output_root={out}")
    first = run_harness(*args, "budget.stop_after_steps=2", timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]  # paused at step 2
    _perturb_weights(mine)
    again = run_harness(*args, timeout=600)
    assert again.returncode == 4, again.stderr[-3000:]
    assert "identity.teacher.weights_sha256" in again.stderr


def _perturb_weights(policy: Path) -> None:
    from safetensors.torch import load_file, save_file

    (path,) = policy.glob("*.safetensors")
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.slow
def test_smoke_passes_for_opd(teacher):
    """run_mode=smoke: killed after the step past checkpoint N, resumed, audited and continuous."""
    out, sft = teacher
    proc = run_harness("arm=opd", *TINY, f"arm.teacher=run:{sft}", "run_mode=smoke", f"output_root={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "smoke: passed" in proc.stderr


@pytest.mark.slow  # ~60 s; the plan of it: tests/unit/test_opd.py
def test_a_teacher_named_by_its_arm_is_run_first_and_is_the_run_a_sweep_over_arms_shares(tmp_path):
    """arm=opd (the default arm.teacher=grpo) from an empty output_root: the SFT warm start, then the grpo run of the
    same command line, then the student, whose identity (manifest, every checkpoint) names that run's final policy
    by digest. A sweep `-m arm=grpo,opd` afterwards finds both complete: the same grpo run, no second one."""
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
    from harness.accounting.weights import weights_digest

    out = tmp_path / "out"
    proc = run_harness("arm=opd", "debug=tiny", f"output_root={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.name.split("-")[0] for p in (out / "runs").iterdir())
    assert runs == ["grpo", "opd", "sft"], runs
    grpo = next((out / "runs").glob("grpo-*"))
    student = next((out / "runs").glob("opd-*"))
    assert f"running the teacher first ({grpo.name})" in proc.stderr
    assert f"teacher: run {grpo.name} (grpo, eval accuracy" in proc.stderr
    manifest = json.loads((student / "run_manifest.json").read_text())
    t = manifest["identity"]["teacher"]
    assert (t["spec"], t["arm"], t["run_name"]) == ("grpo", "grpo", grpo.name)
    assert t["weights_sha256"] == weights_digest(grpo / "final_policy")
    assert t["eval_accuracy"] == json.loads((grpo / "completion.json").read_text())["eval_after"]["accuracy"]
    ckpts = sorted((student / "checkpoints").glob(f"checkpoint-*/{CHECKPOINT_MANIFEST}"))
    assert ckpts and all(json.loads(c.read_text())["identity"]["teacher"] == t for c in ckpts)
    assert manifest["parent"]["run_name"] == json.loads((grpo / "run_manifest.json").read_text())["parent"]["run_name"]
    assert verify(student) == []

    sweep = run_harness("-m", "arm=grpo,opd", "debug=tiny", f"output_root={out}", timeout=900)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert sweep.stderr.count("is already complete; nothing to do") == 2
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted([grpo.name, student.name,
                                                                        manifest["parent"]["run_name"]])
    (folder,) = (out / "sweeps").iterdir()
    rep = run_harness(str(folder), module="harness.report", timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (folder / "report" / "report.md").read_text()
    assert f"teacher `{grpo.name}` (grpo, accuracy" in text
    report = json.loads((folder / "report" / "report.json").read_text())
    assert set(report["groups"][0]["plots"]["accuracy_vs_tokens"]["teacher_accuracy"]) == {"opd"}

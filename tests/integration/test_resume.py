"""Resume that proves itself: smoke mode, the resume audit against the known silent failure, identity checks, and
bitwise continuity after a SIGKILL (torn and corrupted checkpoints: the damage matrix of
tests/integration/test_faults.py)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.accounting.checkpoint import complete_checkpoints, step_of
from harness.faults import KILL_RUN_ENV, KILL_STEP_ENV
from harness.verify import verify
from tests.conftest import PINNED, REPO, logged_values, run_harness



def _run_dir(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


def _killed_run(out: Path, *overrides: str, kill_step: int, cache: Path | None = None) -> Path:
    """Run until the end of step `kill_step`, then SIGKILL (as a crash would)."""
    plan = json.loads(run_harness("mode=plan", f"output_root={out}", *overrides).stdout)
    extra = [f"data.cache_dir={cache}/data", f"model.cache_dir={cache}/models"] if cache else []
    proc = run_harness(f"output_root={out}", *overrides, *extra, timeout=600,
                       env={KILL_RUN_ENV: plan["run_name"], KILL_STEP_ENV: str(kill_step)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    return Path(plan["run_dir"])


# The self-test on an RL arm and on sft (~50 s each). papo's and evi_po's kill -> resume, audited and bitwise, are
# tests/integration/test_arms_papo_evi.py's and test_sigkill_at_a_random_moment_then_resume_is_bitwise_identical's
# (smoke of every arm at once: python -m harness run_mode=smoke; opd's: tests/integration/test_opd_train.py).
@pytest.mark.slow
@pytest.mark.parametrize("arm", ["grpo", "sft"])
def test_smoke_mode_passes(tmp_path, arm):
    proc = run_harness("run_mode=smoke", "debug=tiny", f"arm={arm}", f"output_root={tmp_path}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "smoke: passed" in proc.stderr
    run = next((tmp_path / "smoke" / "runs").glob(f"{arm}-*"))
    audits = [json.loads(p.read_text()) for p in (run / "audits").glob("*.json")]
    assert audits and all(a["status"] == "passed" for a in audits)
    assert all(c["passed"] for a in audits for c in a["components"].values())
    # the resume happened mid-run: weights, optimizer, scheduler and every RNG stream were compared
    assert {"params", "optimizer", "scheduler", "rng.python", "rng.numpy", "rng.torch_cpu"} <= \
        set(audits[0]["components"]), audits[0]["components"]


def _original_format_copy(policy: Path, dst: Path) -> Path:
    """A copy of a full-weights policy saved the way hub checkpoints are (visual.*, model.layers.*)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(policy, dst)
    sd = load_file(policy / "model.safetensors")
    save_file({k.replace("model.language_model.", "model.").replace("model.visual.", "visual."): v
               for k, v in sd.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def sft_policy(tmp_path_factory):
    """A full-weights policy that samples well-formed answers, so GRPO steps change the weights."""
    root = tmp_path_factory.mktemp("sftpolicy")
    sft = run_harness("arm=sft", "budget.max_steps=100", "debug=tiny", "data.eval_max_items=8",
                      f"output_root={root}", timeout=600)
    assert sft.returncode == 0, sft.stderr[-3000:]
    return _run_dir(root, "sft") / "final_policy", root / "cache"


@pytest.mark.slow
def test_audit_catches_the_qwen_vl_full_finetune_key_pitfall_and_the_fix_passes(tmp_path, sft_policy):
    # the policy stored in the hub's key layout, as a real Qwen-VL checkpoint is
    policy, cache = sft_policy
    init = _original_format_copy(policy, tmp_path / "hubformat")
    args = ("debug=tiny", f"arm.init={init}", f"data.cache_dir={cache}/data", f"model.cache_dir={cache}/models")
    run = _killed_run(tmp_path / "rl", *args, kill_step=5)
    # stock Trainer resume: loads 0 of the checkpoint's tensors (strict=False, other key names), says nothing
    stock = run_harness(f"output_root={tmp_path / 'rl'}", *args, env={"HARNESS_STOCK_RESUME": "1"}, timeout=600)
    assert stock.returncode == 6 and "resume audit failed" in stock.stderr and "params" in stock.stderr
    failed = json.loads((run / "audits" / "resume-1-rank-0.json").read_text())
    assert failed["status"] == "failed" and not failed["components"]["params"]["passed"]
    assert failed["components"]["optimizer"]["passed"]  # the step-N optimizer came back: the silent part
    assert not (run / "completion.json").exists()
    # the harness's fix: the same command resumes with every component restored
    fixed = run_harness(f"output_root={tmp_path / 'rl'}", *args, timeout=600)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    passed = json.loads((run / "audits" / "resume-2-rank-0.json").read_text())
    assert passed["status"] == "passed"
    assert verify(run) == []


@pytest.mark.slow
def test_lora_with_a_frozen_reference_adapter_resumes_with_both_adapters_audited(tmp_path, sft_policy):
    """LoRA + beta > 0: TRL keeps the reference policy as a frozen "ref" adapter saved in a subfolder.
    On these pins (transformers 5.24, peft 0.21.2, trl 1.16) the stock loader restores both adapters;
    the audit digests every adapter (frozen ones too), so a loader that restored only one would fail it."""
    from safetensors.torch import load_file

    policy, cache = sft_policy
    args = ("debug=tiny", "model.tuning=lora", "arm.beta=0.04", f"arm.init={policy}",
            f"data.cache_dir={cache}/data", f"model.cache_dir={cache}/models")
    run = _killed_run(tmp_path, *args, kill_step=5)
    ckpt = run / "checkpoints" / "checkpoint-4"
    default, ref = load_file(ckpt / "adapter_model.safetensors"), load_file(ckpt / "ref" / "adapter_model.safetensors")
    assert max(v.abs().max().item() for k, v in default.items() if "lora_B" in k) > 0  # the policy adapter moved
    assert max(v.abs().max().item() for k, v in ref.items() if "lora_B" in k) == 0  # the reference did not
    resumed = run_harness(f"output_root={tmp_path}", *args, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    audit = json.loads((run / "audits" / "resume-1-rank-0.json").read_text())
    assert audit["status"] == "passed" and "adapters" in audit["components"]
    assert verify(run) == []


@pytest.fixture(scope="module")
def killed_after_step_5(tmp_path_factory, tiny):
    """(the session's debug=tiny pipeline, a grpo run dir killed at the end of step 5 from its warm start)."""
    out = tiny.case(tmp_path_factory.mktemp("killed") / "out")
    run = _killed_run(out, "debug=tiny", kill_step=5, cache=tiny.cache_root)
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return tiny, run


@pytest.mark.slow  # the default suite stays near 15 min; damage: test_faults.py
def test_explicit_older_checkpoint_is_refused(killed_after_step_5, tmp_path):
    tiny, run = killed_after_step_5
    out = tiny.case(tmp_path / "out")  # the warm start beside it: the resume trains only grpo
    shutil.copytree(run, out / "runs" / run.name)
    older = out / "runs" / run.name / "checkpoints" / "checkpoint-2"
    proc = run_harness(f"output_root={out}", "debug=tiny", f"resume_from={older}", *tiny.cache, timeout=600)
    assert proc.returncode == 5 and "silently roll the run back" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # the default suite stays near 15 min; a changed dataset stays
def test_changed_model_files_are_refused_with_a_diff(killed_after_step_5, tmp_path):
    tiny, run = killed_after_step_5
    out = tiny.case(tmp_path / "out")  # the warm start beside it: the resume trains only grpo
    shutil.copytree(run, out / "runs" / run.name)
    manifest = out / "runs" / run.name / "run_manifest.json"
    m = json.loads(manifest.read_text())
    m["identity"]["model"]["files_sha256"] = "f" * 64  # the run was made with other model files
    manifest.write_text(json.dumps(m))
    proc = run_harness(f"output_root={out}", "debug=tiny", *tiny.cache, timeout=600)
    assert proc.returncode == 4 and "identity.model.files_sha256" in proc.stderr and "f" * 64 in proc.stderr


def test_a_changed_dataset_is_a_new_run_and_the_old_one_keeps_its_data(tmp_path):
    """A dataset edited in place after a run was killed: the same command starts a new run (the run name carries the
    data's content digest), never a resume onto other data nor a refusal that suggests another seed; the killed run
    is left as it was, and scoring it on the edited data is refused with the content diff."""
    from harness.data import seal_dataset, write_synthetic

    data = write_synthetic(tmp_path / "data", n_base=40, data_seed=3, image_size=56)
    args = ("arm=sft", "debug=tiny", "data=jsonl", f"data.path={data}", "data.eval_split=val")
    run = _killed_run(tmp_path / "out", *args, kill_step=3)
    before = json.loads((run / "run_manifest.json").read_text())
    rec = data / "records" / "train.jsonl"
    lines = rec.read_text().splitlines()
    row = json.loads(lines[0])
    row["question"] = row["question"].replace("What", "Which")
    rec.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    seal_dataset(data, fill_digests=True)
    plan = json.loads(run_harness("mode=plan", f"output_root={tmp_path / 'out'}", *args).stdout)
    assert plan["run_dir"] != str(run) and plan["identity"]["semantic_sha256"] == before["identity"]["semantic_sha256"]
    assert json.loads((run / "run_manifest.json").read_text()) == before  # the killed run is not touched
    ckpt = sorted((run / "checkpoints").glob("checkpoint-*"))[-1]
    proc = run_harness(str(run), f"policy={ckpt.name}", module="harness.eval", timeout=300)
    assert proc.returncode == 4 and "identity.data.content_sha256" in proc.stderr, proc.stderr[-2000:]
    assert "seed" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arm, moment", [("grpo", "random"), ("grpo", "after_final_checkpoint"), ("sft", "random"),
                                         ("evi_po", "random")])
def test_sigkill_at_a_random_moment_then_resume_is_bitwise_identical(tiny, tmp_path, arm, moment):
    """Same command, interrupted by SIGKILL at a random moment after its first checkpoint (or right after
    its final one, while it saves the policy and evaluates) and started again, ends with the same policy
    tensors, ledger and trace (loss-token counts for sft) as the uninterrupted run, and no extra step. It must
    have resumed: the second launch says from which checkpoint and its audit passed with every component (a
    launch that threw the checkpoints away and retrained would be identical too)."""
    from safetensors.torch import load_file

    # the session's debug=tiny pipeline: its caches, its warm start (an RL arm's) and its grpo run as the reference
    args = ["debug=tiny", f"arm={arm}", *tiny.cache]
    rl = arm != "sft"
    if arm == "grpo":
        a = tiny.grpo
    else:
        straight = run_harness(f"output_root={tiny.case(tmp_path / 'a', rl)}", *args, timeout=600, env=PINNED)
        assert straight.returncode == 0, straight.stderr[-3000:]
        a = _run_dir(tmp_path / "a", arm)
    tiny.case(tmp_path / "b", rl)
    steps = json.loads((a / "completion.json").read_text())["optimizer_steps"]
    first = 2  # debug=tiny: a checkpoint every 2 steps
    assert steps > first + 2, f"the run is too short ({steps} steps) for a kill between checkpoints"

    # the moment is drawn from a seed the output prints (HARNESS_TEST_KILL_SEED=<n> draws another, reproducibly)
    seed = f"{os.environ.get('HARNESS_TEST_KILL_SEED', '0')}-{arm}-{moment}"
    rng = random.Random(seed)
    plan = json.loads(run_harness("mode=plan", f"output_root={tmp_path / 'b'}", *args).stdout)
    b = Path(plan["run_dir"])
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, **PINNED}
    proc = subprocess.Popen([sys.executable, "-m", "harness", f"output_root={tmp_path / 'b'}", *args], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = f"checkpoint-{first if moment == 'random' else steps}"
    wait_for = b / "checkpoints" / ckpt / "harness_checkpoint.json"
    deadline = time.time() + 300
    while not wait_for.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if not wait_for.exists():
        proc.kill()
        pytest.fail(f"{ckpt} was not published within 300 s (the run exited with {proc.poll()})")
    delay = rng.uniform(0.0, 1.0) if moment == "random" else 0.0
    print(f"kill seed {seed!r}: SIGKILL {delay:.3f} s after {ckpt} was published")
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, f"the run finished {delay:.2f} s after {ckpt}, before the kill"
    assert not (b / "completion.json").exists()
    killed_at = step_of(complete_checkpoints(b)[-1])
    resumed = run_harness(f"output_root={tmp_path / 'b'}", *args, timeout=600, env=PINNED)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from checkpoint-{killed_at}" in resumed.stderr, resumed.stderr[-3000:]
    audit = json.loads((b / "audits" / "resume-1-rank-0.json").read_text())
    assert audit["status"] == "passed" and audit["checkpoint"] == f"checkpoint-{killed_at}"
    if killed_at < steps:  # a step was still to come: the optimizer, scheduler and every RNG stream came back
        assert {"params", "optimizer", "scheduler", "rng.python", "rng.numpy", "rng.torch_cpu"} <= \
            set(audit["components"]), audit["components"]
    else:
        assert "params" in audit["components"]

    pa, pb = load_file(a / "final_policy" / "model.safetensors"), load_file(b / "final_policy" / "model.safetensors")
    assert pa.keys() == pb.keys() and all((pa[k] == pb[k]).all() for k in pa)
    ca, cb = (json.loads((d / "completion.json").read_text()) for d in (a, b))
    assert cb["optimizer_steps"] == steps
    if arm == "sft":
        assert ca["realized_loss_tokens"] == cb["realized_loss_tokens"] == cb["planned_loss_tokens"]
    else:
        ledger = lambda d: [(r["completion_id"], r["tokens"]) for r in read_rows(d / "ledgers/rank-0.jsonl")]  # noqa: E731
        trace = lambda d: [(r["completion_id"], r["reward"]) for r in read_rows(d / "traces/rank-0.jsonl")]  # noqa: E731
        assert ledger(a) == ledger(b) and trace(a) == trace(b)
    assert logged_values(a) == logged_values(b), "the logged losses and rewards differ from the uninterrupted run"
    assert verify(b) == []

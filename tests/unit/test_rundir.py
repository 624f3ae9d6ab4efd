"""Run dir claim: exclusive lock across processes, resume policies, identity mismatch, atomic writes, verify."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from harness import rundir
from harness.errors import ResumeMismatchError, RunDirLocked, RunDirStateError
from harness.verify import verify
from tests.conftest import REPO, run_harness

HOLDER = textwrap.dedent("""
    import sys, time
    from harness.config.store import register
    from harness.plan import build_plan
    from harness.rundir import claim
    from hydra import compose, initialize_config_dir
    register(with_help=False)
    with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
        cfg = compose(config_name="config", overrides=sys.argv[2:])
    run_dir = claim(build_plan(cfg))
    print("claimed", flush=True)
    time.sleep(120)
""")


def start_holder(tmp_path, *overrides):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO / "conf"), f"output_root={tmp_path}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "claimed", proc.stderr.read()
    return proc


def test_second_claimant_is_refused_naming_the_holder_and_a_killed_holder_does_not_block(plan_of, tmp_path):
    holder = start_holder(tmp_path)
    try:
        plan = plan_of(f"output_root={tmp_path}")
        with pytest.raises(RunDirLocked) as err:
            rundir.claim(plan)
        assert err.value.holder["pid"] == holder.pid
        assert f"pid={holder.pid}" in str(err.value) and "host=" in str(err.value)
        # the CLI says the same, without a traceback
        proc = run_harness(f"output_root={tmp_path}")
        assert proc.returncode == 3 and f"pid={holder.pid}" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with rundir.claim(plan) as run:  # the kernel released the dead holder's lock
        assert run.resumed and json.loads((run.path / rundir.LOCK).read_text())["pid"] == os.getpid()


def test_claim_writes_a_planned_manifest_and_verify_accepts_it(plan_of):
    plan = plan_of()
    with rundir.claim(plan) as run:
        m = json.loads(run.manifest_path.read_text())
        assert m["status"] == "planned" and m["identity"] == plan.identity and m["run_name"] == plan.run_name
        run.set_status("running")
        run.set_status("failed", error="boom")
    assert verify(plan.run_dir) == []
    assert [e["status"] for e in json.loads(run.manifest_path.read_text())["events"]] == ["planned", "running", "failed"]


def test_resume_policies(plan_of, tmp_path):
    with pytest.raises(RunDirStateError, match="nothing to resume"):
        rundir.claim(plan_of("resume=must"))
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())
    rundir.claim(plan_of()).release()
    with pytest.raises(RunDirStateError, match="already exists"):
        rundir.claim(plan_of("resume=never"))
    with rundir.claim(plan_of("resume=must")) as run:
        assert run.resumed


def test_auto_resume_refuses_another_identity_with_a_diff(plan_of):
    plan = plan_of()
    rundir.claim(plan).release()
    m = json.loads((rundir.Path(plan.run_dir) / rundir.MANIFEST).read_text())
    m["identity"]["data"]["spec_sha256"] = "0" * 64  # the data changed since the run was created
    rundir.atomic_write_json(rundir.Path(plan.run_dir) / rundir.MANIFEST, m)
    with pytest.raises(ResumeMismatchError) as err:
        rundir.claim(plan)
    assert [d.field for d in err.value.diffs] == ["identity.data.spec_sha256"]
    assert "0" * 64 in str(err.value)


def test_non_semantic_changes_are_accepted_and_recorded(plan_of):
    rundir.claim(plan_of()).release()
    with rundir.claim(plan_of("logger=tensorboard")) as run:
        changes = run.manifest["resumes"][-1]["config_changes"]
    assert {c["field"] for c in changes} == {"logger.name", "logger.tensorboard"}


def test_interrupted_atomic_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    rundir.atomic_write_json(target, {"v": 1})

    def boom(fd):
        raise KeyboardInterrupt  # interrupted after the bytes were written, before the rename

    monkeypatch.setattr(rundir.os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        rundir.atomic_write_json(target, {"v": 2, "pad": "y" * 100_000})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # the temp file was cleaned up


def test_killed_writer_leaves_the_old_file_intact_and_verify_reports_the_temp(plan_of):
    plan = plan_of()
    rundir.claim(plan).release()
    manifest = rundir.Path(plan.run_dir) / rundir.MANIFEST
    before = manifest.read_bytes()
    code = textwrap.dedent(f"""
        import os, time
        from harness import rundir
        def hang(fd):  # killed after the bytes were written, before the rename
            print("written", flush=True); time.sleep(60)
        rundir.os.fsync = hang
        rundir.atomic_write_json({str(manifest)!r}, {{"status": "completed"}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert manifest.read_bytes() == before
    problems = verify(plan.run_dir)
    assert len(problems) == 1 and "leftover temp file" in problems[0]


def test_verify_lists_every_violation(plan_of):
    plan = plan_of()
    rundir.claim(plan).release()
    path = rundir.Path(plan.run_dir) / rundir.MANIFEST
    m = json.loads(path.read_text())
    m["plan"]["config"]["arm"]["learning_rate"] = 0.5  # tampered after the fact
    m["status"] = "completed"  # no completion.json, last event disagrees
    rundir.atomic_write_json(path, m)
    problems = verify(plan.run_dir)
    text = "\n".join(problems)
    assert "config_sha256" in text and "semantic_sha256" in text
    assert "completion.json is missing" in text and "last event" in text
    proc = run_harness(plan.run_dir, module="harness.verify")
    assert proc.returncode == 1 and f"{len(problems)} violation(s)" in proc.stderr


def test_verify_on_a_non_run_dir(tmp_path):
    assert "is missing" in verify(tmp_path)[0]
    proc = run_harness(str(tmp_path / "nope"), module="harness.verify")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr

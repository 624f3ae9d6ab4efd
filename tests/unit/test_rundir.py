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
    holder = start_holder(tmp_path, "arm=sft")  # no warm start: the CLI below meets the lock at once
    try:
        plan = plan_of(f"output_root={tmp_path}", "arm=sft")
        with pytest.raises(RunDirLocked) as err:
            rundir.claim(plan)
        assert err.value.holder["pid"] == holder.pid
        assert f"pid={holder.pid}" in str(err.value) and "host=" in str(err.value)
        # the CLI says the same, without a traceback
        proc = run_harness(f"output_root={tmp_path}", "arm=sft")
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


@pytest.mark.parametrize("err, words", [
    (PermissionError(13, "Permission denied"), "cannot be written: Permission denied"),
    (OSError(30, "Read-only file system"), "cannot be written: Read-only file system"),
    (OSError(28, "No space left on device"), "cannot be written: No space left on device"),
])
def test_a_directory_that_refuses_the_write_probe_is_named_with_its_field(tmp_path, monkeypatch, err, words):
    """Read-only, permission, full: what the OS says about the probe file, before any work (portable: root
    writes into a chmod-ed directory, so the probe is made to fail as such a directory would)."""
    from harness.errors import ConfigError

    def refuse(*a, **k):
        raise err

    monkeypatch.setattr(rundir.tempfile, "mkstemp", refuse)
    with pytest.raises(ConfigError) as exc:
        rundir.check_writable_dirs({"output_root": str(tmp_path / "out"), "data.cache_dir": str(tmp_path / "c")})
    text = str(exc.value)
    assert f"output_root = '{tmp_path / 'out'}': {words}" in text and "data.cache_dir = " in text
    assert "fix: set output_root to a directory you can write" in text


def test_storage_errors_name_the_owning_field_the_file_and_the_fix(tmp_path):
    from harness.errors import StorageError, storage_error

    dirs = {"output_root": str(tmp_path / "out"), "data.cache_dir": str(tmp_path / "out/cache/data")}
    full = storage_error(OSError(28, "No space left on device", str(tmp_path / "out/cache/data/x.json")), dirs)
    assert isinstance(full, StorageError) and full.exit_code == 9
    assert f"data.cache_dir = '{tmp_path / 'out/cache/data'}': {tmp_path}/out/cache/data/x.json: No space left" \
        in str(full) and "[ENOSPC]" in str(full) and "fix: free space on that filesystem" in str(full)
    ro = storage_error(OSError(30, "Read-only file system", str(tmp_path / "out/runs/r/m.json")), dirs)
    assert "output_root = " in str(ro) and "fix: make that directory writable" in str(ro)
    elsewhere = storage_error(OSError(13, "Permission denied", "/etc/x"), dirs)
    assert "path = '/etc/x'" in str(elsewhere) and "(or set" not in str(elsewhere)
    assert storage_error(FileNotFoundError(2, "No such file or directory", "/x"), dirs) is None  # a bug, not the disk

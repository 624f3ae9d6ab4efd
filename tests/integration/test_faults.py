"""The fault matrix: a crash (SIGKILL) at many points of the default pipeline, damage to a run dir, a full disk,
and every filesystem error on the run dir, caches and output_root.

- SIGKILL (harness.faults, HARNESS_FAULT=<point>:kill) at 14 points from the SFT warm start to the write of
  completion.json: the same command again finishes with a final policy, ledger, trace and logged values identical
  to the uninterrupted run's, verify clean, no lost or duplicated rows (one point, rl.step@3, in the default
  suite; all of them with the slow tests: two launches a point).
- 14 kinds of damage to an interrupted run dir: each is named by verify and by the resume, which falls back to an
  intact checkpoint or refuses with what to do (the resume's decision for every kind in the default suite; the
  whole resumed run for one kind in the default suite and with the slow tests for every state the damage leaves
  once the resume has chosen; and for two kinds found only as the checkpoint loads, the deep check left to the
  loads: HARNESS_FAULT=rl.check_ahead:defer).
- ENOSPC (and other errnos) injected into the atomic writes and the append logs: exit 9 with the field, the file
  and the fix, no traceback, nothing half-written that looks complete (EROFS in the default suite), and the same
  command finishes the run identical to the uninterrupted one once the disk has room (slow; at the points whose
  state no kill leaves).

The uninterrupted run and the warm start the cases copy are the session's `tiny` fixture (tests/conftest.py).
- A file where output_root, a cache or the run dir should be, a directory where run_manifest.json should be, a
  directory that cannot be written: exit 2 or 9 with `field = value: why / fix`, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
from harness.faults import FAULT_ENV, parse
from harness.verify import verify
from tests.conftest import TinyRuns, logged_values, run_dir_of, run_harness

ARGS = list(TinyRuns.ARGS)  # grpo from a 60-step warm start, ~8 steps, a checkpoint every 2, the last 2 kept


@pytest.fixture(scope="module")
def base(tiny) -> TinyRuns:
    """The uninterrupted run every faulted one must equal, and the cache and warm start the faulted ones share
    (this session's debug=tiny pipeline, tests/conftest.py)."""
    return tiny


# --- the fault hook itself


def test_a_malformed_fault_spec_is_refused():
    assert parse("rl.step@3:kill") == ("rl.step", 3, "kill")
    assert parse("append:ledgers/rank-0.jsonl:enospc") == ("append:ledgers/rank-0.jsonl", 1, "enospc")
    for bad in ("rl.stepp:kill", "rl.step@0:kill", "rl.step:explode", "kill", "sft.checkpoint@x:kill"):
        with pytest.raises(ValueError, match=FAULT_ENV):
            parse(bad)


# --- SIGKILL at points of the default pipeline (slow: two launches each)

KILLS = [
    # (point, the case holds the completed warm start)
    ("sft.step@7", False),  # mid warm start (it saves only its final checkpoint: it starts over)
    ("sft.checkpoint", False),  # inside the warm start's final save (files written, not published)
    ("sft.final_policy", False),  # the warm start's final_policy written, not renamed
    ("atomic:completion.json@1", False),  # while the warm start's completion.json is written
    ("rl.start", True),  # the RL run claimed, nothing else done
    ("atomic:test-before.json", True),  # while the eval before is written
    ("rl.step@3", True),  # after an RL step, before its checkpoint
    ("rl.checkpoint@2", True),  # inside the RL save of checkpoint-4
    ("append:ledgers/rank-0.jsonl@70", True),  # mid-row of step 3's ledger
    ("append:metrics.jsonl@5", True),  # mid-row of step 5's metrics
    ("rl.final_policy", True),  # while final_policy is written
    ("atomic:test.json", True),  # during the final eval: its artifact half written
    ("rl.model_card", True),  # after the final eval, final_policy's card still provisional
    ("atomic:completion.json", True),  # while the RL run's completion.json is written
]


# one point in the default suite (a kill between checkpoints, resumed from the last one: ~15 s), every point with slow
KILL_CASES = [pytest.param(p, w, id=p, marks=[] if p == "rl.step@3" else pytest.mark.slow) for p, w in KILLS]


@pytest.mark.parametrize("point, with_parent", KILL_CASES)
def test_sigkill_at_a_point_then_the_same_command_equals_the_uninterrupted_run(base, tmp_path, point, with_parent):
    out = base.case(tmp_path / "out", with_parent)
    killed = base.run(out, fault=f"{point}:kill")
    assert killed.returncode == -signal.SIGKILL, f"the run was not killed at {point}: {killed.stderr[-3000:]}"
    again = base.run(out)
    assert again.returncode == 0, again.stderr[-4000:]
    base.assert_same(out, ("grpo",) if with_parent else ("sft", "grpo"))


@pytest.fixture(scope="module")
def straight_with_evals(base, tmp_path_factory) -> Path:
    """The uninterrupted run with train.eval_steps=2 (an eval at every checkpoint), which every case must equal."""
    straight = base.case(tmp_path_factory.mktemp("evals") / "straight")
    proc = base.run(straight, "train.eval_steps=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return straight


@pytest.mark.slow
@pytest.mark.parametrize("point", ["rl.checkpoint@1", "rl.step@3", "atomic:test-checkpoint-4.json"])
def test_a_periodic_eval_survives_a_kill_as_if_none_happened(base, straight_with_evals, tmp_path, point):
    """train.eval_steps=2 killed inside checkpoint-2's save (its eval's artifact written, the checkpoint not
    published), after step 3 (eval 2 bound, step 3 not saved), or while eval 4's artifact is written: the same
    command again ends with the uninterrupted run's evals (the same weights digests and figures), metrics rows and
    final weights, every eval's checkpoint kept, verify clean."""
    def evals(d: Path) -> dict:  # without the clock and config_sha256 (another output_root: another config)
        out = {}
        for p in (d / "eval").glob("test-checkpoint-*.json"):
            res = {k: v for k, v in json.loads(p.read_text()).items() if k not in ("created_at", "wall_s")}
            out[p.name] = {**res, "identity": {k: v for k, v in res["identity"].items() if k != "config_sha256"}}
        return out

    straight = straight_with_evals
    out = base.case(tmp_path / "out")
    killed = base.run(out, "train.eval_steps=2", fault=f"{point}:kill")
    assert killed.returncode == -signal.SIGKILL, f"the run was not killed at {point}: {killed.stderr[-3000:]}"
    again = base.run(out, "train.eval_steps=2")
    assert again.returncode == 0, again.stderr[-4000:]
    a, b = run_dir_of(straight, "grpo"), run_dir_of(out, "grpo")
    assert verify(b) == [], verify(b)
    assert evals(a) and evals(b) == evals(a)
    assert logged_values(b) == logged_values(a)
    assert (b / "final_policy/model.safetensors").read_bytes() == (a / "final_policy/model.safetensors").read_bytes()
    kept = lambda d: sorted(p.name for p in (d / "checkpoints").glob("checkpoint-*"))  # noqa: E731
    assert kept(b) == kept(a)


# --- damage to an interrupted run dir: verify names it, the resume falls back or refuses


@pytest.fixture(scope="module")
def killed(base, tmp_path_factory) -> Path:
    """A run killed at the end of step 5: checkpoints 2 and 4 retained, step 5's rows past the last frontier."""
    out = base.case(tmp_path_factory.mktemp("killed") / "out")
    proc = base.run(out, fault="rl.step@5:kill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    run = run_dir_of(out, "grpo")
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return out


def _frontier(run: Path, step: int, log: str) -> dict:
    ckpt = json.loads((run / f"checkpoints/checkpoint-{step}" / CHECKPOINT_MANIFEST).read_text())
    return ckpt["frontier"]["rank-0"][log]


def _rows_between_frontiers(run: Path, log: str, rel: str) -> tuple[list[bytes], int]:
    """The log's lines and the index of the first one past checkpoint-2's frontier (bound by checkpoint-4's)."""
    lines = (run / rel).read_bytes().splitlines(keepends=True)
    lo, hi = _frontier(run, 2, log)["rows"], _frontier(run, 4, log)["rows"]
    assert hi - lo >= 2, (lo, hi)  # a duplicate of row lo stays inside checkpoint-4's segment
    return lines, lo


def truncate_safetensors(run: Path) -> tuple[str, str]:
    p = run / "checkpoints/checkpoint-4/model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return "checkpoint-4/model.safetensors: size", "checkpoint-2"


def flip_an_optimizer_byte(run: Path) -> tuple[str, str]:
    p = run / "checkpoints/checkpoint-4/optimizer.pt"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    return "checkpoint-4/optimizer.pt: xxh3 differs", "checkpoint-2"


def garble_the_weights_header(run: Path) -> tuple[str, str]:
    p = run / "checkpoints/checkpoint-4/model.safetensors"
    data = bytearray(p.read_bytes())
    data[8] ^= 0xFF  # the JSON header's first byte: the size stays, a loader fails on it
    p.write_bytes(bytes(data))
    return "checkpoint-4/model.safetensors: xxh3 differs", "checkpoint-2"


def remove_rng_state(run: Path) -> tuple[str, str]:
    (run / "checkpoints/checkpoint-4/rng_state.pth").unlink()
    return "checkpoint-4/rng_state.pth: missing", "checkpoint-2"


def empty_trainer_state(run: Path) -> tuple[str, str]:
    (run / "checkpoints/checkpoint-4/trainer_state.json").write_bytes(b"")
    return "checkpoint-4/trainer_state.json: size 0", "checkpoint-2"


def checkpoint_manifest_of_another_run(run: Path) -> tuple[str, str]:
    other = json.loads(run_harness(*ARGS, "seed=1", "mode=plan", f"output_root={run.parent}").stdout)
    p = run / "checkpoints/checkpoint-4" / CHECKPOINT_MANIFEST
    m = json.loads(p.read_text())
    m["identity"]["semantic_sha256"] = other["identity"]["semantic_sha256"]
    p.write_text(json.dumps(m))
    return "checkpoint-4: harness_checkpoint.json is of another run (identity.semantic_sha256", "checkpoint-2"


def cut_the_ledger_mid_row(run: Path) -> tuple[str, str]:
    lines, i = _rows_between_frontiers(run, "ledger", "ledgers/rank-0.jsonl")
    (run / "ledgers/rank-0.jsonl").write_bytes(b"".join(lines[:i]) + lines[i][: len(lines[i]) // 2])
    return "ledgers/rank-0.jsonl: ", "checkpoint-2"


def delete_a_trace_row(run: Path) -> tuple[str, str]:
    lines, i = _rows_between_frontiers(run, "trace", "traces/rank-0.jsonl")
    (run / "traces/rank-0.jsonl").write_bytes(b"".join(lines[:i] + lines[i + 1:]))
    return "traces/rank-0.jsonl: ", "checkpoint-2"


def duplicate_a_metrics_row(run: Path) -> tuple[str, str]:
    lines, i = _rows_between_frontiers(run, "metrics", "metrics.jsonl")
    (run / "metrics.jsonl").write_bytes(b"".join(lines[: i + 1] + lines[i:]))
    return "metrics.jsonl has duplicate rows", "checkpoint-2"


def corrupt_the_run_manifest(run: Path) -> tuple[str, str]:
    p = run / "run_manifest.json"
    p.write_bytes(p.read_bytes()[:100])
    return "run_manifest.json is not valid JSON", "refused: run_manifest.json is not valid JSON"


def garbage_in_the_lock(run: Path) -> tuple[str, str]:
    (run / "run.lock").write_bytes(b"\x00\xffnot a lock record")
    return "run.lock: holds", "checkpoint-4"


def tear_the_newest_checkpoint(run: Path) -> tuple[str, str]:
    (run / "checkpoints/checkpoint-4" / CHECKPOINT_MANIFEST).unlink()  # as a crash inside its save leaves it
    return "checkpoint-4: no harness_checkpoint.json", "checkpoint-2"


def remove_the_optimizer(run: Path) -> tuple[str, str]:
    (run / "checkpoints/checkpoint-4/optimizer.pt").unlink()
    return "checkpoint-4/optimizer.pt: missing", "checkpoint-2"


def damage_every_checkpoint(run: Path) -> tuple[str, str]:
    for step in (2, 4):
        p = run / f"checkpoints/checkpoint-{step}/model.safetensors"
        data = bytearray(p.read_bytes())
        data[-1] ^= 0xFF
        p.write_bytes(bytes(data))
    return "checkpoint-2/model.safetensors: xxh3 differs", "refused: no checkpoint of"


DAMAGE = [truncate_safetensors, flip_an_optimizer_byte, garble_the_weights_header, remove_rng_state, empty_trainer_state,
          checkpoint_manifest_of_another_run, tear_the_newest_checkpoint, remove_the_optimizer, cut_the_ledger_mid_row,
          delete_a_trace_row, duplicate_a_metrics_row, corrupt_the_run_manifest, garbage_in_the_lock,
          damage_every_checkpoint]


def _damaged_copy(killed: Path, tmp_path: Path, damage) -> tuple[Path, Path, str, str]:
    out = tmp_path / "out"
    shutil.copytree(killed, out)
    run = run_dir_of(out, "grpo")
    assert verify(run) == [], verify(run)  # intact before the damage (step 5's rows past the frontier are fine)
    found, resumes = damage(run)
    return out, run, found, resumes


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_damage_is_named_by_verify_and_decided_by_the_resume(base, killed, tmp_path, damage, monkeypatch):
    """The resume's decision (the claim and the resume stage, in process): the checkpoint it falls back to, or
    its refusal with a fix."""
    from harness.cli import compose_plan
    from harness.errors import RunDirStateError
    from harness.rundir import claim
    from harness import faults
    from harness.run.stages.resume import CheckAhead, find
    from tests.conftest import resume_decision

    out, run, found, resumes = _damaged_copy(killed, tmp_path, damage)
    violations = verify(run)
    assert any(found in v for v in violations), violations
    plan = compose_plan([*ARGS, f"output_root={out}", *base.cache])
    assert plan.run_dir == str(run)

    def aheads():  # the deep check on a thread, as a run takes it: done before find, or left to the loads
        yield None
        yield CheckAhead(run)
        monkeypatch.setenv(FAULT_ENV, "rl.check_ahead:defer")  # read by the thread: set to the test's end
        monkeypatch.setattr(faults, "_seen", {})
        yield CheckAhead(run, fault="rl.check_ahead")

    if resumes.startswith("refused: "):
        for ahead in aheads():
            with pytest.raises(RunDirStateError, match="fix: ") as exc:
                with claim(plan):
                    resume_decision(plan, run, ahead)
            assert resumes.removeprefix("refused: ") in str(exc.value)
        return
    with claim(plan):
        point = find(plan, run)
        for ahead in aheads():  # the same decision
            other = resume_decision(plan, run, ahead)
            assert (other.checkpoint, other.skipped) == (point.checkpoint, point.skipped), ahead
    assert point.checkpoint is not None and point.checkpoint.name == resumes
    if resumes == "checkpoint-2":
        assert [s["checkpoint"] for s in point.skipped] == ["checkpoint-4"]


# The whole resumed run: one kind that refuses in the default suite, the other states a resume meets with the slow
# tests. Damage to one file of checkpoint-4 (truncated weights, a flipped optimizer byte, a garbled header, the RNG
# state gone, an empty trainer state, another run's manifest) leaves the same state once the resume has chosen
# checkpoint-2 instead (so does a torn checkpoint-4, or one without its optimizer): that choice is held for every
# kind above, so one of them (truncated weights) runs on, and two more run on with the deep check left to the loads
# (test_damage_found_as_the_checkpoint_loads_falls_back_the_same).
# Each log's damage (a ledger cut mid-row, a trace row gone, a metrics row twice), a garbled manifest and a garbled
# lock is a state of its own: each runs on.
SAME_AS_TRUNCATED = (flip_an_optimizer_byte, garble_the_weights_header, remove_rng_state, empty_trainer_state,
                     checkpoint_manifest_of_another_run, tear_the_newest_checkpoint, remove_the_optimizer)
E2E = [pytest.param(d, marks=[] if d is damage_every_checkpoint else pytest.mark.slow, id=d.__name__)
       for d in DAMAGE if d not in SAME_AS_TRUNCATED]


@pytest.mark.parametrize("damage", E2E)
def test_the_same_command_on_a_damaged_run_dir_falls_back_or_refuses(base, killed, tmp_path, damage):
    out, run, found, resumes = _damaged_copy(killed, tmp_path, damage)
    proc = base.run(out)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    if resumes.startswith("refused: "):
        assert proc.returncode == 5, proc.stderr[-3000:]
        assert resumes.removeprefix("refused: ") in proc.stderr and "fix: " in proc.stderr
        assert not (run / "completion.json").exists()
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"resuming from {resumes}" in proc.stderr
    if resumes == "checkpoint-2":
        assert "skipping checkpoint checkpoint-4" in proc.stderr
    base.assert_same(out)


@pytest.mark.parametrize("damage", [flip_an_optimizer_byte, garble_the_weights_header])
def test_damage_found_as_the_checkpoint_loads_falls_back_the_same(base, killed, tmp_path, damage):
    """The resume's deep check not done when the resume stage chooses (HARNESS_FAULT=rl.check_ahead:defer, as when
    the files are larger than the data and model stages are long): the run loads the damaged checkpoint, finds the
    damage before its first step (the audit's start; or as a loader fails on it), chooses again and ends identical
    to the uninterrupted run."""
    out, run, found, resumes = _damaged_copy(killed, tmp_path, damage)
    proc = base.run(out, fault="rl.check_ahead:defer")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert "resuming from checkpoint-4 (newest complete checkpoint; the digests of its files are checked as it " \
           "loads)" in proc.stderr
    assert f"checkpoint-4 failed its deep check as it loaded ({found}" in proc.stderr
    assert "skipping checkpoint checkpoint-4" in proc.stderr and f"resuming from {resumes} (" in proc.stderr
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert [s["checkpoint"] for s in manifest["skipped_checkpoints"]] == ["checkpoint-4"]
    base.assert_same(out)


# --- a full disk (and other errnos) in the atomic writes and the append logs

ENOSPC = [
    # (point, the case holds the completed warm start, the same command is run again to the end)
    ("atomic:harness_checkpoint.json@1", False, True),  # the warm start's first checkpoint cannot be published
    ("append:ledgers/rank-0.jsonl@40", True, True),  # mid-row, in RL step 2
    ("append:metrics.jsonl@3", True, False),
    ("atomic:harness_checkpoint.json@2", True, False),  # the RL run's checkpoint-4
    ("atomic:run_manifest.json@4", True, True),  # the manifest's own write
    ("atomic:test.json", True, False),  # the final eval's artifact
    ("atomic:completion.json", True, False),
]
# Run again to the end for three states: a failed warm start, a half row in a log, a failed write of the manifest
# itself. At the other points the failed write leaves no more than a SIGKILL inside the same write leaves (its temp
# file is removed, not half written; the half row is the same): the kill matrix above runs each of those states on
# to the uninterrupted run's result, and the resume of a run whose manifest says "failed" is held by the three.


@pytest.mark.slow  # 26-62 s each with the run again (2026-12-06); test_other_write_errors_name_their_fix: default suite
@pytest.mark.parametrize("point, with_parent, again", ENOSPC, ids=[p for p, _, _ in ENOSPC])
def test_a_full_disk_fails_clearly_and_the_run_resumes_once_there_is_room(base, tmp_path, point, with_parent, again):
    out = base.case(tmp_path / "out", with_parent)
    full = base.run(out, fault=f"{point}:enospc")
    assert full.returncode == 9, full.stderr[-4000:]
    assert "Traceback" not in full.stderr, full.stderr[-4000:]
    assert "StorageError: the filesystem is full" in full.stderr
    assert f"output_root = '{out}': {out}/runs/" in full.stderr and "[ENOSPC]" in full.stderr, full.stderr[-2000:]
    assert "fix: free space on that filesystem" in full.stderr
    failed = run_dir_of(out, "grpo" if with_parent else "sft")
    m = json.loads((failed / "run_manifest.json").read_text())
    assert m["status"] == "failed" and m["error"]["type"] == "OSError", m["status"]
    assert not (failed / "completion.json").exists()
    assert not list(out.rglob(".*.tmp")), "a temp file of the failed write was left behind"
    if not again:
        return
    proc = base.run(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    base.assert_same(out, ("grpo",) if with_parent else ("sft", "grpo"))


@pytest.mark.parametrize("action, words", [("erofs", "make that directory writable"),
                                           pytest.param("eio", "check that disk", marks=pytest.mark.slow)])
def test_other_write_errors_name_their_fix(base, tmp_path, action, words):
    out = base.case(tmp_path / "out")
    proc = base.run(out, fault=f"atomic:run_manifest.json@2:{action}")
    assert proc.returncode == 9 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"[{action.upper()}]" in proc.stderr and f"fix: {words}" in proc.stderr


# --- filesystem errors on output_root, the caches and the run dir, before any work


def test_a_file_where_a_directory_goes_is_named_with_its_field(base, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cases = [([f"output_root={blocker}/out"], 2, f"output_root = '{blocker}/out': {blocker} is a file, not a directory"),
             ([f"output_root={tmp_path}/o", f"data.cache_dir={blocker}"], 2,
              f"data.cache_dir = '{blocker}': it is a file, not a directory"),
             ([f"output_root={tmp_path}/o", f"model.cache_dir={blocker}/m"], 2,
              f"model.cache_dir = '{blocker}/m': {blocker} is a file, not a directory")]
    for args, code, line in cases:
        proc = run_harness(*ARGS, *args, timeout=120)
        assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert line in proc.stderr, proc.stderr[-2000:]
        assert "fix: set " in proc.stderr
    assert not list(tmp_path.glob("**/runs/*"))


def test_a_run_dir_or_manifest_of_the_wrong_kind_is_a_storage_error(base, tmp_path):
    out = tmp_path / "out"
    run_dir = Path(json.loads(run_harness(*ARGS, "arm=sft", "mode=plan", f"output_root={out}").stdout)["run_dir"])
    run_dir.parent.mkdir(parents=True)
    run_dir.write_text("a file where the run dir goes")
    proc = base.run(out, "arm=sft", timeout=120)
    assert proc.returncode == 9 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"output_root = '{out}': {run_dir}: File exists [EEXIST]" in proc.stderr
    assert "fix: move away what is at that path" in proc.stderr
    run_dir.unlink()
    (run_dir / "run_manifest.json").mkdir(parents=True)
    proc = base.run(out, "arm=sft", timeout=120)
    assert proc.returncode == 9 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "run_manifest.json: Is a directory [EISDIR]" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_directory_that_cannot_be_written_is_named_with_its_field(base, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = run_harness(*ARGS, f"output_root={ro}/out", timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert f"output_root = '{ro}/out': cannot be written: Permission denied" in proc.stderr
    finally:
        ro.chmod(0o755)

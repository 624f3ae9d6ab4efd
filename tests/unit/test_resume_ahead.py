"""The resume's deep check taken ahead (harness.run.stages.resume.CheckAhead): the file digests of the newest checkpoints
are taken on a thread while the data and model stages run, and `find` decides exactly as it does without them.

Also the state digests' threads (statedigest.fill_memo): the digests are the same on 1 thread, 2 or none."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.accounting import checkpoint as ckpt
from harness.accounting import statedigest
from harness.rundir import MANIFEST, atomic_write_json
from harness.run.stages import resume

IDENTITY = {"config_sha256": "0" * 64, "semantic_sha256": "1" * 64, "data": {"sha256": "2" * 64},
            "model": {"sha256": "3" * 64}, "teacher": None, "code": {"sha256": "4" * 64}}
PLAN = SimpleNamespace(cfg=SimpleNamespace(resume_from=None))


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 640), torch.nn.Linear(640, 64))  # a weight over 1 MiB
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def _run_dir(tmp_path: Path, steps=(2, 4)) -> Path:
    """A run dir with published checkpoints, as the Trainer and CheckpointCallback write them."""
    from safetensors.torch import save_file

    run = tmp_path / "run"
    run.mkdir()
    atomic_write_json(run / MANIFEST, {"identity": IDENTITY})
    for step in steps:
        model, opt = _model_and_optimizer(step)
        d = run / ckpt.CHECKPOINTS_DIR / f"checkpoint-{step}"
        d.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
        torch.save(opt.state_dict(), d / "optimizer.pt")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        ckpt.publish(d, step=step, identity=IDENTITY, frontier={"rank-0": {}}, totals={}, permanent=False,
                     state={"rank-0": statedigest.state_digests(model, opt, None)})
    return run


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(data)


def _ahead(run: Path, defers: bool | None = None) -> resume.CheckAhead:
    ahead = resume.CheckAhead(run, defers=defers)
    ahead._thread.join()  # what find's first digest waits for; here before the damage that follows
    return ahead


def _decision(point: resume.ResumePoint) -> tuple:
    return point.checkpoint, point.skipped


DAMAGES = ["none", "newest weights", "newest optimizer", "newest weights' header", "every checkpoint"]


def _damage(run: Path, damage: str) -> None:
    newest = run / "checkpoints" / "checkpoint-4"
    if damage == "newest weights":
        _flip(newest / "model.safetensors", -7)
    elif damage == "newest optimizer":
        _flip(newest / "optimizer.pt", 2000)
    elif damage == "newest weights' header":
        _flip(newest / "model.safetensors", 9)  # inside the JSON header: a loader fails on it
    elif damage == "every checkpoint":
        for d in (run / "checkpoints").iterdir():
            _flip(d / "model.safetensors", -7)


@pytest.mark.parametrize("defers", [True, False], ids=["one process", "several ranks"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_find_decides_the_same_with_the_digests_taken_ahead(tmp_path, damage, defers):
    """In the end (find, then the rest of the deep check, then find again where that found damage: what a run
    does); in one process the weights and optimizer state are left to that rest (CheckAhead.defers), with several
    ranks find itself decides exactly."""
    from tests.conftest import resume_decision

    run = _run_dir(tmp_path)
    _damage(run, damage)
    try:
        without = _decision(resume.find(PLAN, run))
    except Exception as exc:  # noqa: BLE001 (every checkpoint damaged: the refusal, the same both ways)
        with pytest.raises(type(exc), match="damaged"):
            resume_decision(PLAN, run, _ahead(run, defers))
        return
    ahead = _ahead(run, defers)
    first = resume.find(PLAN, run, ahead)
    assert set(first.unchecked) == ({"model.safetensors", "optimizer.pt"} if defers else set())
    assert _decision(resume_decision(PLAN, run, ahead)) == without
    assert without[0].name == ("checkpoint-4" if damage == "none" else "checkpoint-2")


def test_find_takes_the_digests_from_the_thread(tmp_path, monkeypatch):
    """The point of it: once the thread is done, find reads none of the chosen checkpoint's files again."""
    run = _run_dir(tmp_path)
    ahead = _ahead(run)
    calls = []
    real = ckpt.digest_on_disk
    monkeypatch.setattr(ckpt, "digest_on_disk", lambda p, a: calls.append(p) or real(p, a))
    point = resume.find(PLAN, run, ahead)
    assert point.checkpoint.name == "checkpoint-4" and calls == []
    assert set(point.unchecked) == {"model.safetensors", "optimizer.pt"}  # the audit's start takes those
    resume.find(PLAN, run)  # (the counter can fail: without the thread's digests every file is read)
    assert len(calls) == len(list(point.checkpoint.iterdir())) - 1  # all but the manifest


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_file_changed_after_the_thread_hashed_it_is_read_again(tmp_path, how):
    """A digest taken ahead counts only for the file as it was: damage done between the thread and find is caught
    (without the stamp check, find would trust the digest of the intact file)."""
    run = _run_dir(tmp_path)
    ahead = _ahead(run, defers=False)  # as with several ranks: in one process the thread leaves the weights alone
    weights = run / "checkpoints" / "checkpoint-4" / "model.safetensors"
    time.sleep(0.05)  # file times move in clock ticks (a few ms): a change within the tick of the hash is not seen
    if how == "in place":
        with open(weights, "r+b") as fh:  # the same inode and size: only the times tell
            fh.seek(-7, 2)
            byte = fh.read(1)
            fh.seek(-7, 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
    else:
        tmp = weights.with_name("w.tmp")
        tmp.write_bytes(weights.read_bytes()[:-7] + b"\0" * 7)
        tmp.replace(weights)
    point = resume.find(PLAN, run, ahead)
    assert point.checkpoint.name == "checkpoint-2"
    assert any("model.safetensors: xxh3 differs" in p for p in point.skipped[0]["problems"]), point.skipped


def test_a_cancelled_walk_leaves_find_to_do_the_work(tmp_path):
    run = _run_dir(tmp_path)
    ahead = resume.CheckAhead(run)
    ahead.cancel()
    assert resume.find(PLAN, run, ahead).checkpoint.name == "checkpoint-4"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_state_digests_are_the_same_on_any_number_of_threads(threads):
    model, opt = _model_and_optimizer(0)
    plain = statedigest.state_digests(model, opt, None)
    memo: dict = {}
    statedigest.fill_memo([list(model.parameters()), statedigest.optimizer_state(opt)], memo, threads=threads)
    big = [t for t in [*model.parameters(), *statedigest.tensors_in(statedigest.optimizer_state(opt))]
           if t.numel() * t.element_size() >= statedigest._PARALLEL_MIN]
    assert big and {statedigest.tensor_key(t) for t in big} <= set(memo)  # the large tensors hashed ahead
    assert statedigest.state_digests(model, opt, None, memo=memo) == plain


# --- find does not wait for the thread: the deep check it leaves is finished beside the loads (ResumePoint.confirm)


@pytest.fixture
def deferred(monkeypatch):
    """CheckAhead's thread held back until the run needs its verdict (harness.faults `defer`): find runs first."""
    from harness import faults

    monkeypatch.setenv(faults.FAULT_ENV, "rl.check_ahead:defer")
    monkeypatch.setattr(faults, "_seen", {})

    def ahead(run):
        faults._seen.clear()  # each CheckAhead's thread is the first at the point: every one is held
        return resume.CheckAhead(run, fault="rl.check_ahead")

    return ahead


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_deep_check_left_to_the_loads_ends_in_the_same_decision(tmp_path, deferred, damage):
    """find decides on the shallow checks while the thread has not hashed the files (the newest checkpoint, every
    file unchecked); confirm finds the damage; find again decides exactly as find without a thread does."""
    from tests.conftest import resume_decision

    run = _run_dir(tmp_path)
    _damage(run, damage)
    try:
        exact = _decision(resume.find(PLAN, run))
    except Exception as exc:  # noqa: BLE001 (every checkpoint damaged: the refusal, the same both ways)
        with pytest.raises(type(exc), match="damaged"):
            resume_decision(PLAN, run, deferred(run))
        return
    ahead = deferred(run)
    first = resume.find(PLAN, run, ahead)
    assert first.checkpoint.name == "checkpoint-4" and not ahead.settled()  # chosen without waiting
    assert set(first.unchecked) == {"model.safetensors", "optimizer.pt", "trainer_state.json"}
    if damage == "none":
        first.confirm()
        first.confirm()  # once: the second call checks nothing again
        assert _decision(first) == exact
        return
    with pytest.raises(resume.CheckpointDamaged, match="checkpoint-4") as caught:
        first.confirm()
    assert caught.value.problems == exact[1][0]["problems"]  # the same words as the exact find's
    again = resume.find(PLAN, run, ahead)
    assert _decision(again) == exact and exact[0].name == "checkpoint-2" and not again.unchecked


def test_a_loader_error_on_a_damaged_file_becomes_the_damage(tmp_path, deferred):
    """A loader that fails on the damage before the audit's confirm (a garbled header): confirm_after turns it
    into CheckpointDamaged (the run falls back); on an intact checkpoint the loader's own error stands."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    run = _run_dir(tmp_path)
    _damage(run, "newest weights' header")
    first = resume.find(PLAN, run, deferred(run))
    try:
        load_file(first.checkpoint / "model.safetensors")
    except SafetensorError as exc:  # (the flip can fail: a header that still parses would not raise)
        with pytest.raises(resume.CheckpointDamaged, match="model.safetensors"):
            first.confirm_after(exc)
    else:
        pytest.fail("the garbled header loaded")
    (tmp_path / "intact").mkdir()
    intact = _run_dir(tmp_path / "intact")
    point = resume.find(PLAN, intact, deferred(intact))
    point.confirm_after(RuntimeError("a loader's own error"))  # nothing damaged: returns, the caller re-raises
    assert point._confirmed


def test_with_several_ranks_find_waits_for_the_thread(tmp_path, deferred, monkeypatch):
    """Several ranks: nothing is left unchecked (a loader failing on one rank could not send the others back)."""
    from harness import dist

    run = _run_dir(tmp_path)
    _damage(run, "newest optimizer")
    monkeypatch.setattr(dist, "is_multi", lambda: True)
    point = resume.find(PLAN, run, deferred(run))
    assert point.unchecked == () and point.checkpoint.name == "checkpoint-2"
    assert [s["checkpoint"] for s in point.skipped] == ["checkpoint-4"]


def test_a_resume_point_goes_to_the_other_ranks_without_its_thread(tmp_path, deferred):
    import pickle

    run = _run_dir(tmp_path)
    point = resume.find(PLAN, run, deferred(run))
    assert point.check is not None
    copy = pickle.loads(pickle.dumps(point))
    assert copy.check is None and copy.unchecked == point.unchecked and copy.checkpoint == point.checkpoint
    point.confirm()


def test_the_defer_fault_is_parsed_and_returned():
    from harness import faults

    assert faults.parse("rl.check_ahead:defer") == ("rl.check_ahead", 1, "defer")


def test_several_faults_each_fire_at_their_own_point(monkeypatch):
    """HARNESS_FAULT="a;b": each fault counts the reaches of its own point (a trainer killed at a step while its
    sampler, which inherits the variable, dies every third round)."""
    from harness import faults

    monkeypatch.setattr(faults, "_seen", {})
    monkeypatch.setenv(faults.FAULT_ENV, "rl.step@2:eio;atomic:x.json@1:enospc")
    assert faults.point("rl.step") is None and faults.point("sft.step") is None
    with pytest.raises(OSError, match="injected by HARNESS_FAULT=atomic:x.json@1:enospc"):
        faults.point("atomic:x.json")
    with pytest.raises(OSError, match="injected by HARNESS_FAULT=rl.step@2:eio"):
        faults.point("rl.step")
    assert faults.point("rl.step") is None  # the third reach: past its n
    monkeypatch.setenv(faults.FAULT_ENV, "rl.step@2:eio;bogus:kill")
    with pytest.raises(ValueError, match="bogus:kill"):
        faults.point("rl.step")

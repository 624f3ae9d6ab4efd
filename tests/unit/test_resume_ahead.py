"""The resume's deep check taken ahead (harness.stages.resume.CheckAhead): the file digests of the newest checkpoints
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
from harness.stages import resume

IDENTITY = {"config_sha256": "0" * 64, "semantic_sha256": "1" * 64, "data": {"sha256": "2" * 64},
            "model": {"sha256": "3" * 64}, "teacher": None, "code": {"sha256": "4" * 64}}
PLAN = SimpleNamespace(config={})


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


def _ahead(run: Path) -> resume.CheckAhead:
    ahead = resume.CheckAhead(run)
    ahead._thread.join()  # what find's first digest waits for; here before the damage that follows
    return ahead


def _decision(point: resume.ResumePoint) -> tuple:
    return point.checkpoint, point.skipped


@pytest.mark.parametrize("damage", ["none", "newest weights", "newest optimizer", "every checkpoint"])
def test_find_decides_the_same_with_the_digests_taken_ahead(tmp_path, damage):
    run = _run_dir(tmp_path)
    newest = run / "checkpoints" / "checkpoint-4"
    if damage == "newest weights":
        _flip(newest / "model.safetensors", -7)
    elif damage == "newest optimizer":
        _flip(newest / "optimizer.pt", 2000)
    elif damage == "every checkpoint":
        for d in (run / "checkpoints").iterdir():
            _flip(d / "model.safetensors", -7)
    try:
        without = _decision(resume.find(PLAN, run))
    except Exception as exc:  # noqa: BLE001 (every checkpoint damaged: the refusal, the same both ways)
        with pytest.raises(type(exc), match="damaged"):
            resume.find(PLAN, run, _ahead(run))
        return
    assert _decision(resume.find(PLAN, run, _ahead(run))) == without
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
    resume.find(PLAN, run)  # (the counter can fail: without the thread's digests every file is read)
    assert len(calls) == len(list(point.checkpoint.iterdir())) - 1  # all but the manifest


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_file_changed_after_the_thread_hashed_it_is_read_again(tmp_path, how):
    """A digest taken ahead counts only for the file as it was: damage done between the thread and find is caught
    (without the stamp check, find would trust the digest of the intact file)."""
    run = _run_dir(tmp_path)
    ahead = _ahead(run)
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

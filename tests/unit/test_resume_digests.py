"""A resume reads each byte of the weights and optimizer state once (issue 47): in one process the deep check does
not re-read the files the Trainer loads whole; at the resume audit's start their digests are taken from the loaded
tensors, which the audit hashes anyway (tensorfiles.loaded_state, ResumePoint.confirm), and only their other bytes
(headers, the zip's records) come from the files. The same decisions as reading every file:

- intact: no file's tensor bytes are hashed again (the counter below; without the loaded state they are);
- a damaged file: CheckpointDamaged with the words of the exact check, and find then falls back exactly;
- a load that did not restore the bytes from an intact file: no damage is claimed (the files are read to tell),
  and the audit's state digests differ: its ResumeAuditError, as before;
- Qwen-VL's on-disk names (model.* for the model's model.language_model.*) still find their tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.accounting import filedigest, statedigest, tensorfiles
from harness.run.stages import resume
from tests.unit.test_digests import _Counting
from tests.unit.test_resume_ahead import PLAN, _flip, _model_and_optimizer, _run_dir

LOADED = {"model.safetensors", "optimizer.pt"}


def _load(ckpt_dir: Path):
    """What the Trainer's loads leave in a new process: a model and optimizer built afresh (other values), then
    the checkpoint's weights and optimizer state loaded into them."""
    from safetensors.torch import load_file

    model, opt = _model_and_optimizer(seed=99)
    model.load_state_dict(load_file(ckpt_dir / "model.safetensors"))
    opt.load_state_dict(torch.load(ckpt_dir / "optimizer.pt", weights_only=True))
    return model, opt


def _audit_start(point: resume.ResumePoint, model, opt, loaded: bool = True) -> dict:
    """The resume audit's start (ResumeAuditCallback.on_train_begin): the loaded tensors hashed, the deep check's
    rest from them, then the state digests (from the memo)."""
    memo: dict = {}
    statedigest.fill_memo([list(model.parameters()), statedigest.optimizer_state(opt)], memo)
    point.confirm(tensorfiles.loaded_state(model, opt, memo) if loaded else None)
    return statedigest.state_digests(model, opt, None, memo=memo)


def _recorded(point: resume.ResumePoint) -> dict:
    return point.manifest["state_digests"]["rank-0"]


@pytest.mark.parametrize("loaded", [True, False], ids=["from the loaded state", "read again (the counter can fail)"])
def test_a_resume_hashes_the_weights_and_optimizer_once(tmp_path, monkeypatch, loaded):
    run = _run_dir(tmp_path)
    newest = run / "checkpoints" / "checkpoint-4"
    counting = _Counting(monkeypatch)
    ahead = resume.CheckAhead(run)
    ahead._thread.join()
    assert counting.bytes < 64 * 1024  # the thread read the small files only
    point = resume.find(PLAN, run, ahead)
    assert point.checkpoint == newest and set(point.unchecked) == LOADED
    model, opt = _load(newest)
    counting.bytes = 0
    state = _audit_start(point, model, opt, loaded)
    assert {k: state[k] for k in ("params", "optimizer")} == {k: _recorded(point)[k] for k in ("params", "optimizer")}
    big = sum((newest / f).stat().st_size for f in LOADED)
    if loaded:
        assert counting.bytes < big + 64 * 1024, (counting.bytes, big)
    else:
        assert counting.bytes > 1.8 * big, (counting.bytes, big)


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_damage_found_in_the_loaded_state_falls_back_as_the_exact_check_does(tmp_path, where):
    run = _run_dir(tmp_path)
    newest = run / "checkpoints" / "checkpoint-4"
    _flip(newest / ("model.safetensors" if where == "weights" else "optimizer.pt"), -7 if where == "weights" else 2000)
    exact = resume.find(PLAN, run)
    assert exact.checkpoint.name == "checkpoint-2"
    ahead = resume.CheckAhead(run)
    point = resume.find(PLAN, run, ahead)
    assert point.checkpoint == newest  # chosen before the files the Trainer loads were checked
    model, opt = _load(newest)  # the damaged bytes loaded
    with pytest.raises(resume.CheckpointDamaged) as caught:
        _audit_start(point, model, opt)
    assert caught.value.problems == exact.skipped[0]["problems"]  # the same words as the exact check's
    again = resume.find(PLAN, run, ahead)
    assert (again.checkpoint, again.skipped, again.unchecked) == (exact.checkpoint, exact.skipped, ())


def test_a_load_that_missed_bytes_of_intact_files_is_not_called_damage(tmp_path):
    """The stock loader's silent failure (HARNESS_STOCK_RESUME): the files are intact, the memory is not what they
    hold. The check reads the files to tell, claims no damage, and the audit's digests name what was not restored."""
    run = _run_dir(tmp_path)
    ahead = resume.CheckAhead(run)
    point = resume.find(PLAN, run, ahead)
    model, opt = _load(point.checkpoint)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # a weight the load left at another value
    state = _audit_start(point, model, opt)  # no CheckpointDamaged
    assert state["params"] != _recorded(point)["params"] and state["optimizer"] == _recorded(point)["optimizer"]
    assert ahead.defers  # nothing found damaged: the next resume still leaves the loaded files to the audit


def test_qwen_vl_on_disk_names_find_the_models_tensors(tmp_path, hub_snapshot):
    """save_pretrained writes Qwen-VL's weights under the hub's names, which are not the model's: every tensor range
    of the file still comes from memory, and the digest is the file's."""
    from harness.policy import _auto_model

    model = _auto_model(str(hub_snapshot("qwen2_5_vl")))
    ckpt_dir = tmp_path / "checkpoint-2"
    model.save_pretrained(ckpt_dir)
    weights = ckpt_dir / "model.safetensors"
    on_disk = set(filedigest.safetensors_keys(weights))
    assert not on_disk <= set(model.state_dict())  # (the names differ: the test means something)
    known = tensorfiles.loaded_state(_auto_model(str(ckpt_dir)), None, {})(weights)
    asked = []

    def counting(r):
        d = known(r)
        asked.append((r.name, d is not None))
        return d

    assert filedigest.file_digest(weights, counting) == filedigest.file_digest(weights)
    tensors = [hit for name, hit in asked if name and name.startswith("tensor:")]
    assert len(tensors) == len(on_disk) and all(tensors)

"""The resume audit's comparison: every component that was not restored as saved fails it, by name."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from harness.run.audit import ResumeAuditCallback, ResumeAuditError
from harness.accounting.statedigest import state_digests


class TwoAdapters(torch.nn.Module):
    """Stands in for a PEFT model with a trained "default" adapter and a frozen "ref" one."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(3, 3)
        self.lora_default = torch.nn.Linear(3, 3)
        self.lora_ref = torch.nn.Linear(3, 3)
        self.base.requires_grad_(False)
        self.lora_ref.requires_grad_(False)
        self.peft_config = {"default": None, "ref": None}


def _checkpoint(tmp_path, model, opt, sched, fmt: int = 2):
    ckpt = tmp_path / "checkpoints" / "checkpoint-4"
    ckpt.mkdir(parents=True)
    digests = {"rank-0": state_digests(model, opt, sched, fmt)}
    manifest = {"digests": 2, "state_digests": digests} if fmt == 2 else {"state_digests": digests}  # 1: no key
    (ckpt / "harness_checkpoint.json").write_text(json.dumps(manifest))
    return ckpt


def _audit(tmp_path, ckpt, model, opt, sched):
    cb = ResumeAuditCallback(tmp_path, ckpt)
    cb.on_train_begin(None, None, None, model=model, optimizer=opt, lr_scheduler=sched)
    from harness.accounting.statedigest import rng_digests

    cb.actual["rng"] = rng_digests(cb.fmt)
    return cb


def test_a_checkpoint_of_digest_format_1_is_audited_in_format_1(tmp_path):
    """A run dir written before digest format 2 resumes: its sha256 state digests are recomputed as sha256."""
    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched, fmt=1)
    assert _audit(tmp_path, ckpt, model, opt, sched).finish(4)["status"] == "passed"
    with torch.no_grad():
        model.lora_default.weight.add_(1e-3)
    with pytest.raises(ResumeAuditError, match="params"):
        _audit(tmp_path, ckpt, model, opt, sched).finish(4)


def _setup():
    torch.manual_seed(0)
    model = TwoAdapters()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.lora_default(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    return model, opt, sched


def test_everything_restored_passes(tmp_path):
    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    report = _audit(tmp_path, ckpt, model, opt, sched).finish(4)
    assert report["status"] == "passed" and "adapters" in report["components"]
    assert {"rng.python", "rng.numpy", "rng.torch_cpu"} <= set(report["components"])
    assert json.loads((tmp_path / "audits" / "resume-1-rank-0.json").read_text())["status"] == "passed"


@pytest.mark.parametrize("break_it,component", [
    (lambda m, o, s: m.lora_default.weight.data.add_(1.0), "params+adapters"),  # the trained adapter not restored
    (lambda m, o, s: m.lora_ref.weight.data.add_(1.0), "adapters"),  # only the frozen reference is wrong
    (lambda m, o, s: o.state[next(iter(o.state))]["exp_avg"].add_(1.0), "optimizer"),
    (lambda m, o, s: setattr(s, "last_epoch", s.last_epoch + 1), "scheduler"),
    (lambda m, o, s: random.random(), "rng.python"),
    (lambda m, o, s: torch.rand(1), "rng.torch_cpu"),
    (lambda m, o, s: np.random.rand(), "rng.numpy"),
])
def test_each_unrestored_component_fails_the_audit_by_name(tmp_path, break_it, component):
    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    break_it(model, opt, sched)
    cb = _audit(tmp_path, ckpt, model, opt, sched)
    with pytest.raises(ResumeAuditError, match=component.split("+")[0]):
        cb.finish(4)
    report = json.loads((tmp_path / "audits" / "resume-1-rank-0.json").read_text())
    failed = [k for k, c in report["components"].items() if not c["passed"]]
    assert report["status"] == "failed" and failed == component.split("+")


@pytest.mark.parametrize("drop", ["all", "numpy"])
def test_a_checkpoint_without_rng_digests_fails_instead_of_passing_vacuously(tmp_path, drop):
    """An older or hand-made checkpoint that recorded no RNG digests (or lacks a stream) proves nothing about the
    RNG restore: the audit fails naming the stream(s), it does not pass with nothing compared."""
    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    manifest = json.loads((ckpt / "harness_checkpoint.json").read_text())
    from harness.accounting.statedigest import rng_digests

    rng = rng_digests()
    manifest["state_digests"]["rank-0"]["rng"] = {} if drop == "all" else {k: v for k, v in rng.items() if k != drop}
    (ckpt / "harness_checkpoint.json").write_text(json.dumps(manifest))
    cb = _audit(tmp_path, ckpt, model, opt, sched)
    with pytest.raises(ResumeAuditError, match="rng"):
        cb.finish(4)
    report = json.loads((tmp_path / "audits" / "resume-1-rank-0.json").read_text())
    failed = sorted(k for k, c in report["components"].items() if not c["passed"])
    assert failed == (["rng.numpy", "rng.python", "rng.torch_cpu"] if drop == "all" else ["rng.numpy"])


def test_an_unobserved_rng_restore_fails(tmp_path):
    """If the Trainer's RNG restore was never observed (the wrapped private method renamed), the audit fails."""
    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    cb = ResumeAuditCallback(tmp_path, ckpt)
    cb.on_train_begin(None, None, None, model=model, optimizer=opt, lr_scheduler=sched)
    with pytest.raises(ResumeAuditError):
        cb.finish(4)


@pytest.mark.parametrize("restored", [True, False])
def test_the_state_is_hashed_while_the_optimizer_state_loads(tmp_path, restored):
    """attach() hashes the weights on a thread when the Trainer begins loading the optimizer state (the weights are
    loaded by then), then each optimizer storage as torch.load reads it (a callable map_location); on_train_begin
    waits for them. The verdict is the serial one's: passed when everything was restored, failed by name when a
    weight was not."""
    from types import SimpleNamespace

    from harness.accounting.statedigest import optimizer_state, rng_digests, tensor_key, tensors_in

    torch.manual_seed(0)
    model = torch.nn.Linear(640, 512)  # a 1.25 MiB weight: large enough for the threaded digests
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 640)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    if not restored:
        with torch.no_grad():
            model.weight[0, 0] += 1.0
    cb = ResumeAuditCallback(tmp_path, ckpt)
    started, real_load = [], torch.load

    def load_optimizer(checkpoint):  # what Trainer._load_optimizer_and_scheduler does in one process
        started.append(cb._hashing)
        opt.load_state_dict(torch.load(f"{checkpoint}/optimizer.pt", map_location="cpu", weights_only=True))

    trainer = SimpleNamespace(model=model, _load_rng_state=lambda checkpoint: None,
                              _load_optimizer_and_scheduler=load_optimizer)
    cb.attach(trainer)
    trainer._load_optimizer_and_scheduler(str(ckpt))
    assert started and started[0] is not None  # begun before the optimizer state loads
    cb._hashing.join()
    loaded = [t for t in tensors_in(optimizer_state(opt)) if t.numel() * t.element_size() >= 1 << 20]
    assert loaded and {tensor_key(t) for t in [model.weight, *loaded]} <= set(cb.memo)  # before on_train_begin
    assert torch.load is real_load  # itself again
    cb.on_train_begin(None, None, None, model=model, optimizer=opt, lr_scheduler=sched)
    assert cb._hashing.held == []  # released: the memo's addresses are no longer held
    trainer._load_rng_state(str(ckpt))
    assert cb.actual["rng"] == rng_digests(cb.fmt)
    if restored:
        assert cb.finish(4)["status"] == "passed"
    else:
        with pytest.raises(ResumeAuditError, match="params"):
            cb.finish(4)


def test_state_off_the_cpu_loads_as_called(tmp_path):
    """Parameters that are not on the CPU (a GPU run; "meta" stands in for the device here): the Trainer's load
    moves the optimizer state onto their device after torch.load, so hashing the CPU storages would buy nothing:
    the load runs as called, torch.load untouched, and the audit hashes the state after the loads."""
    from types import SimpleNamespace

    model, opt, sched = _setup()
    ckpt = _checkpoint(tmp_path, model, opt, sched)
    cb = ResumeAuditCallback(tmp_path, ckpt)
    seen = []
    trainer = SimpleNamespace(model=torch.nn.Linear(2, 2, device="meta"), _load_rng_state=lambda checkpoint: None,
                              _load_optimizer_and_scheduler=lambda checkpoint: seen.append(torch.load))
    real_load = torch.load
    cb.attach(trainer)
    trainer._load_optimizer_and_scheduler(str(ckpt))
    assert seen == [real_load] and cb._hashing is None

"""Retention never leaves a published manifest over missing files, even when killed in the middle of a removal
(found by the SIGKILL-after-the-final-checkpoint test: checkpoint-4 kept its manifest, lost optimizer.pt)."""

from __future__ import annotations

import shutil

import pytest

from harness.accounting import checkpoint as ckpt


def _publish(run_dir, step: int, permanent: bool = False, kept: str | None = None):
    d = run_dir / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        (d / name).write_bytes(bytes([step]) * 100)
    ckpt.publish(d, step=step, identity={}, frontier={}, state={}, totals={}, permanent=permanent, kept=kept)
    return d


def test_kept_and_permanent_checkpoints_survive_retention_and_do_not_count_against_keep_last(tmp_path):
    for step, kept in ((2, "eval"), (3, None), (4, "eval"), (5, None), (6, None)):
        _publish(tmp_path, step, kept=kept)
    _publish(tmp_path, 7, permanent=True)
    assert ckpt.apply_retention(tmp_path, keep_last=1) == ["checkpoint-3", "checkpoint-5"]
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == [f"checkpoint-{s}" for s in (2, 4, 6, 7)]


def test_the_digest_of_unpublished_weights_is_the_published_one(tmp_path):
    """A periodic eval digests its checkpoint's weights before the manifest exists; verify compares it with the
    manifest's digest afterwards: the two must agree (and leave the optimizer out)."""
    from harness.accounting.weights import weights_digest, weights_digest_of_files

    d = tmp_path / "checkpoint-2"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"w" * 50)
    (d / "optimizer.pt").write_bytes(b"o" * 50)
    before = weights_digest_of_files(d)
    ckpt.publish(d, step=2, identity={}, frontier={}, state={}, totals={}, permanent=False)
    assert before is not None and before == weights_digest(d)
    (d / "optimizer.pt").write_bytes(b"x" * 50)
    assert weights_digest_of_files(d) == before


def test_a_kill_during_removal_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    for step in (2, 4, 6):
        _publish(tmp_path, step)

    def killed_midway(path, *a, **k):  # deletes one file, then the process "dies"
        next(p for p in sorted(path.iterdir()) if p.name != ckpt.CHECKPOINT_MANIFEST).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        ckpt.apply_retention(tmp_path, keep_last=2)
    monkeypatch.undo()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-6"]
    assert all(ckpt.checkpoint_problems(p) == [] for p in ckpt.list_checkpoints(tmp_path))
    assert (tmp_path / "checkpoints" / ".removing-checkpoint-2").is_dir()
    ckpt.clean_removals(tmp_path)
    assert not (tmp_path / "checkpoints" / ".removing-checkpoint-2").exists()


def test_retention_keeps_the_newest_and_permanent(tmp_path):
    for step in (2, 4, 6, 8):
        _publish(tmp_path, step)
    assert ckpt.apply_retention(tmp_path, keep_last=2) == ["checkpoint-2", "checkpoint-4"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-6", "checkpoint-8"]


def test_an_older_permanent_checkpoint_survives_and_the_newest_non_permanent_are_kept(tmp_path):
    """keep_last=2 over 2 (permanent), 4, 6, 8, 10: the permanent one stays although it is the oldest, the two
    newest (8, 10) stay, and exactly the non-permanent ones outside the newest two (4, 6) are removed."""
    for step in (2, 4, 6, 8, 10):
        _publish(tmp_path, step, permanent=step == 2)
    assert ckpt.apply_retention(tmp_path, keep_last=2) == ["checkpoint-4", "checkpoint-6"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-8", "checkpoint-10"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "checkpoint-10", "checkpoint-2", "checkpoint-8"]  # nothing else left behind (no .removing-*)
    assert all(ckpt.checkpoint_problems(p) == [] for p in ckpt.list_checkpoints(tmp_path))
    assert ckpt.apply_retention(tmp_path, keep_last=2) == []  # idempotent


def test_keep_last_zero_removes_every_non_permanent_checkpoint(tmp_path):
    """apply_retention(keep_last=0) keeps only the permanent checkpoints (not everything, which a plain
    `complete[:-0]` slice would do). The config refuses train.keep_last=0 (test below), so only a direct call
    reaches this."""
    for step in (2, 4, 6):
        _publish(tmp_path, step, permanent=step == 4)
    assert ckpt.apply_retention(tmp_path, keep_last=0) == ["checkpoint-2", "checkpoint-6"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-4"]


def test_train_keep_last_zero_is_refused_by_the_config(plan_of):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        plan_of("train.keep_last=0")
    assert [p.field for p in err.value.problems] == ["train.keep_last"] and "fix:" in str(err.value)


def test_the_final_checkpoint_does_not_count_against_keep_last(tmp_path):
    """At the end of a run (2, 4, 6 and the permanent final 8) keep_last=2 keeps 4 and 6 besides 8, as docs/training.md and
    train.keep_last's help say. Before, the final one counted among the latest 2 and only 6 survived."""
    for step in (2, 4, 6, 8):
        _publish(tmp_path, step, permanent=step == 8)
    assert ckpt.apply_retention(tmp_path, keep_last=2) == ["checkpoint-2"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]


def test_the_rng_is_where_it_was_after_a_periodic_eval():
    """PeriodicEvalCallback evaluates inside preserved_rng: whatever the eval draws, training draws what it would
    have drawn without it (greedy decoding draws nothing today; a sampling eval or a dropout model would)."""
    import random

    import numpy as np
    import torch

    from harness.eval.periodic import preserved_rng

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    want = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    with preserved_rng():
        torch.rand(7), random.random(), np.random.rand(5)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]

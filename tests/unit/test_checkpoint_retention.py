"""Retention never leaves a published manifest over missing files, even when killed in the middle of a removal
(found by the SIGKILL-after-the-final-checkpoint test: checkpoint-4 kept its manifest, lost optimizer.pt)."""

from __future__ import annotations

import shutil

import pytest

from harness import checkpoint as ckpt


def _publish(run_dir, step: int):
    d = run_dir / "checkpoints" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        (d / name).write_bytes(bytes([step]) * 100)
    ckpt.publish(d, step=step, identity={}, frontier={}, state={}, totals={}, permanent=False)


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

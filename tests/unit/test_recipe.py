"""harness.run.recipe.Run: the order the lifecycle calls it in, its cleanup on failure, and an attempt whose checkpoint
fails its deep check as it loads dropped for the next one (the whole runs are in tests/integration/test_faults.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.run import lifecycle
from harness.run.recipe import Run
from harness.run.stages.resume import CheckpointDamaged


def _run_dir(tmp_path):
    return SimpleNamespace(path=tmp_path, manifest={}, update=lambda **kw: None)


def _plan():
    return SimpleNamespace(kind="rl", cfg=SimpleNamespace(train=SimpleNamespace(hang_timeout_s=0)))


@pytest.mark.parametrize("fails", [None, "setup", "train", "finalize"])
def test_the_lifecycle_sets_up_trains_finalizes_and_always_cleans_up(tmp_path, monkeypatch, fails):
    calls = []

    def method(name, result=None):
        def call(self):
            calls.append(name)
            if name == fails:
                raise RuntimeError(name)
            return result
        return call

    for name in ("setup", "train", "cleanup"):
        monkeypatch.setattr(Run, name, method(name))
    monkeypatch.setattr(Run, "finalize", method("finalize", {"completion": True}))
    if fails is None:
        assert lifecycle.run_recipe(_plan(), _run_dir(tmp_path)) == {"completion": True}
    else:
        with pytest.raises(RuntimeError, match=fails):
            lifecycle.run_recipe(_plan(), _run_dir(tmp_path))
    steps = ["setup", "train", "finalize"]
    assert calls == steps[: steps.index(fails) + 1 if fails else 3] + ["cleanup"]


def test_an_attempt_on_a_checkpoint_damaged_as_it_loads_is_dropped_for_the_next(tmp_path, monkeypatch):
    """Found in setup (a paused run's confirm, a loader's error): setup again; found in train (the audit's start):
    close the attempt, set up again, train again. Every attempt's own loggers are closed once."""
    recipe = Run(_plan(), _run_dir(tmp_path))
    events, damaged = [], {"setup": 1, "fit": 1}

    def attempt():
        events.append("setup")
        recipe.logger_env, recipe.trainer = {}, object()
        if damaged["setup"]:
            damaged["setup"] -= 1
            raise CheckpointDamaged("checkpoint-4", ["checkpoint-4/model.safetensors: digest differs"])

    def fit():
        events.append("fit")
        if damaged["fit"]:
            damaged["fit"] -= 1
            raise CheckpointDamaged("checkpoint-2", ["checkpoint-2/optimizer.pt: digest differs"])
        return "trained"

    monkeypatch.setattr(recipe, "_setup_from_resume_point", attempt)
    monkeypatch.setattr(recipe, "_fit", fit)
    monkeypatch.setattr(recipe, "close_loggers", lambda failed: events.append(f"close(failed={failed})") or
                        setattr(recipe, "logger_env", None))
    recipe._start_attempt()
    assert recipe.train() == "trained"
    assert events == ["setup", "close(failed=True)", "setup", "fit", "close(failed=True)", "setup", "fit"]

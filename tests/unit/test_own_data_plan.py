"""A dataset of your own at plan time: the run name follows its content, its splits are checked before any work,
and the SFT warm start is sized to learn on a small one (passes over the data, or an explicit epoch count)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.data.manifest import seal_dataset
from harness.errors import ConfigError
from harness.data.trainsets import sft_order, sft_passes
from tests.own_data import write_colour_set


@pytest.fixture
def own(tmp_path) -> Path:
    root = write_colour_set(tmp_path / "mine")
    seal_dataset(root, fill_digests=True)
    return root


def test_two_datasets_under_one_output_root_are_two_runs(plan_of, own, tmp_path):
    """The same command on another (or an edited) dataset at the same data.path is a new run dir, not a resume
    conflict: the name carries the data's content digest."""
    a = plan_of("data=jsonl", f"data.path={own}", "debug=tiny")
    other = write_colour_set(tmp_path / "other", seed=1)
    seal_dataset(other, fill_digests=True)
    b = plan_of("data=jsonl", f"data.path={other}", "debug=tiny")
    assert a.run_dir != b.run_dir and a.parent.run_dir != b.parent.run_dir
    assert a.identity["semantic_sha256"] == b.identity["semantic_sha256"]  # data.path is not semantic
    content = json.loads((own / "manifest.json").read_text())["sha256"]
    assert f"-jsonl_{content[:8]}-s0-" in a.run_name
    # the same path, edited in place: another run too
    rows = (own / "records/train.jsonl").read_text().splitlines()
    (own / "records/train.jsonl").write_text("\n".join(rows[:-1]) + "\n")
    seal_dataset(own, fill_digests=True)
    assert plan_of("data=jsonl", f"data.path={own}", "debug=tiny").run_dir != a.run_dir
    # the synthetic set is named by its spec, which the config holds
    assert "-synthetic-s0-" in plan_of("debug=tiny").run_name


def test_mode_plan_refuses_a_dataset_without_its_eval_split(plan_of, own):
    (own / "records/test.jsonl").unlink()
    seal_dataset(own)
    with pytest.raises(ConfigError) as err:
        plan_of("data=jsonl", f"data.path={own}")
    (p,) = err.value.problems
    assert p.field == "data.eval_split" and "train (32 rows)" in p.why and "records/test.jsonl" in p.fix
    with pytest.raises(ConfigError) as err:  # and says which split the training one could be
        plan_of("data=jsonl", f"data.path={own}", "data.train_split=training")
    assert [p.field for p in err.value.problems] == ["data.train_split", "data.eval_split"]


def test_mode_plan_refuses_a_dataset_without_a_manifest_once(plan_of, tmp_path):
    root = write_colour_set(tmp_path / "unsealed")
    with pytest.raises(ConfigError) as err:
        plan_of("data=jsonl", f"data.path={root}")
    (p,) = err.value.problems
    assert p.field == "data.path" and f"python -m harness.data manifest {root}" in p.fix


def test_sft_passes_keep_the_first_order_and_reshuffle_the_next():
    rows = [{"group_id": f"g{i}", "view_id": "full"} for i in range(10)]
    one = sft_order(rows, 3)
    three = sft_order(rows, 3, passes=3)
    assert three[:10] == one  # a one-pass run trains on exactly what it always did
    assert len(three) == 30 and three[10:20] != one and three[20:] != three[10:20]
    assert sorted(map(str, three[10:20])) == sorted(map(str, one))  # each pass holds every row once
    assert sft_order(rows, 3, passes=3) == three  # deterministic
    arm = {"batch_size": 16, "epochs": None}
    assert sft_passes(arm, 60, 32) == 30 and sft_passes(arm, 150, 3600) == 1
    assert sft_passes({**arm, "epochs": 2}, 60, 32) == 2
    assert sft_passes({"batch_size": 16}, 60, 32) == 1  # a plan from before arm.epochs: one pass


def test_the_warm_start_covers_a_small_dataset_many_times(plan_of, own):
    """The new user's 32 training rows: 60 warm-start steps of 16 rows are 30 passes, said by the plan (the old
    one-epoch cap trained 2 steps and RL then learned nothing)."""
    p = plan_of("data=jsonl", f"data.path={own}", "debug=tiny")
    assert p.parent.config["arm"]["epochs"] is None and p.parent.config["budget"]["max_steps"] == 60
    assert p.parent.budget["train_rows"] == 32 and p.parent.budget["epochs"] == 30.0
    # a standalone SFT run keeps its one pass unless asked
    s = plan_of("data=jsonl", f"data.path={own}", "arm=sft")
    assert s.config["arm"]["epochs"] == 1 and s.budget["epochs"] == 1


def test_the_warm_start_sized_in_epochs(plan_of, own):
    p = plan_of("data=jsonl", f"data.path={own}", "debug=tiny", "budget.sft_warm_start_epochs=5")
    assert p.parent.config["arm"]["epochs"] == 5
    assert p.parent.config["budget"]["max_steps"] == 10  # ceil(5 x 32 / 16)
    assert p.parent.budget["epochs"] == 5
    # the same warm start as a standalone sft run of 5 epochs over those 10 steps: one run dir, not two
    assert p.parent.run_name.startswith("sft-tiny_vlm-jsonl_")


def test_the_format_check_needs_the_warm_starts_eval(plan_of):
    """Without the warm start's eval there is nothing to check: the plan says so instead of staying silent."""
    (warning,) = [w for w in plan_of("debug=tiny", "train.eval_after=false").warnings if "min_format" in w]
    assert "is not checked" in warning and "train.eval_after=false" in warning
    assert not [w for w in plan_of("debug=tiny", "train.eval_after=false", "budget.sft_warm_start_min_format=0").warnings
                if "min_format" in w]
    assert not [w for w in plan_of("debug=tiny").warnings if "min_format" in w]


def test_the_warm_start_gate(plan_of, tmp_path):
    """Below budget.sft_warm_start_min_format the RL run stops with the share, the warm start's size and the fix;
    at or above it, RL starts."""
    from harness.errors import WarmStartError
    from harness.run.lifecycle import check_warm_start

    plan = plan_of("debug=tiny")
    ev = Path(plan.parent.run_dir) / "eval" / "test.json"
    ev.parent.mkdir(parents=True)
    ev.write_text(json.dumps({"format_valid": 0.25, "n": 64}))
    with pytest.raises(WarmStartError) as err:
        check_warm_start(plan)
    text = str(err.value)
    assert "only 25% of the 64 test views" in text and "budget.sft_warm_start_steps=60" in text
    assert "budget.sft_warm_start_min_format=0" in text and err.value.exit_code == 10
    ev.write_text(json.dumps({"format_valid": 0.5, "n": 64}))
    check_warm_start(plan)
    ev.write_text(json.dumps({"format_valid": 0.0, "n": 64}))
    check_warm_start(plan_of("debug=tiny", "budget.sft_warm_start_min_format=0"))


def test_existing_runs_keep_their_names(plan_of):
    """The fields added for your own task (reward.*, budget.sft_warm_start_epochs / min_format, arm.epochs) hold the
    old behaviour by default and are then left out of both hashes (identity.OMIT_AT_DEFAULT): a run dir made before
    them is found again by the same command. A warm start that one pass covers keeps arm.epochs=1 (the default job's
    150 steps x 16 rows of 3,600); set otherwise, each field counts."""
    from harness.identity import OMIT_AT_DEFAULT, config_hashes, drop_paths

    for args in ((), ("debug=tiny",), ("arm=sft",)):
        plan = plan_of(*args)
        for p in (plan, plan.parent) if plan.parent else (plan,):
            before = drop_paths(p.config, list(OMIT_AT_DEFAULT))  # the config as it was before the fields existed
            assert config_hashes(before, p.identity["non_semantic_fields"]) == (
                p.identity["config_sha256"], p.identity["semantic_sha256"]), args
    assert plan_of().parent.config["arm"]["epochs"] == 1
    base = plan_of().identity["semantic_sha256"]
    for extra in ("reward.success_threshold=0.5", "budget.sft_warm_start_epochs=2"):
        assert plan_of(extra).identity["semantic_sha256"] != base, extra
    assert plan_of("arm=sft", "arm.epochs=2").identity["semantic_sha256"] != plan_of("arm=sft").identity["semantic_sha256"]

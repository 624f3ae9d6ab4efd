"""Run identities do not drift: every existing run dir must still resume, so the run name and semantic hash of each
arm's plan (and of its SFT warm start and planned teacher) at the defaults and at debug=tiny equal the ones recorded
in tests/fixtures/plan_identities.json (written from the plans of main before the typed-plan refactor, issue 38).
A change that moves them on purpose rewrites that file in the same commit and says so. The typed config every
stage reads (`Plan.cfg`) is exactly the plan's JSON, read back."""

from __future__ import annotations

import json

import pytest

from harness import kinds
from harness.cli import compose_plan
from harness.config.schema import Config
from harness.config.typed import from_json
from harness.identity import to_jsonable
from harness.plan import Plan
from tests.conftest import REPO

RECORDED = json.loads((REPO / "tests" / "fixtures" / "plan_identities.json").read_text())


def _ids(plan) -> dict:
    out = {"run_name": plan.run_name, "semantic_sha256": plan.identity["semantic_sha256"]}
    for role in ("parent", "teacher"):
        if getattr(plan, role) is not None:
            out[role] = _ids(getattr(plan, role))
    return out


@pytest.mark.parametrize("tag", sorted(RECORDED))
def test_run_names_and_semantic_hashes_are_the_recorded_ones(tag, tmp_path):
    arm, _, tiny = tag.partition("-")
    plan = compose_plan([f"arm={arm}", *(["debug=tiny"] if tiny else []), f"output_root={tmp_path}"])
    assert _ids(plan) == RECORDED[tag]
    for p in (plan, *(pre.plan for pre in plan.prerequisites)):
        assert to_jsonable(p.cfg) == p.config  # the typed view is the serialized config, field for field
        assert type(p.cfg.arm).__name__ != "dict" and p.cfg.arm.name == p.arm
        again = Plan.from_json(json.loads(json.dumps(p.to_json())))  # what a rank reads from the plan file
        assert again.kind == p.kind and isinstance(again.kind, kinds.Kind) and again.cfg == p.cfg
    assert [pre.plan for pre in plan.prerequisites] == [p for p in (plan.parent, plan.teacher) if p is not None]


def test_the_typed_config_of_an_older_plan_reads():
    """A run dir of an older harness: a field added since takes its default (what that plan ran with), a field
    removed since is not read."""
    plan = compose_plan(["arm=sft", "debug=tiny"])
    config = json.loads(json.dumps(plan.config))
    del config["arm"]["epochs"]  # added by issue 36: plans before it trained one pass
    config["train"]["a_removed_field"] = 5
    cfg = from_json(Config, config)
    assert cfg.arm.epochs == 1 and not hasattr(cfg.train, "a_removed_field")
    assert cfg.train == plan.cfg.train and type(cfg.data) is type(plan.cfg.data)


def test_the_data_option_reads_back_as_its_own_schema_class():
    from harness.config.schema import JsonlData, SyntheticData

    plan = compose_plan(["arm=grpo", "debug=tiny"])
    config = json.loads(json.dumps(plan.config))
    assert type(from_json(Config, config).data) is SyntheticData
    config["data"] = to_jsonable(JsonlData(name="mine", path="/data/mine"))
    data = from_json(Config, config).data
    assert type(data) is JsonlData and data.path == "/data/mine" and to_jsonable(data) == config["data"]

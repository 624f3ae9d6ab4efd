"""Experiment presets (conf/experiment/<name>.yaml): a preset means exactly its command line.

`experiment=<name>` must plan the same run (semantic identity, run dir) and the same SFT warm start as the
overrides it pins, whatever comes with it (debug=tiny, a group or key on the command line, which wins).
"""

from __future__ import annotations

import re

import pytest

from harness.errors import ConfigError
from tests.conftest import CONF

PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def same(a, b) -> None:
    assert a.run_name == b.run_name
    assert a.identity["semantic_sha256"] == b.identity["semantic_sha256"]
    assert (a.parent is None) == (b.parent is None)
    if a.parent is not None:
        assert a.parent.run_name == b.parent.run_name
        assert a.parent.identity["semantic_sha256"] == b.parent.identity["semantic_sha256"]


@pytest.mark.parametrize("extra", [(), ("debug=tiny",), ("seed=3", "budget.sft_warm_start_steps=30")],
                         ids=["alone", "debug", "keys"])
def test_a_preset_with_arm_knobs_plans_as_its_overrides(plan_of, extra):
    # the preset sets arm.lambda_evidence, which the SFT warm start (arm=sft) lacks: its warm start takes
    # the preset without the arm, as it takes a command line without arm.*
    preset = plan_of("experiment=evi_po_direction_only", *extra)
    assert preset.config["arm"]["name"] == "evi_po" and preset.config["arm"]["lambda_evidence"] == 0.0
    assert preset.parent is not None and preset.parent.config["arm"]["name"] == "sft"
    same(preset, plan_of("arm=evi_po", "arm.lambda_evidence=0.0", *extra))


def test_the_command_line_wins_over_the_preset(plan_of):
    plan = plan_of("experiment=evi_po_direction_only", "arm.lambda_evidence=0.05")
    assert plan.config["arm"]["lambda_evidence"] == 0.05
    papo = plan_of("experiment=comparison", "arm=papo", "seed=3")
    assert papo.config["arm"]["name"] == "papo"
    same(papo, plan_of("arm=papo", "seed=3"))


def test_debug_still_shrinks_a_preset(plan_of):
    plan = plan_of("experiment=comparison", "debug=tiny")
    assert plan.config["budget"]["max_completion_tokens"] == 2048
    assert plan.parent.config["budget"]["max_steps"] == 60


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_plans_and_says_its_command(plan_of, name):
    text = (CONF / "experiment" / name).with_suffix(".yaml").read_text()
    assert text.startswith("# @package _global_\n"), "a preset sets keys of several groups"
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any(re.search(rf"python -m harness .*experiment={name}\b", ln) for ln in header), header
    plan_of(f"experiment={name}")


def test_the_warm_start_variant_is_not_an_option(plan_of):
    plan_of("experiment=evi_po_direction_only")  # stores evi_po_direction_only__sft_warm_start
    from harness.config.compose import compose

    with pytest.raises(ConfigError) as err:
        compose(["experiment=comparisn"])
    text = err.value.render()
    assert "did you mean experiment=comparison?" in text and "__sft_warm_start" not in text

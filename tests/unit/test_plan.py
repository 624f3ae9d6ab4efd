"""Plan identity tiers, error aggregation, warnings, budget and checkpoint schedule."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.identity import config_hashes, drop_paths


def ids(plan):
    return plan.identity["config_sha256"], plan.identity["semantic_sha256"]


def test_identity_is_stable(plan_of):
    assert ids(plan_of()) == ids(plan_of())
    assert plan_of().run_name == plan_of().run_name


@pytest.mark.parametrize("override,config_changes,semantic_changes", [
    ("seed=1", True, True),
    ("arm.learning_rate=2e-4", True, True),
    ("data.n_base=700", True, True),
    ("reward.invalid_penalty=1.0", True, True),
    ("logger=tensorboard", True, False),
    ("logger=wandb", True, False),
    ("train.logging_steps=5", True, False),
    ("train.save_steps=10", True, False),
    ("data.num_workers=2", True, False),
    ("model.cache_dir=/elsewhere", True, False),
    ("placement=ddp", True, False),
])
def test_identity_tiers(plan_of, override, config_changes, semantic_changes):
    base_cfg, base_sem = ids(plan_of())
    cfg, sem = ids(plan_of(override))
    assert (cfg != base_cfg) == config_changes
    assert (sem != base_sem) == semantic_changes


def test_output_root_changes_neither_hash(compose_cfg, tmp_path):
    from harness.plan import build_plan

    a = build_plan(compose_cfg(f"output_root={tmp_path}/a")[0])
    b = build_plan(compose_cfg(f"output_root={tmp_path}/b")[0])
    # output_root is in the config (config_sha256 differs) but not in the semantic view
    assert a.identity["semantic_sha256"] == b.identity["semantic_sha256"]
    assert a.run_name == b.run_name and a.run_dir != b.run_dir


def test_run_name_and_dir(plan_of, tmp_path):
    plan = plan_of("arm=papo", "seed=3")
    sem = plan.identity["semantic_sha256"]
    assert plan.run_name == f"papo-tiny_vlm-synthetic-s3-{sem[:8]}"
    assert plan.run_dir == str(tmp_path / "out" / "runs" / plan.run_name)


def test_a_lora_run_says_so_in_its_name(plan_of):
    lora = plan_of("model.tuning=lora")
    sem = lora.identity["semantic_sha256"]
    assert lora.run_name == f"grpo-tiny_vlm-lora-synthetic-s0-{sem[:8]}"
    assert lora.parent.run_name.startswith("sft-tiny_vlm-lora-synthetic-s0-")  # its warm start is LoRA too
    assert "-lora-" not in plan_of().run_name


def test_hashes_recompute_from_the_stored_config(plan_of):
    plan = plan_of("arm=evi_po")
    assert config_hashes(plan.config, plan.identity["non_semantic_fields"]) == ids(plan)
    sem_view = drop_paths(plan.config, plan.identity["non_semantic_fields"])
    assert "logger" in sem_view and sem_view["logger"] == {} and "output_root" not in sem_view
    assert sem_view["arm"]["learning_rate"] == plan.config["arm"]["learning_rate"]


def test_errors_are_aggregated_with_field_value_why_fix(plan_of):
    with pytest.raises(ConfigError) as err:
        plan_of("arm.learning_rate=-1", "arm.num_generations=1", "budget.max_completion_tokens=10",
                "data.eval_split=train", "arm.top_p=1.5")
    fields = [p.field for p in err.value.problems]
    assert fields == ["arm.learning_rate", "arm.num_generations", "arm.top_p", "budget.max_completion_tokens",
                      "data.eval_split"]
    text = err.value.render()
    assert text.startswith("ConfigError: 5 problems")
    assert "fix:" in text and "arm.learning_rate = -1.0" in text
    for p in err.value.problems:
        assert p.why and p.fix


def test_cross_field_checks(plan_of):
    cases = {
        "arm.prompts_per_step=3": None,  # 3x8=24 splits over 1 process x 1 accumulation: fine
    }
    for override in cases:
        plan_of(override)
    with pytest.raises(ConfigError) as err:
        plan_of("placement=ddp", "placement.num_processes=3")  # 4 x 8 = 32 completions over 3 ranks
    assert err.value.problems[0].field == "arm.prompts_per_step"
    assert "32" in err.value.problems[0].why and "3" in err.value.problems[0].why
    with pytest.raises(ConfigError) as err:
        plan_of("arm.steps_per_generation=4", "train.save_steps=6")
    assert err.value.problems[0].field == "train.save_steps"
    with pytest.raises(ConfigError) as err:  # the buffer is reused num_iterations times too
        plan_of("arm.steps_per_generation=2", "arm.num_iterations=2", "train.save_steps=6")
    assert err.value.problems[0].field == "train.save_steps" and "(4)" in err.value.problems[0].why
    plan_of("arm.steps_per_generation=2", "arm.num_iterations=2", "train.save_steps=8")
    with pytest.raises(ConfigError) as err:
        plan_of("model=tiny_lm", "arm=papo")
    assert err.value.problems[0].field == "arm"
    with pytest.raises(ConfigError) as err:
        plan_of("arm.init=/does/not/exist")
    assert err.value.problems[0].field == "arm.init"


def test_missing_required_value_is_a_config_error(plan_of):
    with pytest.raises(ConfigError) as err:
        plan_of("data=jsonl")  # data.path is required
    assert [p.field for p in err.value.problems] == ["data.path"]


def test_warnings(plan_of):
    assert any("gamma" in w for w in plan_of("arm=papo", "arm.gamma=0.05").warnings)
    assert not any("gamma" in w for w in plan_of("arm=papo").warnings)
    assert any("lora" in w.lower() for w in plan_of("model.tuning=lora").warnings)


def test_budget_and_checkpoint_schedule(plan_of):
    plan = plan_of("budget.max_completion_tokens=1000", "budget.max_steps=10", "train.save_steps=4")
    assert plan.budget["per_step_upper_bound"] == 4 * 8 * 16
    assert plan.budget["guaranteed_steps"] == 1000 // 512 == 1
    assert plan.budget["completion_token_ceiling"] == 1000
    assert plan.checkpoints["planned_steps"] == [4, 8]
    sft = plan_of("arm=sft")
    assert sft.budget["kind"] == "loss_tokens"


def test_debug_tiny_shrinks_the_run(plan_of):
    plan = plan_of("debug=tiny")
    assert plan.config["train"]["save_steps"] == 2 and plan.choices["debug"] == "tiny"
    # budget-bound: max_steps is a cap the token budget always reaches first, even if every completion ran to
    # max_completion_length; the warm start is long enough to give GRPO reward signal (60 steps, measured)
    assert plan.budget["max_steps_worst_case_tokens"] > 2 * plan.budget["completion_token_ceiling"]
    assert plan.config["budget"]["sft_warm_start_steps"] >= 60


def test_runs_and_named_sweeps_are_budget_bound_and_debug_shrinks_them(compose_cfg):
    """The default budget (every run, every named comparison) has max_steps only as a safety cap: even at the worst
    case of every completion at max_completion_length the token budget binds first. debug=tiny, applied after a
    sweep, shrinks its budget as it shrinks any run. Before, the default job stopped at max_steps=250 with 37% of
    its budget used, so "same budget" meant "same steps"."""
    from harness.plan import build_plan

    for arm in ("grpo", "papo", "evi_po"):
        plan = build_plan(*compose_cfg(f"arm={arm}"))
        assert plan.budget["max_steps_worst_case_tokens"] > 10 * plan.budget["completion_token_ceiling"], arm
    for sweep in ("arms_x_seeds", "papo_ablation", "evi_po_ablation", "staleness"):
        plan = build_plan(*compose_cfg(f"sweep={sweep}", "arm=grpo" if sweep == "arms_x_seeds" else "seed=0"))
        assert plan.budget["max_steps_worst_case_tokens"] > 10 * plan.budget["completion_token_ceiling"], sweep
        tiny = build_plan(*compose_cfg(f"sweep={sweep}", "debug=tiny"))
        assert tiny.config["budget"]["max_completion_tokens"] < plan.config["budget"]["max_completion_tokens"]
        assert tiny.budget["max_steps_worst_case_tokens"] > tiny.budget["completion_token_ceiling"]


def test_generation_round_in_the_plan(plan_of):
    """One round: prompts_per_step x steps_per_generation prompts, served for steps_per_generation x
    num_iterations optimizer steps; TRL gets micro-batch units (its steps_per_generation counts micro-batches)."""
    r = plan_of("arm.steps_per_generation=2", "arm.num_iterations=3", "arm.gradient_accumulation_steps=4",
                "train.save_steps=6").budget["generation_round"]
    assert r["prompts"] == 8 and r["completions"] == 64 and r["optimizer_steps"] == 6 and r["passes"] == 3
    assert r["token_bound"] == 64 * 16
    assert r["trl"] == {"per_device_train_batch_size": 8, "steps_per_generation": 8, "num_iterations": 3,
                        "num_generations": 8}


def test_budget_below_one_round_is_refused(plan_of):
    with pytest.raises(ConfigError) as err:
        plan_of("arm.steps_per_generation=2", "budget.max_completion_tokens=600")  # one round: 8 x 8 x 16 = 1024
    (p,) = err.value.problems
    assert p.field == "budget.max_completion_tokens" and "1024" in p.why and "1024" in p.fix


@pytest.mark.parametrize("overrides, ok", [
    (("arm.batch_size=16",), True),
    (("arm.batch_size=16", "arm.gradient_accumulation_steps=4"), True),
    (("arm.batch_size=16", "placement=ddp", "placement.num_processes=3"), False),  # 16 over 3 ranks trained 15
    (("arm.batch_size=10", "arm.gradient_accumulation_steps=4"), False),
])
def test_sft_batch_must_split_over_ranks_and_accumulation(plan_of, overrides, ok):
    if ok:
        plan_of("arm=sft", *overrides)
        return
    with pytest.raises(ConfigError) as err:
        plan_of("arm=sft", *overrides)
    (p,) = [p for p in err.value.problems if p.field == "arm.batch_size"]
    assert "split evenly" in p.why and "multiple of" in p.fix


def _jsonl_dataset(root, relations):
    import json

    (root / "records").mkdir(parents=True)
    rows = [{"base_id": f"b{i}", "relation": rel} for i, rel in enumerate(relations)]
    (root / "records" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # what the planner reads of a dataset: its manifest (the run validates the files against it)
    from harness.data.manifest import manifest_digest

    m = {"schema_version": 1, "images": {}, "summary": {"rows": len(rows) + 1},
         "records": {"records/train.jsonl": {"rows": len(rows)}, "records/test.jsonl": {"rows": 1}}}
    (root / "manifest.json").write_text(json.dumps({**m, "sha256": manifest_digest(m)}))
    return root


def test_evi_po_warns_when_missing_views_exceed_a_third(plan_of, tmp_path):
    """docs/arms.md: always-abstain is evi_po's degenerate optimum; MISSING above a third of the training views warns."""
    heavy = _jsonl_dataset(tmp_path / "heavy", ["MISSING", "MISSING", "FULL", "CONTROL", "MISSING"])
    light = _jsonl_dataset(tmp_path / "light", ["MISSING", "FULL", "CONTROL", "SUBSTITUTE"])
    warned = [w for w in plan_of("arm=evi_po", "data=jsonl", f"data.path={heavy}").warnings if "MISSING" in w]
    assert warned and "3 of the 5" in warned[0] and "a third" in warned[0]
    assert not [w for w in plan_of("arm=evi_po", "data=jsonl", f"data.path={light}").warnings if "MISSING" in w]
    assert not [w for w in plan_of("arm=evi_po").warnings if "MISSING" in w]  # synthetic: one view in four
    assert not [w for w in plan_of("arm=grpo", "data=jsonl", f"data.path={heavy}").warnings if "MISSING" in w]


def test_identity_placeholders(plan_of):
    ident = plan_of().identity
    assert ident["data"]["kind"] == "synthetic" and len(ident["data"]["spec_sha256"]) == 64
    assert ident["model"]["kind"] == "tiny" and len(ident["model"]["spec_sha256"]) == 64
    assert set(ident["code"]) >= {"commit", "dirty"}
    assert ident["environment"]["packages"]["trl"] == "1.16.0"


def test_fields_an_arm_never_reads_do_not_split_its_identity(plan_of):
    """SFT ignores the token budget, rollout and reward; RL arms ignore the loss-token cap. Runs that
    differ only there are the same run (a sweep's RL jobs then share one SFT warm start)."""
    sft = plan_of("arm=sft").identity["semantic_sha256"]
    for override in ("budget.max_completion_tokens=999999", "reward.invalid_penalty=0",
                     "budget.sft_warm_start_steps=7"):
        assert plan_of("arm=sft", override).identity["semantic_sha256"] == sft
    grpo = plan_of().identity["semantic_sha256"]
    assert plan_of("budget.max_loss_tokens=123").identity["semantic_sha256"] == grpo
    assert plan_of("budget.sft_warm_start_steps=7").identity["semantic_sha256"] != grpo


def test_the_sft_warm_start_keeps_the_model_and_data_overrides(tmp_path):
    """sft_parent filtered overrides by prefix, so `model=tiny_lm` (it starts with "mode") was dropped and the
    warm start of a tiny_lm run was a tiny_vlm SFT run."""
    from harness.cli import compose_plan

    child = compose_plan([f"output_root={tmp_path}", "model=tiny_lm", "arm=grpo", "arm.learning_rate=3e-4",
                          "mode=plan", "data.n_base=40"])
    parent = child.parent
    assert parent.config["model"]["name"] == "tiny_lm" and parent.config["arm"]["name"] == "sft"
    assert parent.config["data"]["n_base"] == 40 and parent.config["arm"]["learning_rate"] != 3e-4
    assert parent.config["budget"]["max_steps"] == child.config["budget"]["sft_warm_start_steps"]


def test_the_warm_start_is_planned_with_the_childs_process_identity_and_equals_planning_it_alone(tmp_path):
    """The parent reuses the code and environment identity read for the child (the same process, a moment
    later) instead of reading git and the packages again; its identity is what planning it alone gives."""
    from harness import identity as ident
    from harness.cli import compose_plan

    child = compose_plan([f"output_root={tmp_path}", "debug=tiny"])
    parent = child.parent
    alone = compose_plan(parent.overrides)
    assert parent.identity["code"] == child.identity["code"] == ident.code_identity()
    assert parent.identity["environment"] == child.identity["environment"] == ident.environment_identity()
    assert parent.identity == alone.identity and parent.run_name == alone.run_name


def test_a_problem_of_the_sft_parent_is_refused_at_plan_time_and_named_as_the_parents(tmp_path):
    """The warm start is planned with the child: a parent that cannot run is refused before anything is written
    (it used to surface at train time, after the child's run dir was claimed), and says it is the parent's."""
    from harness.cli import compose_plan
    from harness.errors import ConfigError

    argv = [f"output_root={tmp_path}", "placement=ddp", "placement.num_processes=3", "arm.prompts_per_step=3"]
    with pytest.raises(ConfigError) as exc:
        compose_plan(argv)
    (p,) = exc.value.problems
    assert p.field == "arm.batch_size" and "SFT warm start" in p.why and "conf/arm/sft.yaml" in p.fix
    assert compose_plan([*argv, "arm.init=scratch"]).parent is None  # the child itself is fine
    assert not (tmp_path / "runs").exists()


def test_a_plan_and_its_parent_survive_the_driver_plan_file(tmp_path):
    """Ranks run exactly the plan the driver wrote (harness.launch): from_json(to_json) is the same plan."""
    import json

    from harness.cli import compose_plan
    from harness.plan import Plan

    plan = compose_plan([f"output_root={tmp_path}", "arm=papo", "seed=2"])
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.parent == plan.parent and again.parent.kind == "sft" and again.kind.samples


def test_periodic_eval_is_refused_where_rank_0_cannot_generate_alone(plan_of):
    for placement in ("placement=fsdp", "placement=deepspeed_zero3"):
        with pytest.raises(ConfigError) as err:
            plan_of(placement, "train.eval_steps=50")
        p = next(p for p in err.value.problems if p.field == "train.eval_steps")
        assert "rank 0 alone" in p.why and "placement=ddp" in p.fix
    plan = plan_of("placement=ddp", "placement.num_processes=2", "train.eval_steps=50")
    assert plan.checkpoints["kept_for_eval"].startswith("every 50 steps")
    assert "kept_for_eval" not in plan_of().checkpoints
    # an observation: not in the semantic identity (the same run, with or without the curve)
    assert plan_of("train.eval_steps=50").identity["semantic_sha256"] == plan_of().identity["semantic_sha256"]


def test_the_sweep_objective_is_a_report_metric(plan_of):
    assert plan_of().config["objective"] == "eval/accuracy"
    assert plan_of("objective=eval/FULL/accuracy").identity["semantic_sha256"] == plan_of().identity["semantic_sha256"]
    with pytest.raises(ConfigError) as err:
        plan_of("objective=eval/acuracy")
    (p,) = [p for p in err.value.problems if p.field == "objective"]
    assert "did you mean objective=eval/accuracy?" in p.fix

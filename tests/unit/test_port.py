"""python -m harness.port: recipes modelled on the public ones (tests/fixtures/port/, each says which), every leaf
field reported once, refusals with the field and a fix, the JSON schema, exit codes, and the import boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.port import port
from harness.port.core import CLASSES, SCHEMA_DIR, _leaves
from tests.conftest import REPO, heavy_imports

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "port"
TINY = ["model=tiny_vlm", "data=synthetic"]
# examples/papo_grpo/qwen2_5_vl_3b_grpo_papo.sh of the PAPO fork, as its launch script passes them
PAPO_LAUNCH = ["data.train_files=PAPOGalaxy/PAPO_ViRL39K_train", "data.val_files=PAPOGalaxy/PAPO_MMK12_test",
               "data.rollout_batch_size=384", "data.format_prompt=examples/format_prompt/math_perception.jinja",
               "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct", "worker.rollout.tensor_parallel_size=1",
               "worker.actor.global_batch_size=128", "trainer.experiment_name=qwen2_5_vl_3b__grpo__papo",
               "trainer.n_gpus_per_node=2", "trainer.total_epochs=2",
               "worker.reward.reward_function=examples/reward_function/math.py:compute_score",
               "data.max_prompt_length=4096", "algorithm.kl_prcp_coef=0.02"]
# examples/qwen2_5_vl_7b_geo3k_dapo.sh of EasyR1
DAPO_LAUNCH = ["data.mini_rollout_batch_size=128", "worker.actor.clip_ratio_low=0.2", "worker.actor.clip_ratio_high=0.28",
               "algorithm.disable_kl=True", "algorithm.online_filtering=True"]


@pytest.fixture(autouse=True)
def in_recipe_checkout(monkeypatch):
    """The port runs where the recipe's launch script runs: its relative reward-function paths (examples/
    reward_function/*.py, files modelled on EasyR1's and verl's) resolve under tests/fixtures/port/."""
    monkeypatch.chdir(FIX)


def by_field(result) -> dict:
    return {e.field: e for e in result.entries}


def values(result) -> dict:
    return dict(result.values)


def schema_leaves(source: str) -> set[str]:
    return set(_leaves(yaml.safe_load((SCHEMA_DIR / f"{source}.yaml").read_text())))


# --- the recipes


def test_papo_recipe_with_its_launch_overrides_maps_to_the_papo_arm():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), PAPO_LAUNCH, TINY)
    assert r.runnable, [p.render() for p in r.problems]
    v, f = values(r), by_field(r)
    assert v["arm"] == "papo" and v["arm.init"] == "scratch"
    assert v["arm.gamma"] == 0.02  # the launch script's kl_prcp_coef wins over the file's 0.01
    assert (v["arm.mask_ratio"], v["arm.patch_size"]) == (0.6, 14)  # aug_config.black_prob / patch_size
    assert (v["arm.eta1"], v["arm.eta2"]) == (0.0, 0.0)  # both *_entropy_loss off
    assert v["arm.beta"] == 0.01 and v["arm.num_generations"] == 5
    # 384 prompts per rollout, 128 per optimizer step: 3 steps per generation round
    assert (v["arm.prompts_per_step"], v["arm.steps_per_generation"]) == (128, 3)
    assert v["arm.epsilon_high"] == 0.3  # EasyR1's default clip_ratio_high, not 0.2
    assert v["arm.max_completion_length"] == 2048 and v["arm.mask_truncated_completions"] is False
    # 2 epochs x floor(3600 synthetic train views / 384) = 18 rollouts x 3 steps; tokens: every completion at max length
    assert v["budget.max_steps"] == 18 * 3 and v["budget.max_completion_tokens"] == 18 * 384 * 5 * 2048
    assert f["algorithm.kl_prcp_coef"].cls == "exact" and f["algorithm.kl_prcp_coef"].harness == "arm.gamma"
    assert f["algorithm.kl_prcp_coef"].origin == "override" and f["algorithm.kl_coef"].origin == "config"
    assert f["data.rollout_batch_size"].cls == "semantically_conformant"
    assert "3600 training rows" in f["trainer.total_epochs"].note
    assert f["worker.actor.model.model_path"].note.startswith("replaced on purpose")
    # the launch script's reward function, called as EasyR1 calls it
    assert (v["reward._target_"], v["reward.convention"]) == ("examples/reward_function/math.py:compute_score", "easyr1")
    assert "reward.kwargs" not in v  # reward_function_kwargs empty
    rf = f["worker.reward.reward_function"]
    assert (rf.cls, rf.harness, rf.origin) == ("exact", "reward._target_", "override")
    assert "read relative to the directory the harness runs in (found from here)" in rf.note
    assert "REWARD_TYPE = 'batch'" in rf.note and "<answer>" in rf.note
    assert f["worker.reward.reward_type"].cls == "exact"  # the fork's batch = the file's REWARD_TYPE
    assert {"reward._target_=examples/reward_function/math.py:compute_score", "reward.convention=easyr1"} <= set(r.overrides)


def test_papo_recipe_without_harness_data_is_refused_with_the_convert_command():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), PAPO_LAUNCH, ["model=tiny_vlm"])
    assert not r.runnable
    p = next(p for p in r.problems if p.field == "data.train_files")
    assert "convert-hf HF_DIR --out DIR --image-column images --question-column problem --answer-column answer" in p.fix
    assert "load_dataset('PAPOGalaxy/PAPO_ViRL39K_train')" in p.fix
    assert not any(p.field == "data.path" for p in r.problems)  # the port's own problem, not the plan's echo of it


def test_papo_recipe_on_its_own_model_plans_a_qwen_full_fine_tune():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), PAPO_LAUNCH, ["data=synthetic"])
    v = values(r)
    assert (v["model"], v["model.hub_id"], v["model.family"], v["model.tuning"]) == (
        "qwen", "Qwen/Qwen2.5-VL-3B-Instruct", "qwen2_5_vl", "full")


def test_grpo_recipe_verl():
    r = port("verl", str(FIX / "verl_grpo.yaml"), [], TINY)
    assert r.runnable, [p.render() for p in r.problems]
    v, f = values(r), by_field(r)
    assert v["arm"] == "grpo" and "arm.gamma" not in v
    assert (v["arm.prompts_per_step"], v["arm.steps_per_generation"], v["arm.num_generations"]) == (128, 4, 5)
    assert v["arm.beta"] == 0.01 and v["arm.loss_type"] == "dapo" and v["arm.scale_rewards"] == "group"
    assert (v["arm.epsilon"], v["arm.epsilon_high"]) == (0.2, 0.2)
    assert v["arm.top_k"] == 0 and f["actor_rollout_ref.rollout.top_k"].cls == "semantically_conformant"
    assert v["train.save_steps"] == 20 * 4  # save_freq counts rollouts
    assert v["train.eval_steps"] == 5 * 4 and f["trainer.test_freq"].cls == "semantically_conformant"  # test_freq too
    assert f["actor_rollout_ref.actor.fsdp_config.param_offload"].cls == "distributed_only"
    assert f["critic.optim.lr"].cls == "informational_only"
    assert f["actor_rollout_ref.actor.clip_ratio_c"].cls == "not_implemented"


def test_dapo_recipe_verl_clip_higher_exact_dynamic_sampling_not_implemented():
    r = port("verl", str(FIX / "verl_dapo.yaml"), [], TINY)
    assert r.runnable, [p.render() for p in r.problems]
    v, f = values(r), by_field(r)
    assert (v["arm.epsilon"], v["arm.epsilon_high"]) == (0.2, 0.28)
    for name in ("clip_ratio_low", "clip_ratio_high"):
        assert f["actor_rollout_ref.actor." + name].cls == "exact"
    assert f["actor_rollout_ref.actor.clip_ratio"].cls == "informational_only"  # superseded by low/high
    for name in ("algorithm.filter_groups.enable", "algorithm.filter_groups.metric", "data.gen_batch_size"):
        assert f[name].cls == "not_implemented", name
    assert "zero advantage" in f["algorithm.filter_groups.enable"].note
    assert v["arm.loss_type"] == "dapo" and v["arm.beta"] == 0.0
    # lr_warmup_steps (10 rollouts of 7 here) turns the constant schedule into constant_with_warmup
    assert v["arm.lr_scheduler_type"] == "constant_with_warmup" and v["arm.warmup_ratio"] == 0.99
    assert f["actor_rollout_ref.rollout.val_kwargs.top_p"].cls == "locally_lowered"  # the harness evals greedily


def test_dapo_recipe_easyr1_with_its_launch_overrides():
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), DAPO_LAUNCH, TINY)
    assert r.runnable, [p.render() for p in r.problems]
    v, f = values(r), by_field(r)
    assert (v["arm.epsilon"], v["arm.epsilon_high"], v["arm.beta"]) == (0.2, 0.28, 0.0)
    assert f["algorithm.online_filtering"].cls == "not_implemented"
    assert f["data.mini_rollout_batch_size"].cls == "not_implemented"
    assert f["algorithm.kl_coef"].cls == "informational_only"  # disable_kl: inactive
    assert f["worker.actor.model.lora.target_modules"].cls == "informational_only"  # LoRA rank 0: inactive
    assert (v["reward._target_"], v["reward.convention"]) == ("./examples/reward_function/math.py:compute_score", "easyr1")
    assert f["worker.reward.reward_type"].cls == "informational_only"  # upstream EasyR1 reads the module's REWARD_TYPE


# --- the recipe's reward function

# examples/qwen3_14b_dapo17k_dapo.sh of EasyR1: dapo.py's compute_score takes three required keyword arguments
DAPO17K_REWARD = ["worker.reward.reward_function=./examples/reward_function/dapo.py:compute_score",
                  'worker.reward.reward_function_kwargs={"max_response_length":20480,"overlong_buffer_length":4096,'
                  '"overlong_penalty_factor":1.0}']
DAPO17K_KWARGS = {"max_response_length": 20480, "overlong_buffer_length": 4096, "overlong_penalty_factor": 1.0}


def test_easyr1_reward_function_kwargs_map_to_reward_kwargs():
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), DAPO_LAUNCH + DAPO17K_REWARD, TINY)
    v, f = values(r), by_field(r)
    assert v["reward._target_"] == "./examples/reward_function/dapo.py:compute_score"
    assert v["reward.kwargs"] == DAPO17K_KWARGS
    for name in DAPO17K_KWARGS:
        e = f["worker.reward.reward_function_kwargs." + name]
        assert (e.cls, e.harness) == ("exact", "reward.kwargs")


def test_easyr1_reward_function_kwargs_compose():
    from harness.config.compose import compose

    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), DAPO_LAUNCH + DAPO17K_REWARD, TINY)
    assert r.runnable, [p.render() for p in r.problems]
    cfg, _ = compose(r.overrides)
    assert dict(cfg.reward.kwargs) == DAPO17K_KWARGS


def test_easyr1_reward_function_without_a_name_is_main_and_planned():
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), ["worker.reward.reward_function=examples/reward_function/math.py"],
             TINY)
    assert values(r)["reward._target_"] == "examples/reward_function/math.py:main"  # EasyR1's default name
    assert "main, EasyR1's default" in by_field(r)["worker.reward.reward_function"].note
    # the plan reads the file: it defines no main, so the port is refused with the plan's reason
    assert any(p.field == "reward._target_" and "main" in p.why for p in r.problems)


def test_papo_fork_reward_type_must_match_the_module_declaration():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), PAPO_LAUNCH + ["worker.reward.reward_type=sequential"], TINY)
    p = next(p for p in r.problems if p.field == "worker.reward.reward_type")
    assert "REWARD_TYPE = 'batch'" in p.why and "REWARD_TYPE = 'sequential'" in p.fix
    assert by_field(r)["worker.reward.reward_type"].cls == "unsupported"


def test_easyr1_reward_function_with_special_tokens_refused():
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), ["worker.reward.skip_special_tokens=false"], TINY)
    assert [p.field for p in r.problems] == ["worker.reward.skip_special_tokens"]


def test_easyr1_missing_reward_file_reported_in_the_note(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the recipe's checkout
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), DAPO_LAUNCH, TINY)
    assert "not found from here" in by_field(r)["worker.reward.reward_function"].note
    assert values(r)["reward._target_"] == "./examples/reward_function/math.py:compute_score"


@pytest.mark.parametrize("section", ["reward.custom_reward_function", "custom_reward_function"])
def test_verl_custom_reward_function_maps_to_the_verl_convention(section):
    r = port("verl", str(FIX / "verl_grpo.yaml"), [f"{section}.path=examples/reward_function/gsm8k.py"], TINY)
    assert r.runnable, [p.render() for p in r.problems]
    v, f = values(r), by_field(r)
    assert (v["reward._target_"], v["reward.convention"]) == ("examples/reward_function/gsm8k.py:compute_score", "verl")
    e = f[f"{section}.path"]
    assert (e.cls, e.harness) == ("semantically_conformant", "reward._target_") and "found from here" in e.note
    assert f[f"{section}.name"].harness == "reward._target_"  # null (legacy) or compute_score: verl's default
    other = "custom_reward_function" if section.startswith("reward.") else "reward.custom_reward_function"
    assert f[f"{other}.path"].cls == "informational_only"
    assert "reward._target_=examples/reward_function/gsm8k.py:compute_score" in r.overrides


def test_verl_legacy_section_replaces_the_new_one_and_pkg_paths_are_modules():
    r = port("verl", str(FIX / "verl_grpo.yaml"), ["reward.custom_reward_function.path=examples/reward_function/math.py",
                                                   "custom_reward_function.path=pkg://harness.rewards",
                                                   "custom_reward_function.name=answer_reward"], TINY)
    v, f = values(r), by_field(r)
    assert v["reward._target_"] == "harness.rewards:answer_reward"  # verl v0.9's migration: the legacy section wins
    assert f["reward.custom_reward_function.path"].note.startswith("superseded")
    assert "imported from the Python path" in f["custom_reward_function.path"].note


def test_verl_without_custom_reward_function_keeps_the_harness_reward():
    r = port("verl", str(FIX / "verl_grpo.yaml"), [], TINY)
    assert "reward._target_" not in values(r)
    e = by_field(r)["reward.custom_reward_function.path"]
    assert e.cls == "not_implemented" and "default_compute_score" in e.note


def test_verl_reward_kwargs_map_to_reward_kwargs():
    """verl reads custom_reward_function.reward_kwargs with .get() (verl/trainer/ppo/reward.py), which launch scripts
    add with +; the port's schema has the key (empty), so it maps to reward.kwargs, and the ported overrides plan."""
    r = port("verl", str(FIX / "verl_grpo.yaml"), ["reward.custom_reward_function.path=examples/reward_function/gsm8k.py",
                                                   "+reward.custom_reward_function.reward_kwargs.format_score=0.1"], TINY)
    v, f = values(r), by_field(r)
    assert v["reward.kwargs"] == {"format_score": 0.1}
    assert f["reward.custom_reward_function.reward_kwargs.format_score"].harness == "reward.kwargs"
    assert "+reward.kwargs={format_score:0.1}" in r.overrides


def test_ported_reward_overrides_parse_as_hydra_overrides():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), DAPO_LAUNCH, TINY)
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(r.overrides)}
    assert parsed["reward._target_"] == "./examples/reward_function/math.py:compute_score"
    assert parsed["reward.convention"] == "easyr1"


# --- every field once, one of the seven classes


@pytest.mark.parametrize("source,fixture,overrides", [
    ("verl", "verl_grpo.yaml", []), ("verl", "verl_dapo.yaml", []),
    ("easyr1", "easyr1_grpo_papo.yaml", PAPO_LAUNCH), ("easyr1", "easyr1_dapo.yaml", DAPO_LAUNCH)])
def test_every_leaf_reported_once(source, fixture, overrides):
    r = port(source, str(FIX / fixture), overrides, TINY)
    names = [e.field for e in r.entries]
    assert len(names) == len(set(names))
    recipe = set(_leaves(yaml.safe_load((FIX / fixture).read_text())))
    expected = (schema_leaves(source) - {p for p in schema_leaves(source) if any(q.startswith(p + ".") for q in recipe)}
                ) | recipe
    # interpolated sections of verl (rollout.qat, rollout.mtp) resolve to their leaves
    assert expected - set(names) <= {p for p in expected if p.endswith((".qat", ".mtp"))}
    assert {e.cls for e in r.entries} <= set(CLASSES)
    assert all(e.note for e in r.entries)


# --- refusals


def test_misspelled_override_refused_naming_the_key_and_its_close_match():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), ["algorithm.kl_prcp_cof=0.02"], TINY)
    p = next(p for p in r.problems if p.field == "algorithm.kl_prcp_cof")
    assert "has no field" in p.why and p.fix == "did you mean algorithm.kl_prcp_coef?"
    r = port("verl", str(FIX / "verl_grpo.yaml"), ["+actor_rollout_ref.actor.clip_ratio_hgh=0.28"], TINY)
    assert any(p.field == "actor_rollout_ref.actor.clip_ratio_hgh" and "clip_ratio_high" in p.fix for p in r.problems)


def test_unknown_field_in_the_recipe_file_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIX / "easyr1_dapo.yaml").read_text().replace("  rollout_batch_size: 512", "  rollout_bach_size: 512"))
    r = port("easyr1", str(bad), [], TINY)
    p = next(p for p in r.problems if p.field == "data.rollout_bach_size")
    assert p.fix == "did you mean data.rollout_batch_size?" and str(bad) in p.why


@pytest.mark.parametrize("override,field", [
    ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
    ("algorithm.kl_prcp_schedule=annealing", "algorithm.kl_prcp_schedule"),
    ("worker.actor.optim.betas=[0.9,0.95]", "worker.actor.optim.betas"),
    ("algorithm.use_kl_loss=false", "algorithm.use_kl_loss")])  # KL in the reward
def test_unsupported_value_refused(override, field):
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), [override], TINY)
    assert not r.runnable
    p = next(p for p in r.problems if p.field == field)
    assert "cannot be honoured" in p.why or "harness" in p.why
    assert by_field(r)[field].cls == "unsupported" and p.fix


def test_verl_entropy_bonus_refused():
    r = port("verl", str(FIX / "verl_grpo.yaml"), ["actor_rollout_ref.actor.entropy_coeff=0.01"], TINY)
    assert [p.field for p in r.problems] == ["actor_rollout_ref.actor.entropy_coeff"]


def test_overrides_that_do_not_plan_become_problems():
    # 6 prompts per rollout over 4 per step: the source refuses it, and so does the port
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), ["data.rollout_batch_size=6", "worker.actor.global_batch_size=4"], TINY)
    assert any(p.field == "worker.actor.global_batch_size" for p in r.problems)
    # a harness knob out of its bounds: the plan's ConfigError, as a problem of the port
    r = port("easyr1", str(FIX / "easyr1_dapo.yaml"), ["worker.rollout.n=1"], TINY)
    assert any(p.field == "arm.num_generations" and "do not plan" in p.why for p in r.problems)


def test_harness_group_replaces_what_the_recipe_says_of_it():
    r = port("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), PAPO_LAUNCH, TINY)
    assert not any(k.startswith("model.") for k in r.values)  # no family / hub id of the recipe's checkpoint
    assert r.overrides[:3] == ["arm=papo", "model=tiny_vlm", "data=synthetic"]


# --- the CLI: JSON, exit codes, no traceback, the preset, the import boundary


def _cli(*args, cwd=FIX, importtime=False):
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "harness.port", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_cli_json_schema_exit_0_and_torch_free():
    proc = _cli("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), *PAPO_LAUNCH, "--harness", "model=tiny_vlm",
                "--harness", "data=synthetic", "--json", importtime=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert set(out) == {"source", "overrides", "fields", "runnable", "problems"}
    assert out["source"] == "easyr1" and out["runnable"] is True and out["problems"] == []
    assert all(set(e) == {"field", "value", "class", "harness", "note", "origin"} for e in out["fields"])
    assert "arm.gamma=0.02" in out["overrides"]
    assert heavy_imports(proc.stderr) == []


def test_cli_refusal_exit_2_lists_every_problem_without_traceback():
    proc = _cli("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), "algorithm.kl_prcp_cof=0.02",
                "algorithm.adv_estimator=gae", "--harness", "model=tiny_vlm", "--harness", "data=synthetic", "--json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["runnable"] is False
    assert {p["field"] for p in out["problems"]} >= {"algorithm.kl_prcp_cof", "algorithm.adv_estimator"}
    assert all(set(p) == {"field", "value", "why", "fix"} for p in out["problems"])
    assert "PortError: 2 problems" in proc.stderr and "fix: did you mean algorithm.kl_prcp_coef?" in proc.stderr


@pytest.mark.parametrize("args", [("nemo", "x.yaml"), ("verl", "/no/such/recipe.yaml"), ("easyr1",)])
def test_cli_bad_arguments_exit_2_without_traceback(args):
    proc = _cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_cli_table_and_preset(tmp_path):
    out = tmp_path / "ported_papo.yaml"
    proc = _cli("easyr1", str(FIX / "easyr1_grpo_papo.yaml"), *PAPO_LAUNCH, "--harness", "model=tiny_vlm",
                "--harness", "data=synthetic", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("easyr1: 236 fields") and "algorithm.kl_prcp_coef" in proc.stdout
    text = out.read_text()
    assert text.splitlines()[0] == "# @package _global_"
    assert "python -m harness experiment=ported_papo" in text and "python -m harness.port easyr1" in text
    preset = yaml.safe_load(text)
    assert preset["defaults"] == [{"override /arm": "papo"}, {"override /model": "tiny_vlm"},
                                  {"override /data": "synthetic"}]
    assert preset["arm"]["gamma"] == 0.02 and preset["arm"]["init"] == "scratch"
    assert sum(1 for line in text.splitlines() if line.startswith("# algorithm.kl_prcp_coef ")) == 1  # the report
    assert not (REPO / "conf" / "experiment" / "ported_papo.yaml").exists()

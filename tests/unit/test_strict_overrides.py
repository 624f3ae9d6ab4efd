"""Strict overrides (issue 12, item 5): a key the schema lacks is a ConfigError (exit 2) naming the closest valid key,
with `+`, `++` or neither; every compose error exits 2 in the house form (`field = value: why` / `fix:`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.errors import ConfigError
from tests.conftest import REPO, heavy_imports, run_harness


def _refused(proc, field: str, fix: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "ConfigError" in proc.stderr and f"- {field} = " in proc.stderr, proc.stderr
    assert "fix:" in proc.stderr and fix in proc.stderr, proc.stderr


# --- the CLI, single job (the compose API path)


@pytest.mark.parametrize("args, field, fix", [
    (["+arm.lamda_direction=0.5", "arm=evi_po"], "arm.lamda_direction", "did you mean arm.lambda_direction?"),
    (["++arm.lamda_direction=0.5", "arm=evi_po"], "arm.lamda_direction", "did you mean arm.lambda_direction?"),
    (["arm.lamda_direction=0.5", "arm=evi_po"], "arm.lamda_direction", "did you mean arm.lambda_direction?"),
    (["model.tiny.hiden_size=3"], "model.tiny.hiden_size", "did you mean model.tiny.hidden_size?"),
    (["+model.tiny.hiden_size=3"], "model.tiny.hiden_size", "did you mean model.tiny.hidden_size?"),
    (["+sed=1"], "sed", "did you mean seed?"),
    (["arm=grppo"], "arm", "did you mean arm=grpo?"),
    (["arm.learning_rate=abc"], "arm.learning_rate", "arm.learning_rate takes a float"),
    (["model.tuning=qlor"], "model.tuning", "did you mean model.tuning=lora?"),
    # valid for another arm only: say which
    (["+arm.lambda_direction=0.5"], "arm.lambda_direction", "arm.lambda_direction is a key of arm=evi_po only"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_cli_refuses_unknown_keys_and_bad_values_exit_2(args, field, fix):
    _refused(run_harness("mode=plan", *args), field, fix)


def test_valid_add_and_force_add_keep_working(tmp_path):
    proc = run_harness("mode=plan", f"output_root={tmp_path}", "++arm.learning_rate=1e-3", "arm=evi_po", "++arm.tau=2",
                       "++model.tiny.hidden_size=64", "model.lora_target_modules=[q_proj,v_proj]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout)["config"]
    assert cfg["arm"]["learning_rate"] == 1e-3 and cfg["arm"]["tau"] == 2.0
    assert cfg["model"]["tiny"]["hidden_size"] == 64 and cfg["model"]["lora_target_modules"] == ["q_proj", "v_proj"]


def test_refusal_is_torch_free():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "mode=plan",
                           "+arm.lamda_direction=0.5"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and heavy_imports(proc.stderr) == []


# --- the hydra.main path (flags, hydra.* overrides, -m)


@pytest.mark.parametrize("args, field, fix", [
    (["--cfg", "job", "+arm.lamda_direction=0.5", "arm=evi_po"], "arm.lamda_direction", "arm.lambda_direction?"),
    (["--cfg", "job", "arm.learning_rate=abc"], "arm.learning_rate", "takes a float"),
    (["mode=plan", "hydra.job.chdir=false", "++sed=1"], "sed", "did you mean seed?"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_hydra_main_path_refuses_alike(args, field, fix):
    _refused(run_harness(*args), field, fix)


def test_hydra_main_path_accepts_valid_overrides():
    proc = run_harness("--cfg", "job", "++arm.learning_rate=1e-3", "hydra.job.chdir=false")
    assert proc.returncode == 0 and "learning_rate: 0.001" in proc.stdout, proc.stderr[-2000:]


def test_multirun_job_with_an_added_unknown_key_is_a_recorded_failed_job(tmp_path):
    proc = run_harness("-m", "mode=plan", f"output_root={tmp_path}", "seed=0,1", "+arm.lamda_direction=0.5",
                       "arm=evi_po")
    assert proc.returncode == 1 and "2 failed job(s)" in proc.stderr and "Traceback" not in proc.stderr
    assert "did you mean arm.lambda_direction?" in proc.stderr
    (sweep,) = (tmp_path / "sweeps").iterdir()
    for n in (0, 1):
        job = json.loads((sweep / "jobs" / f"{n}.json").read_text())
        assert job["status"] == "failed" and job["exit_code"] == 2 and job["run_dir"] is None


@pytest.mark.parametrize("args, field, fix", [
    (["arm.lamda_direction=0.1,0.2"], "arm.lamda_direction", "did you mean arm.lambda_direction?"),
    (["arm=grpo,grppo"], "arm", "did you mean arm=grpo?"),
    (["logger=[wandb,tensorbord]"], "logger", "did you mean logger=tensorboard?"),  # a list of options
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_multirun_that_no_job_could_compose_is_refused_before_it_starts(tmp_path, args, field, fix):
    proc = run_harness("-m", "mode=plan", f"output_root={tmp_path}", "seed=0,1", *args)
    _refused(proc, field, fix)
    assert not (tmp_path / "sweeps").exists()


# --- the checker itself


def test_check_composed_names_the_closest_key(compose_cfg):
    from harness.config.overrides import check_composed

    argv = ["arm=evi_po", "+arm.lamda_direction=0.5", "++model.tiny.hiden_size=3", "+sed=1", "++arm.tau=2",
            "model.lora_target_modules=[a]", "hydra.job.chdir=false"]
    cfg, _ = compose_cfg(*[a for a in argv if not a.startswith("hydra")])
    problems = check_composed(cfg, argv)
    assert [(p.field, p.value) for p in problems] == [
        ("arm.lamda_direction", "0.5"), ("model.tiny.hiden_size", "3"), ("sed", "1")]
    assert [p.fix.split("?")[0] for p in problems] == [
        "did you mean arm.lambda_direction", "did you mean model.tiny.hidden_size", "did you mean seed"]
    assert "`+` cannot add" in problems[0].why and "`++` cannot add" in problems[1].why


def test_check_composed_uses_the_chosen_option(compose_cfg):
    from harness.config.overrides import check_composed

    cfg, _ = compose_cfg("+arm.gamma=0.1")  # default arm=grpo: gamma is a PAPO key
    (p,) = check_composed(cfg, ["+arm.gamma=0.1"])
    assert "GrpoArm" in p.why and "arm=papo" in p.fix
    cfg, _ = compose_cfg("arm=papo", "++arm.gamma=0.1")
    assert check_composed(cfg, ["arm=papo", "++arm.gamma=0.1"]) == []


def test_key_problem_without_a_composed_config():
    from harness.config.overrides import key_problem

    assert key_problem("arm.lambda_direction", "1") is None  # some arm has it
    assert key_problem("model.lora_target_modules.0", "x") is None  # inside a list: free-form
    assert key_problem("reward.correct", "1") is None and key_problem("train.save_steps", "2") is None
    p = key_problem("arm.lamda_direction", "1")
    assert p.field == "arm.lamda_direction" and "arm.lambda_direction" in p.fix
    p = key_problem("seed.x", "1")
    assert "seed is an int value" in p.why


def test_check_static_leaves_added_keys_to_each_job():
    from harness.config.overrides import check_static

    assert check_static(["+arm.lamda_direction=0.5", "seed=0,1", "arm=grpo,evi_po", "hydra.launcher.n_jobs=2",
                         "hydra/launcher=joblib", "sweep=arms_x_seeds"]) == []
    fields = [p.field for p in check_static(["arm.lamda_direction=0.5", "sed=0,1", "arm=grpo,grppo", "debug=tinyy"])]
    assert fields == ["arm.lamda_direction", "sed", "arm", "debug"]
    # a plain key must exist in every arm named on the command line, and, when arm is swept, in the default
    # arm too (hydra.main composes a multirun once without its sweeps); `++` composes there
    assert check_static(["arm=evi_po", "arm.lambda_direction=0.1,0.2"]) == []
    (p,) = check_static(["arm=evi_po,grpo", "seed=0"] + ["arm.lambda_direction=0.1"])
    assert p.field == "arm.lambda_direction" and "arm=grpo" in p.why
    (p,) = check_static(["arm=evi_po,papo", "arm.kappa=0.3"])
    assert "default arm=grpo" in p.why and "++arm.kappa=0.3" in p.fix
    assert check_static(["arm=evi_po,papo", "++arm.kappa=0.3"]) == []
    (p,) = check_static(["seed=0,1", "arm.lambda_direction=0.1"])  # the default arm=grpo lacks it
    assert "default arm=grpo" in p.why
    assert check_static(["sweep=evi_po_ablation", "arm.lambda_direction=0.1"]) == []  # the sweep picks evi_po


@pytest.mark.parametrize("override, field, fix", [
    ("arm.lamda_direction=0.5", "arm.lamda_direction", "arm.lambda_direction is a key of arm=evi_po only"),
    ("armm=grpo", "armm", "did you mean arm?"),
    ("arm=xyzzy", "arm", "use one of: evi_po, grpo, opd, papo, sft"),
    ("arm.num_generations=eight", "arm.num_generations", "takes an int"),
    ("mode=dryrun", "mode", "mode takes one of: train, plan"),
    ("+arm.learning_rate=1e-3", "arm.learning_rate", "++arm.learning_rate=1e-3"),
    ("++model.tiny={hiden_size: 3}", "model.tiny.hiden_size", "did you mean model.tiny.hidden_size?"),
    ("arm.learning_rate.x=1", "arm.learning_rate.x", "set arm.learning_rate=... itself"),
    ("arm.learning_rate=[", "override", "override_grammar"),
])
def test_explain_compose_error_in_the_house_form(override, field, fix):
    from harness.cli import compose

    with pytest.raises(ConfigError) as err:
        compose(["mode=plan", override])
    assert err.value.exit_code == 2
    (p,) = err.value.problems
    assert p.field == field and fix in p.fix, err.value.render()


def test_compose_plan_is_strict_and_its_derived_compose_still_works(tmp_path):
    from harness.cli import compose_plan

    with pytest.raises(ConfigError):
        compose_plan([f"output_root={tmp_path}", "++arm.lamda_direction=0.5"])
    plan = compose_plan([f"output_root={tmp_path}", "arm=evi_po", "++arm.tau=2", "debug=tiny", "seed=3"])
    # the SFT warm start's derived compose (harness.plan.sft_parent): arm.* dropped, arm=sft added
    sft = plan.parent
    assert sft.config["arm"]["name"] == "sft" and sft.config["seed"] == 3

"""Every option of every group composes and plans (or is refused with a named reason); typos fail at compose time."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ValidationError

from arms import registry
from harness.errors import ConfigError
from harness.config.schema import SCHEMAS, Config, iter_fields
from tests.conftest import CONF

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")  # hydra/: launcher configs
OPTIONS = [(g, y.stem) for g in GROUPS for y in sorted((CONF / g).glob("*.yaml"))]

def _refused_here() -> dict:
    """Options this machine refuses at plan time, and the field the refusal must name: derived from what the
    machine has (CUDA, vllm, deepspeed, the checkpoint in the HF cache), so a GPU node does not fail them."""
    import importlib.util

    from harness.config.checks import cuda_visible, find_cached_snapshot

    gpu, has = cuda_visible(), (lambda m: importlib.util.find_spec(m) is not None)
    out = {}
    qwen = OmegaConf.load(CONF / "model" / "qwen.yaml")
    if not qwen.get("path") and find_cached_snapshot(qwen.get("hub_id")) is None:
        out[("model", "qwen")] = "model.hub_id"  # no real checkpoint in the local HF cache
    if not (gpu and has("vllm")):
        out.update({("rollout", "vllm_colocate"): "rollout", ("rollout", "vllm_server"): "rollout"})
    if not (gpu and has("deepspeed")):
        out.update({("placement", "deepspeed"): "placement", ("placement", "deepspeed_zero3"): "placement"})
    if not gpu:
        out[("placement", "fsdp")] = "placement"  # on CPU the Trainer would silently run plain DDP
    return out


REFUSED_HERE = _refused_here()


def test_groups_are_the_designed_ones():
    assert GROUPS == ["arm", "budget", "data", "debug", "experiment", "logger", "model", "placement", "rollout"]
    assert {g: sorted(y.stem for y in (CONF / g).glob("*.yaml")) for g in GROUPS} == {
        "arm": ["evi_po", "grpo", "opd", "papo", "sft"],
        "budget": ["default"],
        "data": ["jsonl", "synthetic"],
        "debug": ["tiny"],
        "experiment": ["comparison", "evi_po_direction_only", "tune_papo"],
        "logger": ["jsonl", "none", "tensorboard", "trackio", "wandb"],
        "model": ["qwen", "tiny_lm", "tiny_vlm"],
        "placement": ["ddp", "deepspeed", "deepspeed_zero3", "fsdp", "single"],
        "rollout": ["async", "hf", "vllm_colocate", "vllm_server"],
    }


def test_defaults(compose_cfg):
    _, choices = compose_cfg()
    assert {k: choices[k] for k in ("arm", "model", "data", "rollout", "placement", "logger")} == {
        "arm": "grpo", "model": "tiny_vlm", "data": "synthetic", "rollout": "hf", "placement": "single", "logger": "jsonl"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_plans(plan_of, tmp_path, group, option):
    extra = []
    if (group, option) == ("data", "jsonl"):  # a sealed dataset of one's own
        from harness.data.manifest import seal_dataset
        from tests.own_data import write_colour_set

        seal_dataset(write_colour_set(tmp_path / "mine", n=6, n_test=2), fill_digests=True)
        extra = [f"data.path={tmp_path / 'mine'}"]
    if (group, option) in REFUSED_HERE:
        with pytest.raises(ConfigError) as err:
            plan_of(f"{group}={option}", *extra)
        assert any(p.field == REFUSED_HERE[(group, option)] for p in err.value.problems), err.value.render()
        return
    plan = plan_of(f"{group}={option}", *extra)
    assert plan.choices[group] == option
    if group not in ("debug", "budget", "experiment"):
        assert plan.config[group]["name"] == option
    if (group, option) == ("arm", "opd"):  # its default teacher (arm.teacher=grpo) is planned with it
        assert plan.teacher is not None and plan.teacher.config["arm"]["name"] == "grpo"


def test_an_arms_kind_is_one_object_the_plan_carries_as_is():
    """ArmSpec takes the kind by name and keeps harness.kinds' object (one KINDS): the plan's kind is the very object,
    and a kind that does not exist is refused with the arm's name and the kinds there are."""
    from arms.common import ArmSpec
    from harness import kinds

    for spec in registry().values():
        assert isinstance(spec.kind, kinds.Kind) and type(spec.kind) is kinds.KINDS[spec.kind]
    assert registry()["grpo"].kind.samples and not registry()["sft"].kind.samples
    with pytest.raises(ValueError, match=r"arm odd: unknown arm kind 'distill': one of \['rl', 'sft'\]"):
        ArmSpec("odd", kind="distill", config=object, summary="")


def test_arm_registry_conf_and_schemas_share_names():
    assert set(registry()) == {y.stem for y in (CONF / "arm").glob("*.yaml")} == set(SCHEMAS["arm"])


def test_every_schema_field_has_one_line_help():
    classes = [Config] + [c for schemas in SCHEMAS.values() for c in schemas.values()]
    missing = [f"{c.__name__}.{p}" for c in classes for p, fld in iter_fields(c)
               if not fld.metadata.get("help") and not p.split(".")[0] in SCHEMAS]
    assert missing == []
    multi = [p for c in classes for p, fld in iter_fields(c) if "\n" in fld.metadata.get("help", "")]
    assert multi == []


@pytest.mark.parametrize("override,exc", [
    ("arm.learning_rat=1e-3", ConfigCompositionException),  # misspelled key
    ("armm=grpo", ConfigCompositionException),  # misspelled group
    ("arm=nope", MissingConfigException),  # unknown option
    ("arm.num_generations=eight", ConfigCompositionException),  # wrong type
    ("model.tuning=qlora", ConfigCompositionException),  # not in the enum
    ("mode=dryrun", ConfigCompositionException),
])
def test_typos_fail_at_compose_time(compose_cfg, override, exc):
    with pytest.raises(exc):
        compose_cfg(override)


def test_wrong_type_names_the_field(compose_cfg):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg("arm.num_generations=eight")
    assert isinstance(err.value.__cause__, ValidationError)
    assert "arm.num_generations" in str(err.value.__cause__)


def test_schema_defaults_are_valid_values():
    """A default outside its own declared bounds would make every run fail plan."""
    for schemas in SCHEMAS.values():
        for cls in schemas.values():
            for path, fld in iter_fields(cls):
                d = fld.default
                if isinstance(d, (int, float)) and not isinstance(d, bool):
                    for key, ok in (("ge", d >= fld.metadata.get("ge", d)), ("gt", d > fld.metadata.get("gt", d - 1)),
                                    ("le", d <= fld.metadata.get("le", d)), ("lt", d < fld.metadata.get("lt", d + 1))):
                        assert ok, f"{cls.__name__}.{path} default {d} violates {key}"
    assert dataclasses.is_dataclass(Config)


@pytest.fixture
def gpu_node(monkeypatch):
    """Plan as on a GPU node with deepspeed installed (the plan checks are torch-free and look only at these)."""
    import importlib.util

    import harness.config.checks

    real = importlib.util.find_spec
    monkeypatch.setattr(harness.config.checks, "cuda_visible", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "deepspeed" else real(name, *a))


@pytest.mark.parametrize("overrides, field", [
    (["placement=fsdp", "arm=evi_po"], "placement"),  # evi_po's extra forwards differ per rank: sharded -> hang
    (["placement=deepspeed_zero3", "arm=evi_po", "arm.lambda_evidence=0"], "placement"),
    (["placement=ddp", "placement.zero_stage=3"], "placement.zero_stage"),
    (["placement=deepspeed", "placement.zero_stage=1"], "placement.zero_stage"),
    (["placement=ddp", "placement.accelerate_config=accelerate/nope.yaml"], "placement.accelerate_config"),
])
def test_placement_combinations_refused_on_a_gpu_node(gpu_node, plan_of, overrides, field):
    with pytest.raises(ConfigError) as err:
        plan_of(*overrides)
    assert [p.field for p in err.value.problems] == [field], err.value.render()


@pytest.mark.parametrize("overrides", [
    ["placement=fsdp", "arm=papo"],  # papo's extra forwards run on every rank alike
    ["placement=deepspeed_zero3", "arm=evi_po", "arm.lambda_direction=0", "arm.lambda_evidence=0"],
    ["placement=deepspeed", "arm=evi_po"],  # ZeRO-2: parameters replicated, forwards local
    ["placement=deepspeed_zero3", "model.tuning=lora"],
])
def test_placement_combinations_accepted_on_a_gpu_node(gpu_node, plan_of, overrides):
    assert plan_of(*overrides).config["placement"]["kind"] in ("fsdp", "deepspeed")


@pytest.mark.parametrize("sinks", ["[tensorboard,wandb,trackio]", "[trackio,wandb,tensorboard]"])
def test_a_list_of_loggers_turns_on_every_sink(compose_cfg, sinks):
    """Each logger option sets only its own flag over the schema (the schema is the root's, not each option's):
    a list of options keeps every sink on (it used to keep only the last)."""
    cfg, _ = compose_cfg(f"logger={sinks}")
    assert cfg.logger.tensorboard is True and cfg.logger.wandb is True and cfg.logger.wandb_mode == "offline"
    assert cfg.logger.trackio is True
    one, _ = compose_cfg("logger=tensorboard")
    assert one.logger.tensorboard is True and one.logger.wandb is False and one.logger.trackio is False


def test_a_trackio_project_that_is_not_a_file_name_is_refused_at_plan_time(plan_of):
    from harness.errors import HarnessError

    with pytest.raises(HarnessError) as e:
        plan_of("logger=trackio", "logger.trackio_project=my/project")
    assert "logger.trackio_project" in str(e.value) and "my/project" in str(e.value)

"""arm=opd (arms/opd): the divergence it trains on, what the teacher sees, and the TRL points it relies on.

Real trainers on two tiny random Qwen2-VLs (the student and a differently seeded teacher saved on disk), built
through arms.build_trainer as the harness builds them; no mocks. The loss is checked against a hand computation
of the per-token divergence from the two models' own logits: the reverse KL at beta=1, the forward KL at beta=0,
both at arm.loss_temperature, not at the sampling temperature.
"""

from __future__ import annotations

import inspect

import pytest

import torch
import torch.nn.functional as F

MM_KEYS = ("pixel_values", "image_grid_thw", "mm_token_type_ids")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from harness.data import ensure_synthetic, load_split
    from harness.models import build_tiny
    from harness.data.trainsets import corpus

    tmp = tmp_path_factory.mktemp("opd")
    root = ensure_synthetic(n_base=8, data_seed=0, image_size=56, cache_dir=tmp / "data")
    rows = sorted(load_split(root, "train"), key=lambda r: (r["group_id"], r["relation"]))
    tiny = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                vision_width=32, vision_depth=1, vocab_size=400)
    paths = {name: build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny={**tiny, "init_seed": seed},
                              corpus=corpus(rows), cache_dir=tmp / name) for name, seed in (("student", 0), ("teacher", 1))}
    return {"root": root, "rows": rows, "tmp": tmp, **paths}


class RecordingReward:
    """The reward function's seat (the harness's writes the ledger): records what opd hands it."""

    __name__ = "recording"

    def __init__(self):
        self.calls, self.completed, self.held = [], {}, False

    def __call__(self, prompts, completions, completion_ids, trainer_state=None, row=None, **_):
        self.calls.append({"completions": completions, "completion_ids": completion_ids, "row": row,
                           "step": trainer_state.global_step})
        self.completed = {}
        return [0.0] * len(completions)

    def hold_trace(self):
        self.held = True

    def complete(self, index, fields):
        assert index not in self.completed, f"completion {index} completed twice"
        self.completed[index] = fields


def build(env, *overrides: str):
    from arms import build_trainer
    from arms.common import BuildContext
    from harness.cli import compose_plan
    from harness.models import load_tiny, special_token_ids_to_suppress
    from harness.data.trainsets import rl_dataset

    plan = compose_plan(["arm=opd", "debug=tiny", f"output_root={env['tmp']}", f"arm.teacher={env['teacher']}",
                         "arm.prompts_per_step=4", "arm.max_completion_length=6", *overrides])
    model, processor = load_tiny(env["student"])
    reward = RecordingReward()
    ctx = BuildContext(plan=plan, run_dir=env["tmp"] / "opd", model=model, processor=processor,
                       train_dataset=rl_dataset(env["root"], env["rows"], is_vlm=True), reward_fn=reward,
                       suppress_token_ids=special_token_ids_to_suppress(processor))
    trainer = build_trainer("opd", ctx)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer, model, reward


def generation_batch(trainer, seed: int = 0):
    torch.manual_seed(seed)
    gen = next(iter(trainer.get_train_dataloader()))
    return gen, trainer._generate_and_score_completions(gen)


def completion_logprobs(model, batch, temperature: float):
    """(B, T, V) log-softmax of the model's logits at the completion positions, at `temperature`."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    mm = {k: batch[k] for k in MM_KEYS if k in batch}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, **mm).logits
    t = batch["completion_ids"].size(1)
    return F.log_softmax(logits[:, -t - 1:-1, :].float() / temperature, dim=-1)


def hand_per_token(trainer, model, batch, *, beta: float, temperature: float) -> torch.Tensor:
    """(B, T): KL(student || teacher) (beta=1) or KL(teacher || student) (beta=0) at each completion position."""
    s = completion_logprobs(model, batch, temperature)
    t = completion_logprobs(trainer.teacher_model, batch, temperature)
    reverse = (s.exp() * (s - t)).sum(-1)
    forward = (t.exp() * (t - s)).sum(-1)
    return reverse if beta == 1.0 else forward


def hand_divergence(trainer, model, batch, *, beta: float, temperature: float) -> float:
    """The mean over completion tokens of the per-token divergence."""
    mask = batch["completion_mask"].float()
    per_token = hand_per_token(trainer, model, batch, beta=beta, temperature=temperature)
    return float((per_token * mask).sum() / mask.sum())


@pytest.mark.parametrize("beta, loss_temperature", [(1.0, 1.0), (0.0, 1.0), (1.0, 2.0)])
def test_the_loss_is_the_per_token_divergence_at_the_loss_temperature(env, beta, loss_temperature):
    """arm.temperature (0.7) samples; the divergence is at arm.loss_temperature. TRL alone would compute it at
    the sampling temperature: the hand computation at 1.0 then differs by far more than the tolerance."""
    trainer, model, _ = build(env, f"arm.beta={beta}", f"arm.loss_temperature={loss_temperature}",
                              "arm.temperature=0.7")
    _, batch = generation_batch(trainer)
    assert batch["completion_mask"].sum() > 0 and "pixel_values" in batch
    loss = float(trainer.compute_loss(model, batch))
    want = hand_divergence(trainer, model, batch, beta=beta, temperature=loss_temperature)
    assert want > 1e-3  # two different random models: a divergence to see
    assert loss == pytest.approx(want, rel=1e-4)
    wrong = hand_divergence(trainer, model, batch, beta=beta, temperature=0.7)
    assert abs(wrong - want) > 1e-3 * want  # the check can tell the temperatures apart


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_each_completion_gets_the_divergence_the_loss_trained_on(env, beta):
    """The trace's per-completion `kl` is the completion's own mean per-token divergence (by hand, row by row),
    `kl_sum` its sum over the completion's tokens, and the loss is their token-weighted mean. The batch is
    shuffled first, as TRL's _prepare_inputs does: the rows are matched by harness_index, not by position."""
    from trl.trainer.utils import shuffle_sequence_dict, split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    trainer, model, reward = build(env, f"arm.beta={beta}", "arm.loss_temperature=1.0")
    assert reward.held  # the trace rows wait for the divergence
    _, batch = generation_batch(trainer)
    torch.manual_seed(3)
    shuffled = unsplit_pixel_values_by_grid(shuffle_sequence_dict(split_pixel_values_by_grid(batch)))
    assert shuffled["harness_index"].tolist() != list(range(4))  # the check can tell a mapping by position
    loss = float(trainer.compute_loss(model, shuffled))
    assert sorted(reward.completed) == [0, 1, 2, 3]
    per_token = hand_per_token(trainer, model, batch, beta=beta, temperature=1.0)
    mask = batch["completion_mask"]
    for i in range(4):
        got, n = reward.completed[i], int(mask[i].sum())
        want = float((per_token[i] * mask[i]).sum())
        assert got["kl_tokens"] == n and got["kl_sum"] == pytest.approx(want, rel=1e-4, abs=1e-7), (i, got, want)
        assert got["kl"] == pytest.approx(want / n, rel=1e-4, abs=1e-7)
    assert len({round(reward.completed[i]["kl"], 6) for i in range(4)}) > 1  # the rows differ: a real check
    weighted = sum(r["kl_sum"] for r in reward.completed.values()) / sum(r["kl_tokens"] for r in reward.completed.values())
    assert loss == pytest.approx(weighted, rel=1e-4)


def test_the_teacher_sees_the_students_images_and_token_positions(env):
    """A spy on TRL's hidden-state helper: within one loss, the teacher's forward gets the very input ids,
    attention mask, kept positions and pixel values of the student's."""
    trainer, model, _ = build(env)
    _, batch = generation_batch(trainer)
    calls = []
    helper = trainer._get_last_hidden_state

    def spy(unwrapped, input_ids, attention_mask, logits_to_keep, **mm):
        calls.append({"model": unwrapped, "ids": input_ids, "attn": attention_mask, "keep": logits_to_keep, **mm})
        return helper(unwrapped, input_ids, attention_mask, logits_to_keep, **mm)

    trainer._get_last_hidden_state = spy
    trainer.compute_loss(model, batch)
    assert [c["model"] is model for c in calls] == [True, False] and calls[1]["model"] is trainer.teacher_model
    student, teacher = calls
    assert torch.equal(student["ids"], teacher["ids"]) and torch.equal(student["attn"], teacher["attn"])
    assert student["keep"] == teacher["keep"] == batch["completion_ids"].size(1)
    assert "pixel_values" in teacher and torch.equal(student["pixel_values"], teacher["pixel_values"])
    assert torch.equal(student["image_grid_thw"], teacher["image_grid_thw"])


def test_every_sampled_completion_reaches_the_reward_function_once_with_its_row(env):
    """The hook hands TRL's sampled completions (ids cut after the end of sequence, as the ledger counts
    them) to the harness reward function with their dataset rows, once per generation batch."""
    trainer, _, reward = build(env)
    gen, batch = generation_batch(trainer)
    (call,) = reward.calls
    assert call["row"] == [x["row"] for x in gen] and call["step"] == 0
    lengths = batch["completion_mask"].sum(1).tolist()
    assert [len(ids) for ids in call["completion_ids"]] == lengths
    assert len(call["completions"]) == len(gen) == trainer.generation_round.local_completions == 4


def test_the_teacher_is_frozen_and_the_round_is_one_completion_per_prompt(env):
    trainer, model, _ = build(env, "arm.gradient_accumulation_steps=2")
    assert not any(p.requires_grad for p in trainer.teacher_model.parameters())
    assert not trainer.teacher_model.training
    rnd = trainer.generation_round
    assert (rnd.num_generations, rnd.cycle, rnd.completions_per_step) == (1, 1, 4)
    assert trainer.args.per_device_train_batch_size == 2 and trainer.args.gradient_accumulation_steps == 2


# --- the TRL points opd relies on (NOTE(trl-1.16) in arms/opd/trainer.py)


def test_distillation_trainer_contract():
    from trl import DistillationTrainer

    assert list(inspect.signature(DistillationTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    prep = inspect.getsource(DistillationTrainer._prepare_inputs)
    assert "generate_every = self.args.gradient_accumulation_steps" in prep  # one generation per optimizer step
    assert "self._generate_and_score_completions(generation_batch)" in prep
    # the sampling temperature is baked into the GenerationConfig at __init__; the loss reads self.temperature
    init = inspect.getsource(DistillationTrainer.__init__)
    assert '"temperature": self.temperature' in init and "GenerationConfig(**generation_kwargs" in init
    compute = inspect.getsource(DistillationTrainer._compute_loss)
    assert "temperature=self.temperature" in compute
    assert list(inspect.signature(DistillationTrainer._compute_loss).parameters) == [
        "self", "unwrapped_student", "inputs", "num_items_in_batch"]
    # the per-completion divergence (arms.opd _compute_loss): TRL's loss is the sum of the per-token divergence
    # of one call of this module's ChunkedDivergenceFunction.apply
    import trl.trainer.distillation_trainer as distillation

    loss_src = inspect.getsource(distillation._chunked_divergence_loss)
    assert loss_src.count("ChunkedDivergenceFunction.apply(") == 1 and "loss = per_token_divergence.sum()" in loss_src
    assert "_chunked_divergence_loss(" in compute
    sampler = inspect.getsource(DistillationTrainer._get_train_sampler)
    assert "mini_repeat_count=1" in sampler  # n = 1: one completion per prompt


# --- plan-time rules (torch-free)


def test_opd_without_a_teacher_or_with_a_missing_run_is_refused_at_plan_time(plan_of):
    from harness.errors import HarnessError

    with pytest.raises(HarnessError) as e:
        plan_of("arm=opd", "arm.teacher=null")
    assert "arm.teacher" in str(e.value) and "run:<run_name>" in str(e.value)
    with pytest.raises(HarnessError) as e:
        plan_of("arm=opd", "arm.teacher=run:grpo-nothing-here")
    assert "names no run" in str(e.value)
    with pytest.raises(HarnessError) as e:
        plan_of("arm=opd", "arm.teacher=opd")
    assert "its own teacher" in str(e.value)
    with pytest.raises(HarnessError) as e:
        plan_of("arm=opd", "arm.teacher=gpro")
    assert "is neither an arm (" in str(e.value) and "grpo" in str(e.value)


@pytest.mark.parametrize("arm", ["grpo", "sft"])
def test_a_teacher_named_by_its_arm_is_planned_as_the_run_a_sweep_over_arms_makes(plan_of, arm):
    """arm.teacher=<arm> plans that arm's run of the same command line: the student's arm.* knobs are not its, the
    budget, seed, model and data are; so `-m arm=grpo,opd` trains the grpo run once and opd distills it."""
    common = ("debug=tiny", "seed=3", "budget.max_completion_tokens=3000", "train.eval_steps=4")
    student = plan_of("arm=opd", f"arm.teacher={arm}", "arm.learning_rate=3e-4", "arm.beta=0.5", *common)
    alone = plan_of(f"arm={arm}", *common)
    assert student.teacher is not None and student.teacher.run_name == alone.run_name
    assert student.teacher.identity["semantic_sha256"] == alone.identity["semantic_sha256"]
    t = student.identity["teacher"]
    assert (t["spec"], t["arm"], t["run_name"]) == (arm, arm, alone.run_name)
    assert t["semantic_sha256"] == alone.identity["semantic_sha256"] and t["path"] == f"{alone.run_dir}/final_policy"
    assert t["weights_sha256"] is None  # not trained yet: the lifecycle fills it once the teacher has run
    assert (student.teacher.parent is None) == (arm == "sft")
    if arm == "grpo":  # the teacher's warm start is the student's: one SFT run
        assert student.teacher.parent.run_name == student.parent.run_name
    # the plan file carries the teacher, and a changed teacher (another seed's) is another student run
    from harness.plan import Plan

    assert Plan.from_json(student.to_json()).teacher.run_name == alone.run_name
    assert plan_of("arm=opd", f"arm.teacher={arm}", "debug=tiny", "seed=4").identity["teacher"]["run_name"] != t["run_name"]
    # the default teacher is grpo
    assert plan_of("arm=opd", "debug=tiny").identity["teacher"]["arm"] == "grpo"


def test_an_experiment_preset_reaches_the_planned_teacher(plan_of):
    """`-m experiment=comparison arm=opd`: each student's teacher is the comparison's grpo run of its seed."""
    student = plan_of("experiment=comparison", "arm=opd", "seed=2")
    alone = plan_of("experiment=comparison", "arm=grpo", "seed=2")
    assert student.teacher.run_name == alone.run_name and student.teacher.arm == "grpo"
    assert student.teacher.config["train"]["eval_steps"] == 100  # the preset's keys reached it


def test_the_teacher_is_part_of_the_identity(env, plan_of):
    plan = plan_of("arm=opd", f"arm.teacher={env['teacher']}")
    t = plan.identity["teacher"]
    assert t["path"] == str(env["teacher"].resolve()) and len(t["weights_sha256"]) == 64
    other = plan_of("arm=opd", f"arm.teacher={env['student']}")
    assert other.identity["teacher"]["weights_sha256"] != t["weights_sha256"] and other.run_name != plan.run_name

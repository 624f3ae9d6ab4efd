"""Off-policy rounds (rollout=async, harness.offpolicy, arms.offpolicy) without a run: what the plan refuses, the
buffer's files, the sampler's schedule against TRL's data order, and the decoupled correction's importance weights
computed by hand on a tiny case against the trainer's (real TRL trainers on a tiny random VLM, no mocks of TRL)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from harness.errors import ConfigError
from harness.offpolicy import age_allowed, newest_version, round_path, round_seed, sampled_by, version_path
from tests.unit.test_trl_contract import build, build_context, env  # noqa: F401  (env: the module fixture the trainers share)


# --- the plan


@pytest.mark.parametrize("overrides, field", [
    (("arm=papo",), "rollout"),
    (("arm=evi_po",), "rollout"),
    (("arm=opd",), "rollout"),
    (("rollout.lag=5",), "rollout.lag"),  # above the cap (4): from round 5 on every round would be dropped
    (("rollout.lag=null", "rollout.importance_sampling_correction=false"),
     "rollout.importance_sampling_correction"),  # free running is corrected like a fixed lag
    (("rollout.importance_sampling_correction=false",), "rollout.importance_sampling_correction"),
    (("rollout.importance_sampling_clip_min=3.0",), "rollout.importance_sampling_clip_min"),
    (("placement=ddp", "placement.num_processes=2"), "placement"),
])
def test_the_plan_refuses_what_the_correction_cannot_honour(plan_of, overrides, field):
    with pytest.raises(ConfigError) as err:
        plan_of("rollout=async", *overrides)
    assert field in [p.field for p in err.value.problems], str(err.value)
    assert "fix:" in str(err.value)


def test_a_cap_of_zero_and_a_mode_trl_lacks_are_refused_when_composed(tmp_path):
    from harness.plan import compose_plan

    for bad in ("rollout.max_policy_age=0", "rollout.importance_sampling_mode=sequence_clip"):
        with pytest.raises(ConfigError) as err:
            compose_plan([f"output_root={tmp_path}", "rollout=async", bad])
        assert bad.split("=")[0] in [p.field for p in err.value.problems], str(err.value)


def test_lag_and_cap_are_semantic_and_sync_plans_keep_their_identity(plan_of):
    sync = plan_of("debug=tiny")
    assert sync.identity == plan_of("debug=tiny", "rollout=hf").identity
    lag1, lag2 = plan_of("debug=tiny", "rollout=async"), plan_of("debug=tiny", "rollout=async", "rollout.lag=2")
    cap = plan_of("debug=tiny", "rollout=async", "rollout.max_policy_age=2")
    names = {p.identity["semantic_sha256"] for p in (sync, lag1, lag2, cap)}
    assert len(names) == 4  # mode, lag and cap each change what is trained: each is its own run
    # an existing sync run keeps its hash and run name (OMIT_AT_DEFAULT): tests/unit/test_plan_identities.py
    with pytest.raises(ConfigError, match="rollout.lag"):
        plan_of("debug=tiny", "rollout.lag=2")  # a lag without rollout=async means nothing: refused


def test_the_staleness_sweep_shares_the_on_policy_runs_warm_start(tmp_path):
    """sweep=staleness selects rollout=async in its defaults: the SFT warm start it derives (which samples nothing)
    keeps the default rollout, so every lag and the on-policy grpo of a seed share one warm start."""
    from harness.plan import compose_plan

    root = f"output_root={tmp_path}"
    lagged = compose_plan([root, "sweep=staleness", "seed=0", "rollout.lag=2", "debug=tiny"])
    assert lagged.cfg.rollout.name == "async" and lagged.cfg.rollout.lag == 2
    plain = compose_plan([root, "seed=0", "debug=tiny"])
    assert lagged.parent.cfg.rollout.name == "hf"
    assert lagged.parent.identity["semantic_sha256"] == plain.parent.identity["semantic_sha256"]


# --- the schedule and the buffer


def test_the_versions_a_fixed_lag_samples_from():
    assert [sampled_by(r, 0) for r in range(4)] == [0, 1, 2, 3]
    assert [sampled_by(r, 2) for r in range(5)] == [0, 0, 0, 1, 2]
    assert round_seed(0, 3) == round_seed(0, 3) != round_seed(0, 4) != round_seed(1, 4)


def test_free_running_samples_from_the_newest_version_never_older_than_the_cap(tmp_path):
    """rollout.lag=null: round r is sampled by the newest published version at most r, and the sampler waits while
    that would be older than the cap; the trainer accepts any age from 0 to the cap, a fixed lag exactly its own."""
    import threading

    from harness.offpolicy.sampler import choose_version

    def publish(v):
        version_path(tmp_path, v).parent.mkdir(parents=True, exist_ok=True)
        version_path(tmp_path, v).write_bytes(b"x")

    assert newest_version(tmp_path, at_most=3) is None
    publish(0)
    assert [choose_version(tmp_path, r, None, 2, lambda: False) for r in range(3)] == [0, 0, 0]
    assert choose_version(tmp_path, 3, None, 2, lambda: True) is None  # version 1 not out, the trainer gone
    publish(1), publish(2), publish(5)
    assert choose_version(tmp_path, 3, None, 2, lambda: False) == 2  # the newest at most 3 (not 5: a later round's)
    assert choose_version(tmp_path, 4, 2, 4, lambda: False) == 2  # a fixed lag: exactly r - lag
    # round 6 with cap 2 waits for version 4, then takes the newest at most 6 (5)
    later = threading.Timer(0.2, publish, args=(4,))
    later.start()
    assert choose_version(tmp_path, 6, None, 2, lambda: False) == 5
    later.join()
    assert age_allowed(6, 4, None, 2) and age_allowed(6, 6, None, 2) and not age_allowed(6, 3, None, 2)
    assert not age_allowed(6, 7, None, 2)  # a version newer than the round: the sampler broke its schedule
    assert age_allowed(6, 4, 2, 4) and not age_allowed(6, 5, 2, 4)


def test_the_cpu_is_split_between_trainer_and_sampler():
    from harness.offpolicy.process import split_threads

    assert split_threads(2, None) == (1, 1) and split_threads(16, None) == (8, 8) and split_threads(1, None) == (1, 1)
    assert split_threads(8, 2) == (6, 2) and split_threads(2, 4) == (1, 4)


def test_on_a_gpu_node_the_sampler_takes_the_next_visible_gpu():
    from harness.offpolicy.process import sampler_gpu

    assert sampler_gpu(0, None) is None and sampler_gpu(1, None) is None and sampler_gpu(1, "3") is None
    assert sampler_gpu(2, None) == "1" and sampler_gpu(8, None, 3) == "4" and sampler_gpu(2, None, 1) == "0"
    assert sampler_gpu(2, "4,6") == "6"  # the trainer's CUDA_VISIBLE_DEVICES names physical ids
    from harness.offpolicy.process import SamplerProcess

    def placed(**kw):
        return SamplerProcess("/nonexistent", lag=1, cap=4, cycle=1, token_share=None, **kw).placement()

    env, where = placed(gpu="6")
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and where == "GPU 6 of its own"  # what the sampler process is given
    assert placed(threads=1)[1] == "1 CPU thread(s)" and placed()[1] == "the trainer's device"


def test_training_takes_its_share_of_threads_and_gives_them_back(env, monkeypatch):  # noqa: F811
    """On a CPU the trainer trains with its share (the sampler has the rest) and restores the process's thread count
    after, also on failure: the next job of a sweep in the same process runs as it would alone."""
    from trl import GRPOTrainer

    before = torch.get_num_threads()
    trainer, _, _ = build_async(env)
    stopped, seen = [], []
    trainer.sampler = SimpleNamespace(stop=lambda: stopped.append(True))
    trainer.threads = 1

    def fails(self, *a, **k):
        seen.append(torch.get_num_threads())
        raise RuntimeError("boom")

    monkeypatch.setattr(GRPOTrainer, "train", fails)
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.train()
        assert seen == [1] and stopped == [True] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_rollback_keeps_the_rounds_sampled_before_the_restart_point(tmp_path):
    from harness.offpolicy.buffer import prune_versions, rollback

    for r in range(8):
        round_path(tmp_path, r).parent.mkdir(parents=True, exist_ok=True)
        round_path(tmp_path, r).write_bytes(b"x")
        version_path(tmp_path, r).parent.mkdir(parents=True, exist_ok=True)
        version_path(tmp_path, r).write_bytes(b"x")
    (round_path(tmp_path, 8).parent / ".round-000008.pt.123.tmp").write_bytes(b"half")
    # restart at round 4, lag 2: rounds 4, 5 were sampled by versions 2, 3 (before the restart): kept
    assert rollback(tmp_path, 4, 2) == {"rounds": 2, "versions": 3}
    assert sorted(p.name for p in round_path(tmp_path, 0).parent.iterdir()) == [
        f"round-{r:06d}.pt" for r in range(6)]
    assert prune_versions(tmp_path, below=2) == 2
    assert sorted(p.name for p in version_path(tmp_path, 0).parent.iterdir()) == [
        f"version-{v:06d}.safetensors" for v in (2, 3, 4)]
    # free running: a restart replays every round the buffer holds; only temporary files go
    (round_path(tmp_path, 8).parent / ".round-000008.pt.123.tmp").write_bytes(b"half")
    assert rollback(tmp_path, 1, None) == {"rounds": 0, "versions": 0}
    assert sorted(p.name for p in round_path(tmp_path, 0).parent.iterdir()) == [
        f"round-{r:06d}.pt" for r in range(6)]


def test_the_sampler_schedule_is_the_trainers_data_order(env):  # noqa: F811
    """The sampler walks TRL's RepeatSampler itself; the rounds it gets are the generation batches the Trainer's
    dataloader hands the trainer, over more than one epoch."""
    from harness.offpolicy.sampler import schedule

    trainer, _ = build(env, "grpo", "rollout=async", "arm.steps_per_generation=2", "arm.num_iterations=2",
                       "train.save_steps=4")
    rnd = trainer.generation_round
    repeat = trainer.num_iterations * trainer.args.steps_per_generation
    epoch_rounds = len(trainer.train_dataset) // rnd.prompts
    want, seen = [], 0
    loader = trainer.get_train_dataloader()
    while len(want) < 2 * epoch_rounds + 1:
        for i, batch in enumerate(loader):
            if seen % repeat == 0:
                want.append([json.loads(x["row"])["key"] for x in batch])
            seen += 1
    got = schedule(trainer._get_train_sampler(), rnd.completions, repeat)
    keys = lambda idx: [json.loads(trainer.train_dataset[i]["row"])["key"] for i in idx]  # noqa: E731
    assert [keys(next(got)) for _ in want] == want


# --- the correction


def build_async(env, *overrides):  # noqa: F811
    """(trainer, model, build context) of arm=grpo rollout=async, as tests/unit/test_trl_contract.build makes them;
    the test replaces the sampler process as the trainer sees it (its round already in the buffer)."""
    from arms import build_trainer

    ctx = build_context(env, "grpo", "rollout=async", *overrides)
    trainer = build_trainer("grpo", ctx)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer, ctx.model, ctx


def sample_round(env, ctx, state, index: int = 0):  # noqa: F811
    """(the round's rows, round `index` as the sampler's trainer samples it from weights `state`)."""
    from dataclasses import replace

    from arms.offpolicy import no_reward
    from harness.offpolicy.sampler import sampler_trainer
    from harness.models import load_tiny
    from harness.offpolicy.buffer import Round

    model, processor = load_tiny(env["model_path"])
    model.load_state_dict(state)
    sampler = sampler_trainer(replace(ctx, model=model, processor=processor, reward_fn=no_reward,
                                      run_dir=env["tmp"] / "sampler"))
    inputs = next(iter(sampler.get_train_dataloader()))
    torch.manual_seed(round_seed(0, index))
    prompt_ids, completion_ids, logps = sampler.sample(inputs)
    keys = [json.loads(x["row"])["key"] for x in inputs]
    return inputs, Round(round=index, version=0, seed=0, keys=keys, prompt_ids=prompt_ids,
                         completion_ids=completion_ids, logps=logps)


def by_hand(model, out: dict, got, temperature: float) -> list:
    """Per completion, log pi(token) - log mu(token) of its sampled tokens: the trainer's log-probs from one plain
    forward of the batch (prompt + completion, the round's pixels; log-softmax of the logits over the temperature)
    against the behaviour log-probs the buffer holds."""
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, pixel_values=out["pixel_values"],
                       image_grid_thw=out["image_grid_thw"], mm_token_type_ids=out["mm_token_type_ids"]).logits
    p = out["prompt_ids"].size(1)
    logp = torch.log_softmax(logits[:, p - 1:-1].float() / temperature, -1)
    mine = logp.gather(2, out["completion_ids"][:, :, None])[:, :, 0]
    return [mine[i, :len(c)] - torch.tensor(b) for i, (c, b) in enumerate(zip(got.completion_ids, got.logps))]


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_importance_weights_by_hand_match_the_trainers(env, tmp_path, mode):  # noqa: F811
    """A round sampled by weights W0, trained by W1 (W0 plus noise): TRL's weight through the trainer's buffer path
    equals exp(log pi_W1 - log pi_W0) computed here (summed over a completion's tokens at sequence level), masked to
    0 outside [clip_min, clip_max] or truncated to it; from the same weights (lag 0) every weight is exactly 1."""
    from harness.offpolicy.buffer import write_round

    trainer, model, ctx = build_async(env, f"rollout.importance_sampling_mode={mode}",
                                      "rollout.importance_sampling_clip_max=1.5",
                                      "rollout.importance_sampling_clip_min=0.5")
    trainer.sampler = SimpleNamespace(run_dir=tmp_path, lag=0, cap=4, proc=object(), wait=lambda r, tokens_used: None,
                                      oldest_needed=lambda r: 0, stop=lambda: None)
    inputs, got = sample_round(env, ctx, {k: v.clone() for k, v in model.state_dict().items()})
    write_round(tmp_path, got)

    same = trainer._generate_and_score_completions(inputs)["importance_sampling_ratio"]
    assert torch.equal(same, torch.ones_like(same)), "behaviour and proximal log-probs of the same weights differ"
    assert trainer.offpolicy_round.completion_ids == got.completion_ids

    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = trainer._generate_and_score_completions(inputs)
    ratio = out["importance_sampling_ratio"]
    diffs = by_hand(model, out, got, ctx.plan.cfg.arm.temperature)
    if mode == "sequence_mask":
        w = torch.exp(torch.stack([d.sum() for d in diffs]))
        hand = torch.where((w < 0.5) | (w > 1.5), torch.zeros_like(w), w)
        assert ratio.shape == (len(diffs), 1)
        torch.testing.assert_close(ratio[:, 0], hand, rtol=1e-4, atol=1e-5)
        assert (hand == 0).any() and (hand > 0).any(), f"the case must mask some weights and keep some: {w}"
    else:
        for i, d in enumerate(diffs):
            torch.testing.assert_close(ratio[i, :len(d)], torch.exp(d).clamp(0.5, 1.5), rtol=1e-4, atol=1e-5)
        assert ((ratio > 0.5) & (ratio < 1.5) & (ratio != 1)).any()


def test_outside_training_the_trainer_samples_itself_and_corrects_nothing(env, tmp_path):  # noqa: F811
    """An eval through TRL (the model in eval mode) never reads the buffer: TRL generates as it would on-policy, and
    the batch carries no importance weights."""
    trainer, _, _ = build_async(env)
    trainer.sampler = SimpleNamespace(run_dir=tmp_path, lag=0, cap=4, proc=None, stop=lambda: None,
                                      wait=lambda r, tokens_used: pytest.fail("an eval waited for the buffer"))
    inputs = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()
    out = trainer._generate_and_score_completions(inputs)
    assert "importance_sampling_ratio" not in out and trainer.use_vllm
    assert not (tmp_path / "offpolicy").exists()

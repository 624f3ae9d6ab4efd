"""A knob means what it says: batch semantics of the RL arms on real TRL trainers (tiny VLM, no mocks).

- gradient accumulation is a memory knob: accumulation 1, 2 and 4 sample the same completions at step 0 and
  make the same first update (loss, grad_norm, weights);
- num_iterations=2: one generation every 2 optimizer steps, the second pass re-uses the batch with importance
  ratios != 1 (old log-probs recorded at generation time);
- steps_per_generation=2: one generation serves two optimizer steps, each with its own prompts.

Before harness.rounds, TRL was handed arm.steps_per_generation unconverted (TRL counts micro-batches): with
accumulation 2, TRL generated once per micro-batch (other samples, another update) and with num_iterations=2
it trained on the same half batch twice within one step with a ratio of exactly 1.

Runs are in-process (`lifecycle.run_with_prerequisites` of a composed plan, as a one-process sweep runs its jobs) and share
one output root, so the SFT warm start (debug=tiny: 60 steps, enough for reward differences within a group)
is trained once. Spies on TRL's private loss inputs record what each optimizer step trained on.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.accounting.logs import read_rows

BASE = ("debug=tiny", "train.eval_before=false", "train.eval_after=false")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("invariance")


@pytest.fixture
def spy(monkeypatch):
    """Record, per call of TRL's GRPO loss: the optimizer step, the rows of the generation batch it trains on,
    and the largest |importance ratio - 1| over its real tokens."""
    from trl import GRPOTrainer

    calls: list[dict] = []
    generate, compute_loss, logps_fn = (GRPOTrainer._generate_and_score_completions, GRPOTrainer._compute_loss,
                                        GRPOTrainer._get_per_token_logps_and_entropies)
    state = {"capture": None}

    def tagged_generate(self, inputs):
        batch = generate(self, inputs)
        n = len(batch["prompt_ids"])  # a per-row key: TRL's shuffle and split carry it with its row
        rounds = sum(c["kind"] == "generate" for c in calls)
        batch["spy_row"] = torch.arange(n) + 10_000 * rounds  # unique over the run's generations
        calls.append({"generation": self.state.global_step, "rows": n, "kind": "generate"})
        return batch

    def recording_logps(self, *args, **kwargs):
        out = logps_fn(self, *args, **kwargs)
        if state["capture"] is not None and not state["capture"]:
            state["capture"].append(out[0].detach())
        return out

    def recording_loss(self, model, inputs):
        state["capture"] = []
        try:
            loss = compute_loss(self, model, inputs)
        finally:
            captured, state["capture"] = state["capture"], None
        old = inputs.get("old_per_token_logps")
        mask = inputs["completion_mask"].bool()
        dev = 0.0 if old is None else (torch.exp(captured[0] - old) - 1).abs()[mask].max().item()
        calls.append({"kind": "loss", "step": self.state.global_step, "rows": inputs["spy_row"].tolist(),
                      "ratio_dev": dev, "has_old": old is not None, "generation": None})
        return loss

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", tagged_generate)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", recording_loss)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", recording_logps)
    return calls


def run(out: Path, *overrides: str) -> Path:
    from harness.cli import compose_plan
    from harness.run.lifecycle import run_with_prerequisites

    plan = compose_plan([f"output_root={out}", *BASE, *overrides])
    assert run_with_prerequisites(plan) == 0
    return Path(plan.run_dir)


def sampled(run_dir: Path) -> list[tuple]:
    """What was sampled and how it scored, without the run's hash tag in the completion ids."""
    ledger = [(r["completion_id"].split(":", 1)[1], r["tokens"], r["terminated"], r["step"], r["view"])
              for r in read_rows(run_dir / "ledgers/rank-0.jsonl")]
    trace = [(r["reward"], r["parsed"], r["view"]) for r in read_rows(run_dir / "traces/rank-0.jsonl")]
    return list(zip(ledger, trace))


def kl_of(run_dir: Path) -> dict[str, float]:
    """opd: each completion's divergence, by completion id without the run's hash tag."""
    return {r["completion_id"].split(":", 1)[1]: r["kl"] for r in read_rows(run_dir / "traces/rank-0.jsonl")}


def metrics(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_rows(run_dir / "metrics.jsonl")}


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    (f,) = (run_dir / "final_policy").glob("*.safetensors")
    return load_file(f)


@pytest.mark.parametrize("arm", ["grpo", "papo", "evi_po"])
def test_gradient_accumulation_changes_neither_samples_nor_update(out, arm):
    runs = {ga: run(out, f"arm={arm}", f"arm.gradient_accumulation_steps={ga}", "budget.max_steps=1",
                    "train.save_steps=1") for ga in (1, 2, 4)}
    ref = runs[1]
    assert len(sampled(ref)) == 32  # 4 prompts x 8 generations, one generation for the whole step
    rewards = [t[0] for _, t in sampled(ref)]
    assert len(set(rewards)) > 1, "no reward signal: the warm start must give GRPO differences within a group"
    m_ref, w_ref = metrics(ref)[1], weights(ref)
    assert m_ref["grad_norm"] > 0
    for ga in (2, 4):
        assert sampled(runs[ga]) == sampled(ref), f"accumulation {ga} sampled other completions"
        m = metrics(runs[ga])[1]
        for key in ("loss", "grad_norm"):
            assert m[key] == pytest.approx(m_ref[key], rel=1e-5, abs=1e-7), (ga, key, m[key], m_ref[key])
        # Weights: float noise in a gradient is amplified by Adam's first step lr * g / (|g| + eps) where |g| is
        # near eps (measured, evi_po: 4 of 960,512 weights differ by 1.2e-6 = 1.2% of lr; grpo from a 40-step warm
        # start: 19 by up to 6.7e-7; the rest by < 1e-7); a real difference (another batch, another
        # normalization) moves most weights by ~lr = 1e-4.
        w = weights(runs[ga])
        diff = {k: (w[k] - w_ref[k]).abs() for k in w_ref}
        worst = max(d.max().item() for d in diff.values())
        off = sum((d > 1e-7).sum().item() for d in diff.values()) / sum(d.numel() for d in diff.values())
        assert worst <= 2e-6 and off <= 1e-3, f"accumulation {ga}: weights after step 1 differ by up to " \
                                              f"{worst:.3g}, {off:.2%} of them by more than 1e-7"
    init = Path(json.loads((ref / "run_manifest.json").read_text())["init"]["path"])  # the SFT warm start
    (init_file,) = init.glob("*.safetensors")
    assert max((w_ref[k] - v).abs().max().item() for k, v in load_file(init_file).items()) > 0, "no update"


def test_gradient_accumulation_changes_neither_samples_nor_update_of_opd(out):
    """opd (TRL's DistillationTrainer): one generation per optimizer step whatever the accumulation; the loss is
    summed over the step's completion tokens, so micro-batches add up to the full batch's divergence."""
    teacher = run(out, "arm=sft", "budget.max_steps=20", "train.save_steps=20")
    runs = {ga: run(out, "arm=opd", f"arm.teacher=run:{teacher.name}", "arm.init=scratch", "arm.prompts_per_step=8",
                    f"arm.gradient_accumulation_steps={ga}", "budget.max_steps=1", "train.save_steps=1")
            for ga in (1, 2, 4)}
    ref = runs[1]
    assert len(sampled(ref)) == 8  # 8 prompts, one completion each
    m_ref, w_ref = metrics(ref)[1], weights(ref)
    assert m_ref["grad_norm"] > 0 and m_ref["loss"] > 0
    for ga in (2, 4):
        assert sampled(runs[ga]) == sampled(ref), f"accumulation {ga} sampled other completions"
        # each completion's divergence (the trace's kl, matched by completion id through TRL's shuffle and split)
        assert kl_of(runs[ga]) == pytest.approx(kl_of(ref), rel=1e-5, abs=1e-7), f"accumulation {ga}: per-completion kl"
        m = metrics(runs[ga])[1]
        for key in ("loss", "grad_norm"):
            assert m[key] == pytest.approx(m_ref[key], rel=1e-5, abs=1e-7), (ga, key, m[key], m_ref[key])
        w = weights(runs[ga])
        worst = max((w[k] - w_ref[k]).abs().max().item() for k in w_ref)
        assert worst <= 2e-6, f"accumulation {ga}: weights after step 1 differ by up to {worst:.3g}"


LENGTH_REWARD = '''"""A test's reward of its own (reward._target_): well-formed and short, each call logged to $REWARD_CALLS."""
import json, os


def short_answer(prompts, completions, completion_ids, trainer_state=None, **kwargs):
    out = [(1.0 if c[0]["content"].strip().startswith("<answer>") else 0.0) - len(ids) / 32
           for c, ids in zip(completions, completion_ids)]
    with open(os.environ["REWARD_CALLS"], "a") as fh:
        fh.write(json.dumps({"step": trainer_state.global_step if trainer_state else None, "n": len(out)}) + "\\n")
    return out
'''


def test_gradient_accumulation_calls_your_reward_as_it_calls_the_builtin_one(out, tmp_path, monkeypatch):
    """A reward function of your own (reward._target_ in a file) sees one call per generation round with the whole
    round's completions whatever the accumulation, and the runs sample, score and update alike."""
    fn = tmp_path / "my_reward.py"
    fn.write_text(LENGTH_REWARD)
    calls = {}
    runs = {}
    for ga in (1, 2):
        calls[ga] = tmp_path / f"calls-{ga}.jsonl"
        monkeypatch.setenv("REWARD_CALLS", str(calls[ga]))
        runs[ga] = run(out, "arm=grpo", f"reward._target_={fn}:short_answer", f"arm.gradient_accumulation_steps={ga}",
                       "budget.max_steps=1", "train.save_steps=1")
    seen = {ga: [json.loads(line) for line in calls[ga].read_text().splitlines()] for ga in runs}
    assert seen[1] == seen[2] == [{"step": 0, "n": 32}]  # one call, the round's 4 prompts x 8 generations
    ref = runs[1]
    assert len({t[0] for _, t in sampled(ref)}) > 1, "no reward signal within the round"
    assert sampled(runs[2]) == sampled(ref), "accumulation 2 sampled or scored other completions"
    m, m_ref = metrics(runs[2])[1], metrics(ref)[1]
    for key in ("loss", "grad_norm"):
        assert m[key] == pytest.approx(m_ref[key], rel=1e-5, abs=1e-7), (key, m[key], m_ref[key])


def _steps(calls: list[dict]) -> dict[int, list[dict]]:
    per_step = defaultdict(list)
    for c in calls:
        if c["kind"] == "loss":
            per_step[c["step"]].append(c)
    return per_step


@pytest.mark.parametrize("arm, ga", [("grpo", 1), ("grpo", 2), ("papo", 2)])
def test_num_iterations_reuses_one_generation_for_two_steps(out, spy, arm, ga):
    d = run(out, f"arm={arm}", "arm.num_iterations=2", f"arm.gradient_accumulation_steps={ga}", "budget.max_steps=4",
            "train.save_steps=2")
    ledger = list(read_rows(d / "ledgers/rank-0.jsonl"))
    assert sorted({r["step"] for r in ledger}) == [0, 2], "one generation every 2 optimizer steps"
    for step in (0, 2):
        views = {r["view"] for r in ledger if r["step"] == step}
        assert len([r for r in ledger if r["step"] == step]) == 32 and len(views) == 4  # prompts_per_step prompts
    generations = [c for c in spy if c["kind"] == "generate"]
    assert [g["generation"] for g in generations] == [0, 2]
    per_step = _steps(spy)
    assert sorted(per_step) == [0, 1, 2, 3]
    for first, second in ((0, 1), (2, 3)):
        rows_a = sorted(r for c in per_step[first] for r in c["rows"])
        rows_b = sorted(r for c in per_step[second] for r in c["rows"])
        assert len(rows_a) == 32 and rows_a == rows_b, "each pass trains on the whole generation batch"
        assert len(per_step[first]) == ga  # micro-batches per optimizer step
        assert all(c["has_old"] for c in per_step[first] + per_step[second])
        # first pass: the policy that sampled (ratio 1 up to float noise); second pass: one update later
        assert max(c["ratio_dev"] for c in per_step[first]) < 1e-4
        assert min(c["ratio_dev"] for c in per_step[second]) > 1e-3
    rows = metrics(d)
    assert all("clip_ratio/region_mean" in rows[s] and "clip_ratio/high_mean" in rows[s] for s in rows)


@pytest.mark.parametrize("arm, ga", [("grpo", 1), ("grpo", 2), ("papo", 2)])
def test_steps_per_generation_splits_the_shuffled_round_between_its_steps(out, spy, monkeypatch, arm, ga):
    """steps_per_generation=2 (docs/arms.md, Batch semantics): a round of 8 prompts x 8 completions serves two
    steps of 32 completions each, every completion trained once per round; TRL shuffles the round before it splits
    it, so a step trains on completions of more than prompts_per_step (4) prompts, and not on whole groups."""
    import arms.papo.trainer

    seeds = []  # papo: (step, slot, image) of every mask drawn; a prompt's G completions share one
    mask_seed = arms.papo.trainer.mask_seed
    monkeypatch.setattr(arms.papo.trainer, "mask_seed", lambda *a: seeds.append(a[1:]) or mask_seed(*a))
    d = run(out, f"arm={arm}", "arm.steps_per_generation=2", f"arm.gradient_accumulation_steps={ga}",
            "budget.max_steps=4", "train.save_steps=2")
    ledger = list(read_rows(d / "ledgers/rank-0.jsonl"))
    assert sorted({r["step"] for r in ledger}) == [0, 2]
    assert all(len([r for r in ledger if r["step"] == s]) == 64 for s in (0, 2))  # 2 x 4 prompts x 8
    assert [c["generation"] for c in spy if c["kind"] == "generate"] == [0, 2]
    per_step = _steps(spy)
    G, prompts_per_step = 8, 4  # debug=tiny
    for first, second in ((0, 1), (2, 3)):
        rows_a = [r for c in per_step[first] for r in c["rows"]]
        rows_b = [r for c in per_step[second] for r in c["rows"]]
        assert len(rows_a) == len(set(rows_a)) == len(rows_b) == len(set(rows_b)) == 32
        assert sorted(r % 10_000 for r in rows_a + rows_b) == list(range(64)), "every completion trained once"
        assert len(per_step[first]) == len(per_step[second]) == ga
        # a row's prompt: TRL's batch holds each prompt's G completions together (row // G) before the shuffle
        groups = [Counter(r % 10_000 // G for r in rows) for rows in (rows_a, rows_b)]
        print(f"steps {first}, {second}: completions per prompt {[dict(sorted(g.items())) for g in groups]}")
        for g in groups:
            assert len(g) > prompts_per_step, f"a step trained on whole prompt groups only: {dict(g)}"
            assert any(n < G for n in g.values()), f"a step trained on whole prompt groups only: {dict(g)}"
    if arm == "papo":  # one mask per prompt of a round: 8 prompts at step 0, 8 at step 2, none repeated
        assert len(seeds) == len(set(seeds)) == 16 and {s[0] for s in seeds} == {0, 2}


def test_direction_term_scores_the_untempered_policy(out):
    """evi_po's direction term scores s(c|v) at temperature 1 whatever the sampling temperature (docs/arms.md): at step 1
    the four views of the step are scored by the same init weights, so loss/direction and the direction accuracy
    must not depend on arm.temperature. Before, TRL's fused head divided the logits by it (softmax at tau x T)."""
    rows = {t: metrics(run(out, "arm=evi_po", f"arm.temperature={t}", "budget.max_steps=1", "train.save_steps=1"))[1]
            for t in (0.5, 1.0)}
    assert rows[0.5]["loss/direction"] == pytest.approx(rows[1.0]["loss/direction"], rel=1e-5)
    assert rows[0.5]["loss/direction"] > 0
    for key in [k for k in rows[1.0] if k.endswith("/dir_acc")]:
        assert rows[0.5][key] == pytest.approx(rows[1.0][key], abs=1e-6), key


@pytest.mark.parametrize("extra", [
    ("arm.gradient_accumulation_steps=2", "arm.steps_per_generation=2", "arm.mask_truncated_completions=false"),
    ("arm.gradient_accumulation_steps=4",),
])
def test_ledger_tokens_are_what_trl_trained_on(out, monkeypatch, extra):
    """The budget counts what TRL samples and trains on, checked against TRL's own tensors (not the harness's
    counter against its own ledger): per completion, the ledger's tokens are the row sum of the completion_mask the
    loss is computed with (0 for a truncated completion when TRL masks those out, which the ledger still charges),
    the round's total is TRL's num_items_in_batch, and TRL's logged completions/mean_length is the ledger's mean."""
    from trl import GRPOTrainer

    seen = []  # per generation: the step, completion_mask row sums, num_items_in_batch
    generate = GRPOTrainer._generate_and_score_completions

    def recording(self, inputs):
        batch = generate(self, inputs)
        seen.append((self.state.global_step, batch["completion_mask"].sum(1).tolist(),
                     int(batch["num_items_in_batch"])))
        return batch

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", recording)
    d = run(out, "arm=grpo", "budget.max_steps=4", "train.save_steps=2", *extra)
    masked = "arm.mask_truncated_completions=false" not in extra
    ledger = list(read_rows(d / "ledgers/rank-0.jsonl"))
    assert [s for s, _, _ in seen] == sorted({r["step"] for r in ledger}) and len(seen) >= 2
    for step, mask_sums, items in seen:
        rows = [r for r in ledger if r["step"] == step]
        assert len(rows) == len(mask_sums)
        charged = [r["tokens"] if r["terminated"] or not masked else 0 for r in rows]
        assert charged == mask_sums, f"step {step}: ledger tokens differ from TRL's completion_mask"
        assert items == sum(charged)
    truncated = [r for r in ledger if not r["terminated"]]
    max_len = json.loads((d / "run_manifest.json").read_text())["plan"]["config"]["arm"]["max_completion_length"]
    assert all(r["tokens"] == max_len for r in truncated)  # a truncated completion ran to max_completion_length
    lengths = {s: r["completions/mean_length"] for s, r in metrics(d).items() if "completions/mean_length" in r}
    assert lengths, "TRL logged no completion lengths"
    for step, mean in lengths.items():
        rows = [r["tokens"] for r in ledger if r["step"] == step - 1]
        assert mean == pytest.approx(sum(rows) / len(rows)), step


@pytest.mark.parametrize("arm", ["sft", "grpo", "evi_po"])
def test_speed_knobs_change_nothing(out, arm):
    """model.image_cache_mb, model.gradient_checkpointing, model.dedupe_rows, model.rope_cache and
    model.share_vision_features are speed knobs (not in the semantic identity): with the cache off, with activations
    recomputed in the backward pass, with every row processed on its own and the stock M-RoPE index (bit for bit),
    or with each distinct image encoded once outside autograd, three steps sample the same completions, score them
    the same, log the same losses and end at the same weights. evi_po re-scores under the cached
    MISSING/CONTROL images; sft's collator preprocesses through the cache too. The run dir is the same for all
    three (same semantic identity), so each is removed after it is read."""
    import shutil

    rl = arm != "sft"
    seen = {}
    for name, knob in (("default", ()), ("no cache", ("model.image_cache_mb=0",)),
                       ("checkpointing", ("model.gradient_checkpointing=true",)),
                       ("stock rows", ("model.dedupe_rows=false", "model.rope_cache=false")),
                       ("shared vision", ("model.share_vision_features=true",))):
        d = run(out, f"arm={arm}", "budget.max_steps=3", "train.save_steps=3", "train.logging_steps=1", *knob)
        comp = json.loads((d / "completion.json").read_text())
        seen[name] = (sampled(d) if rl else [], metrics(d), weights(d), comp["image_cache"])
        shutil.rmtree(d)
    ref_samples, ref_metrics, ref_weights, cache = seen["default"]
    # on; its hits within a step are gone since the processor's row dedupe (model.dedupe_rows) hands it each
    # distinct image once per call; tests/unit/test_image_cache.py covers the hits
    assert cache["misses"] > 0, cache
    assert seen["no cache"][3] is None
    if rl:
        assert len({t[0] for _, t in ref_samples}) > 1  # reward differences: the update is not zero
    keys = [k for k in ref_metrics[1] if k.startswith("loss") or k in ("grad_norm", "reward")]
    assert "loss" in keys and "grad_norm" in keys
    for name in ("no cache", "checkpointing", "stock rows", "shared vision"):
        samples, m, w, _ = seen[name]
        assert samples == ref_samples, f"{name}: other completions or rewards"
        for step in ref_metrics:
            for k in keys:
                assert m[step][k] == pytest.approx(ref_metrics[step][k], rel=1e-6, abs=1e-8), (name, step, k)
        worst = max((w[k] - ref_weights[k]).abs().max().item() for k in ref_weights)
        assert worst <= 1e-6, f"{name}: weights differ by up to {worst:.3g}"
        if name == "stock rows":  # the row dedupe and the M-RoPE cache give the stock tensors: bit for bit
            differ = {(step, k): (m[step][k], ref_metrics[step][k]) for step in ref_metrics for k in keys
                      if m[step][k] != ref_metrics[step][k]}
            assert not differ, (name, differ)
            assert worst == 0.0, f"{name}: weights differ by up to {worst:.3g}"


@pytest.mark.parametrize("arm", ["grpo", pytest.param("papo", marks=pytest.mark.slow)])  # papo: ~15 s
def test_periodic_eval_changes_nothing_and_binds_to_kept_checkpoints(out, arm):
    """train.eval_steps is an observation: with it, five steps sample the same completions, log the same values and
    end at the same weights, bit for bit, as without it (papo draws its image masks from the RNG the eval must not
    move). Each eval scored the weights of its step's checkpoint (digest), which retention keeps; its values are in
    that step's metrics row; the last step is left to the final eval. Same run dir (not semantic): each run is
    removed after it is read."""
    import shutil

    from harness.accounting.weights import weights_digest
    from harness.verify import verify

    seen = {}
    for every in (0, 2):
        d = run(out, f"arm={arm}", "budget.max_steps=5", "train.save_steps=5", "train.keep_last=1",
                f"train.eval_steps={every}")
        assert verify(d) == [], verify(d)
        ckpts = sorted(int(p.name.split("-")[1]) for p in (d / "checkpoints").glob("checkpoint-*"))
        evals = {int(p.stem.rsplit("-", 1)[1]): json.loads(p.read_text()) for p in (d / "eval").glob("*-checkpoint-*.json")
                 if not p.name.endswith(".predictions.jsonl")}
        digests = {s: weights_digest(d / "checkpoints" / f"checkpoint-{s}") for s in ckpts}
        seen[every] = (sampled(d), metrics(d), weights(d), ckpts, evals, digests)
        if every and arm == "grpo":  # verify ties each point to its checkpoint and its metrics row
            art = d / "eval" / "test-checkpoint-2.json"
            art.write_text(json.dumps({**evals[2], "accuracy": evals[2]["accuracy"] + 0.25}))
            shutil.rmtree(d / "checkpoints" / "checkpoint-4")
            problems = verify(d)
            assert any("test-checkpoint-2.json: accuracy" in p for p in problems), problems
            assert any("test-checkpoint-4.json: its checkpoint checkpoint-4 is gone" in p for p in problems), problems
        shutil.rmtree(d)
    ref_samples, ref_metrics, ref_weights, ref_ckpts, ref_evals, _ = seen[0]
    samples, m, w, ckpts, evals, digests = seen[2]
    assert ref_ckpts == [5] and ref_evals == {}
    assert ckpts == [2, 4, 5], "an eval's checkpoint is saved and kept (keep_last=1 would rotate 2 and 4 away)"
    assert sorted(evals) == [2, 4]
    for step, res in evals.items():
        assert res["policy_sha256"] == digests[step] and res["step"] == step
        assert res["completion_tokens"] == sum(t[1] for t, _ in samples if t[3] < step)  # ledger steps are 0-based
        assert m[step]["eval_accuracy"] == res["accuracy"]
        assert m[step]["eval_accuracy_FULL"] == res["per_relation"]["FULL"]["accuracy"]
    assert not any(k.startswith("eval_") for s in (1, 3, 5) for k in m[s])
    assert samples == ref_samples, "the eval changed what was sampled or how it scored"
    assert len({t[0] for _, t in ref_samples}) > 1
    assert sorted(m) == sorted(ref_metrics)
    for step, row in ref_metrics.items():
        same = {k: v for k, v in m[step].items() if not k.startswith("eval_") and k != "step_time"}
        assert same == {k: v for k, v in row.items() if k != "step_time"}, step
    assert all(torch.equal(w[k], ref_weights[k]) for k in ref_weights), "the eval changed the update"


def test_the_training_loops_collection_skips_what_was_alive_before_the_run(out, monkeypatch):
    """transformers' Trainer runs a full garbage collection before its training loop (accelerate's free_memory:
    0.29 s of a 20-step tiny run, a scan of ~500k objects of torch, transformers and TRL). In a run
    (harness.run.lifecycle.run_objects) the objects alive before it are frozen then, and nothing is frozen after."""
    import gc
    import shutil

    from accelerate import Accelerator

    from harness.cli import compose_plan
    from harness.run.lifecycle import run_with_prerequisites

    seen: list[int] = []
    free_memory = Accelerator.free_memory

    def recording(self, *objects):
        seen.append(gc.get_freeze_count())
        return free_memory(self, *objects)

    monkeypatch.setattr(Accelerator, "free_memory", recording)
    plan = compose_plan([f"output_root={out}", *BASE, "arm=grpo", "budget.max_steps=1"])
    shutil.rmtree(plan.run_dir, ignore_errors=True)  # the run's stages run, even after another test ran it
    assert run_with_prerequisites(plan) == 0
    assert seen and all(n > 100_000 for n in seen), seen
    assert gc.get_freeze_count() == 0

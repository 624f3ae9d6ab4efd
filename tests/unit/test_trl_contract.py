"""The TRL internals papo and evi_po rely on (arms/grpo.py, `NOTE(trl-1.16)`), and the trainers built on them.

Part 1 pins the contract: trl's exact version, the signatures of the private GRPOTrainer methods
the arms wrap or call, that `_compute_loss` runs exactly one policy forward through the helper, and
that TRL's buffer shuffle/split keeps the arms' per-row keys aligned. An upgrade that breaks any of
it fails here, not mid-run.

Part 2 builds real trainers on a tiny random VLM (no mocks) and checks, on identical inputs: papo with
gamma = eta1 = eta2 = 0 and evi_po with both lambdas 0 give exactly grpo's loss and gradients; papo's
loss is grpo's plus the pure term on the log-probs of TRL's own forward; re-scoring with unmodified
images reproduces TRL's log-probs; the buffered batch is never written to; masks depend only on
(seed, step, prompt); evi_po's direction and evidence terms reach the parameters.
"""

from __future__ import annotations

import inspect

import pytest

import torch  # the project's own dependencies: a broken install must fail, not skip
import trl

# --- part 1: the contract


def test_trl_is_pinned_exactly():
    assert trl.__version__ == "1.16.0", "arms/grpo.py touches GRPOTrainer internals: re-check them, then re-pin"


def test_private_signatures_the_arms_rely_on():
    from trl import GRPOTrainer

    helper = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    assert list(helper)[:5] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    for name in ("batch_size", "compute_entropy", "pixel_values", "image_grid_thw", "num_images",
                 "mm_token_type_ids", "token_type_ids"):
        assert name in helper, name
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    assert list(inspect.signature(GRPOTrainer._prepare_inputs).parameters) == ["self", "generation_batch"]
    assert list(inspect.signature(GRPOTrainer.compute_loss).parameters) == [
        "self", "model", "inputs", "return_outputs", "num_items_in_batch"]


def test_the_private_points_of_off_policy_rounds():
    """arms.offpolicy (rollout=async): `_generate_single_turn` returns (completion ids, per-token log-probs) and is
    the only generation call of a round; TRL's importance-sampling correction, between `old_per_token_logps` and
    `sampling_per_token_logps`, is gated on `use_vllm` (an attribute, set after construction) and applied in the
    loss; `old_per_token_logps` comes back in the generation batch."""
    from trl import GRPOTrainer

    assert list(inspect.signature(GRPOTrainer._generate_single_turn).parameters) == [
        "self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"]
    gen = inspect.getsource(GRPOTrainer._generate)
    assert gen.count("self._generate_single_turn(") == 1 and "return completion_ids, logprobs" in inspect.getsource(
        GRPOTrainer._generate_single_turn)
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for line in ("self.use_vllm and self.vllm_importance_sampling_correction",
                 "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                 'output["old_per_token_logps"] = old_per_token_logps',
                 'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio'):
        assert line in score, line
    assert 'per_token_loss * inputs["importance_sampling_ratio"]' in inspect.getsource(GRPOTrainer._compute_loss)


def test_safetensors_hands_its_writer_each_tensors_memory(tmp_path):
    """harness.accounting.tensorfiles wraps safetensors.torch.serialize_file (NOTE(safetensors-0.8)): save_file,
    under any name it was imported, calls that module global with a TensorSpec (data_ptr, data_len) per tensor,
    pointing at a CPU tensor's own memory."""
    import safetensors
    import safetensors.torch as st

    assert safetensors.__version__ == "0.8.0"
    assert list(inspect.signature(st.serialize_file).parameters) == ["tensor_dict", "filename", "metadata"]
    seen, original = {}, st.serialize_file

    def spy(tensor_dict, filename, metadata=None):
        seen.update({k: (s.data_ptr, s.data_len) for k, s in tensor_dict.items()})
        return original(tensor_dict, filename, metadata=metadata)

    t = torch.arange(6, dtype=torch.float32)
    st.serialize_file = spy
    try:
        from transformers.modeling_utils import safe_save_file  # imported under its own name

        safe_save_file({"t": t}, str(tmp_path / "x.safetensors"))
    finally:
        st.serialize_file = original
    assert seen == {"t": (t.data_ptr(), 24)}


def test_save_pretrained_reverts_the_weight_conversions_with_the_function_tensorfiles_calls():
    """harness.accounting.tensorfiles._disk_names (NOTE(transformers-5.24)) names the model's tensors as the checkpoint
    file does with transformers' own revert_weight_conversion(model, state_dict): the function save_pretrained
    calls before it writes, and it returns the same tensors (no copy) where the conversion is a renaming."""
    from transformers import modeling_utils
    from transformers.core_model_loading import revert_weight_conversion

    assert list(inspect.signature(revert_weight_conversion).parameters) == ["model", "state_dict"]
    assert "state_dict = revert_weight_conversion(model_to_save, state_dict)" in inspect.getsource(
        modeling_utils.PreTrainedModel.save_pretrained)


def test_compute_loss_runs_one_policy_forward_through_the_helper():
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert src.count("self._get_per_token_logps_and_entropies(") == 1
    assert "self._compute_loss(model, inputs)" in inspect.getsource(GRPOTrainer.compute_loss)
    prep = inspect.getsource(GRPOTrainer._prepare_inputs)
    for call in ("self._generate_and_score_completions(generation_batch)", "shuffle_sequence_dict(",
                 "split_tensor_dict(", "self._buffered_inputs[self._step % self.args.steps_per_generation]"):
        assert call in prep, call
    # the attributes the arms read
    for attr in ("self.num_generations", "self.loss_type", "self.eos_token_ids",
                 "self.current_gradient_accumulation_steps"):
        assert attr in inspect.getsource(GRPOTrainer), attr
    assert 'inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes' in src


def test_sft_num_tokens_comes_from_an_attribute_that_checkpoints_do_not_save():
    """The harness saves and restores SFTTrainer._total_train_tokens itself (arms/sft/trainer.py, arms/trl_hooks.py): TRL logs num_tokens
    from it and does not put it in its checkpoints. If TRL moves it (e.g. into TrainerState), revisit the fix."""
    from trl import SFTTrainer

    assert "self._total_train_tokens = 0" in inspect.getsource(SFTTrainer.__init__)
    assert 'self._metrics[mode]["num_tokens"] = [self._total_train_tokens]' in inspect.getsource(SFTTrainer.compute_loss)
    assert "_total_train_tokens" not in inspect.getsource(SFTTrainer._save_checkpoint)


def test_trl_counts_steps_per_generation_in_micro_batches(tmp_path):
    """harness.rounds converts to TRL's units: TRL advances `_step` once per micro-batch (training_step), regenerates
    every steps_per_generation x num_iterations of them and buffers steps_per_generation slices. Handed the
    harness's optimizer-step count unconverted, accumulation 2 generated twice per optimizer step (the bug)."""
    from trl import GRPOConfig, GRPOTrainer

    from harness.rounds import GenerationRound

    assert "self._step += 1" in inspect.getsource(GRPOTrainer.training_step)
    prep = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in prep
    assert "if self._step % generate_every == 0" in prep
    for ga, spg, k in ((1, 1, 1), (2, 1, 1), (4, 1, 2), (2, 2, 1), (1, 3, 2)):
        rnd = GenerationRound(prompts_per_step=4, num_generations=8, steps_per_generation=spg, num_iterations=k,
                              gradient_accumulation_steps=ga, max_completion_length=16)
        args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_accumulation_steps=ga,
                          report_to=[], **rnd.trl_kwargs())
        assert args.generation_batch_size == rnd.completions == 32 * spg  # one round, whatever the accumulation
        # TRL regenerates every this many micro-batches = the round's optimizer steps x micro-batches per step
        assert args.steps_per_generation * args.num_iterations == rnd.cycle * ga
        assert args.per_device_train_batch_size * ga == rnd.completions_per_step


def test_buffer_shuffle_and_split_keep_per_row_keys_aligned():
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    B = 6
    batch = {"prompt_ids": torch.arange(B).unsqueeze(1).repeat(1, 3), "num_images": [1] * B,
             "papo_masked_logps": torch.arange(B).float().unsqueeze(1).repeat(1, 4),
             "papo_masked_pixel_values": [torch.full((2, 5), float(i)) for i in range(B)],
             "evi_dir_ids": torch.arange(B).view(B, 1, 1).repeat(1, 3, 2), "evi_num_views": torch.tensor(4.0)}
    torch.manual_seed(0)
    for chunk in split_tensor_dict(shuffle_sequence_dict(batch), 2):
        rows = chunk["prompt_ids"][:, 0].tolist()
        assert chunk["papo_masked_logps"][:, 0].tolist() == rows
        assert [int(t[0, 0]) for t in chunk["papo_masked_pixel_values"]] == rows
        assert chunk["evi_dir_ids"][:, 0, 0].tolist() == rows
        assert chunk["evi_num_views"].item() == 4.0


# --- part 2: real trainers on a tiny VLM


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A small synthetic set and a tiny random Qwen2-VL, built once for the module."""
    from harness.data import ensure_synthetic, load_split
    from harness.models import build_tiny
    from harness.data.trainsets import corpus

    tmp = tmp_path_factory.mktemp("arms")
    root = ensure_synthetic(n_base=8, data_seed=0, image_size=56, cache_dir=tmp / "data")
    rows = sorted(load_split(root, "train"), key=lambda r: (r["group_id"], r["relation"]))
    tiny = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                vision_width=32, vision_depth=1, vocab_size=400, init_seed=0)
    path = build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny=tiny, corpus=corpus(rows),
                      cache_dir=tmp / "models")
    return {"root": root, "rows": rows, "model_path": path, "tmp": tmp}


def _varied(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]  # varied within every group: non-zero advantages


_varied.__name__ = "varied"


def build_context(env, arm: str, *overrides: str, model=None):
    """The BuildContext (arms.common) of `arm` on the tiny model and set, as the harness builds it (B = 2 prompts x 4)."""
    from arms.common import BuildContext
    from harness.cli import compose_plan
    from harness.models import load_tiny, special_token_ids_to_suppress
    from harness.data.trainsets import rl_dataset

    plan = compose_plan([f"arm={arm}", "debug=tiny", f"output_root={env['tmp']}", "arm.prompts_per_step=2",
                         "arm.num_generations=4", "arm.max_completion_length=6",
                         "arm.mask_truncated_completions=false", *overrides])  # random models rarely stop
    if model is None:
        model, processor = load_tiny(env["model_path"])
    else:
        _, processor = load_tiny(env["model_path"])
    return BuildContext(plan=plan, run_dir=env["tmp"] / arm, model=model, processor=processor,
                        train_dataset=rl_dataset(env["root"], env["rows"], is_vlm=True), reward_fn=_varied,
                        suppress_token_ids=special_token_ids_to_suppress(processor))


def build(env, arm: str, *overrides: str, model=None):
    """(trainer, model) for `arm` through arms.build_trainer, as the harness builds it (build_context)."""
    from arms import build_trainer

    ctx = build_context(env, arm, *overrides, model=model)
    trainer = build_trainer(arm, ctx)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; compute_loss reads it
    return trainer, ctx.model


def generation_batch(trainer, seed: int = 0, with_full: bool = False):
    """(dataset rows, TRL's generation batch plus the arm's keys); with_full: the first with a FULL view."""
    import json

    torch.manual_seed(seed)
    for gen in trainer.get_train_dataloader():
        if not with_full or any(json.loads(x["row"])["relation"] == "FULL" for x in gen):
            return gen, trainer._generate_and_score_completions(gen)
    raise AssertionError("no generation batch with a FULL view")


def loss_and_grads(trainer, model, batch):
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def assert_same(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.equal(la, lb), (la, lb)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


def test_papo_with_zero_coefficients_is_grpo(env):
    grpo, model = build(env, "grpo")
    papo, _ = build(env, "papo", "arm.gamma=0", "arm.eta1=0", "arm.eta2=0", model=model)
    probe, _ = build(env, "papo", model=model)  # a batch carrying papo's keys too
    _, batch = generation_batch(probe)
    assert "papo_masked_logps" in batch
    assert_same(loss_and_grads(grpo, model, batch), loss_and_grads(papo, model, batch))


def test_evi_po_with_zero_lambdas_is_grpo(env):
    grpo, model = build(env, "grpo")
    evi, _ = build(env, "evi_po", "arm.lambda_direction=0", "arm.lambda_evidence=0", model=model)
    probe, _ = build(env, "evi_po", model=model)
    _, batch = generation_batch(probe)
    assert {"evi_dir_ids", "evi_m_miss"} <= set(batch)
    assert_same(loss_and_grads(grpo, model, batch), loss_and_grads(evi, model, batch))


def test_papo_loss_is_grpo_plus_the_pure_term_on_trls_own_logps(env):
    from arms.papo.terms import papo_terms

    grpo, model = build(env, "grpo")
    papo, _ = build(env, "papo", "arm.gamma=0.5", "arm.eta1=0.1", "arm.eta2=0.1", model=model)
    gen, batch = generation_batch(papo)
    # re-scoring with the unmodified images reproduces TRL's pixel values and log-probs exactly
    from arms.trl_hooks import row_images

    pixels = papo.pixels_like(batch, [row_images(x) for x in gen])
    assert torch.equal(pixels, batch["pixel_values"])
    with torch.no_grad():
        p = papo.score_completions(model, batch, pixel_values=pixels)
        old = papo.trl_logps(model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                             torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
                             batch["completion_ids"].size(1), pixel_values=batch["pixel_values"],
                             image_grid_thw=batch["image_grid_thw"], num_images=batch["num_images"],
                             mm_token_type_ids=batch["mm_token_type_ids"])
    assert torch.equal(p, old)
    mask = batch["completion_mask"].float()
    assert not torch.allclose(batch["papo_masked_logps"] * mask, p * mask)  # the masked image changed m
    with torch.no_grad():
        l_grpo = grpo.compute_loss(model, batch)
        l_papo = papo.compute_loss(model, batch)
        term, _ = papo_terms(p, batch["papo_masked_logps"], mask, gamma=0.5, eta1=0.1, eta2=0.1)
    scale = mask.sum() / batch["num_items_in_batch"]  # dapo, one process, one micro-batch per generation
    assert torch.allclose(l_papo, l_grpo + term * scale, atol=1e-6)
    assert papo._metrics["train"]["loss/kl_prcp"] and papo._metrics["train"]["papo/entropy_masked"]


def test_papo_never_writes_to_the_buffered_batch_and_masks_per_step_and_prompt(env):
    papo, model = build(env, "papo", "arm.gamma=0.5", "arm.eta1=0.1")
    gen, batch = generation_batch(papo)
    frozen = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
    first, _ = loss_and_grads(papo, model, batch)
    second, _ = loss_and_grads(papo, model, batch)  # num_iterations > 1 reuses the same dict
    assert torch.equal(first, second)
    assert all(torch.equal(frozen[k], batch[k]) for k in frozen)
    again = papo.score_generation(gen, batch)["papo_masked_logps"]
    assert torch.equal(again, batch["papo_masked_logps"])  # same (seed, step, prompt) -> same masks
    papo.state.global_step += 1
    assert not torch.equal(papo.score_generation(gen, batch)["papo_masked_logps"], again)


def test_papo_recompute_with_grad_matches_the_value_and_adds_the_masked_gradient(env):
    nograd, model = build(env, "papo", "arm.gamma=0.5", "arm.eta2=0.2")
    withgrad, _ = build(env, "papo", "arm.gamma=0.5", "arm.eta2=0.2", "arm.recompute_masked_with_grad=true",
                        model=model)
    gen, batch = generation_batch(nograd)
    extra = withgrad.score_generation(gen, batch)
    assert len(extra["papo_masked_pixel_values"]) == len(gen)
    l1, g1 = loss_and_grads(nograd, model, batch)
    l2, g2 = loss_and_grads(withgrad, model, {**batch, **extra})
    assert torch.allclose(l1, l2, atol=1e-6)
    assert any(not torch.allclose(g1[k], g2[k]) for k in g1)


def test_evi_po_terms_reach_the_parameters_and_log_per_relation(env):
    grpo, model = build(env, "grpo")
    evi, _ = build(env, "evi_po", "arm.lambda_direction=1.0", "arm.lambda_evidence=1.0", "arm.kappa=10", model=model)
    gen, batch = generation_batch(evi, with_full=True)
    owners = batch["evi_dir_owner"]
    assert owners.sum().item() == 2 and batch["evi_num_views"].item() == 2  # one owner per prompt group
    full = batch["evi_rows"] > 0
    relations = batch["evi_relation"]
    assert full.any() and torch.equal(full, relations == 0)  # every FULL row is linked to its MISSING/CONTROL images
    mask = batch["completion_mask"].float()
    for key in ("evi_m_miss", "evi_m_ctrl"):
        assert torch.count_nonzero(batch[key][full] * mask[full]) > 0
        assert torch.count_nonzero(batch[key][~full]) == 0
    assert batch["evi_num_items"].item() == (mask * full[:, None]).sum().item()
    lg, gg = loss_and_grads(grpo, model, batch)
    le, ge = loss_and_grads(evi, model, batch)
    assert not torch.equal(lg, le)
    vision = [k for k in ge if "visual" in k]
    assert vision and any(not torch.equal(ge[k], gg.get(k, torch.zeros_like(ge[k]))) for k in vision)
    metrics = evi._metrics["train"]
    for key in ("evi/FULL/accuracy", "evi/MISSING/abstain", "evi/SUBSTITUTE/dir_acc", "loss/direction"):
        assert key in metrics, key


def test_evi_po_direction_scores_are_the_candidates_teacher_forced_logprobs(env):
    """Re-derive s(c|v) for each owner row with one unpadded forward per candidate, straight through the model."""
    import json

    from harness.rewards.answers import candidate_tokens
    from harness.rewards.answers import format_answer

    evi, model = build(env, "evi_po", "arm.lambda_evidence=0")
    assert evi.temperature != 1.0  # a tempered score would then differ from the reference
    gen, batch = generation_batch(evi)
    own = batch["evi_dir_owner"].nonzero().squeeze(1).tolist()
    with torch.no_grad():
        scores, valid = evi.direction_scores(model, batch, own)
    tok = evi.processing_class.tokenizer
    pix = evi.pixels_per_row(batch, batch["pixel_values"])
    for v, i in enumerate(own):
        cands = json.loads(gen[i]["views"])["candidates"]
        prefix, conts, n_scored = candidate_tokens(
            [tok(format_answer(c), add_special_tokens=False)["input_ids"] for c in cands])
        real = batch["prompt_mask"][i].bool()
        for c, (cont, n) in enumerate(zip(conts, n_scored)):
            ids = torch.cat([batch["prompt_ids"][i][real], torch.tensor(prefix + cont[:n])]).unsqueeze(0)
            mm = torch.zeros_like(ids)
            mm[0, : int(real.sum())] = batch["mm_token_type_ids"][i, : real.numel()][real]
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pix[i],
                               image_grid_thw=batch["image_grid_thw"][i: i + 1], mm_token_type_ids=mm).logits
            # the untempered policy (docs/arms.md), although TRL samples and scores the GRPO ratio at evi.temperature
            logits = logits[0, -n - 1: -1].float()
            logp = torch.log_softmax(logits, -1).gather(1, ids[0, -n:, None]).mean()
            assert scores[v, c].item() == pytest.approx(logp.item(), abs=1e-4)
        assert valid[v, : len(cands)].all() and not valid[v, len(cands):].any()


def test_evi_po_evidence_on_correct_only_weights_only_rewarded_full_rollouts(env):
    evi, _ = build(env, "evi_po", "arm.lambda_direction=0", "arm.evidence_on_correct_only=true")
    gen, batch = generation_batch(evi, with_full=True)
    correct, _ = evi._grade([__import__("json").loads(x["row"]) for x in gen], batch["completion_ids"])
    assert torch.equal(batch["evi_rows"], (batch["evi_relation"] == 0).float() * correct)
    assert "evi_dir_ids" not in batch  # lambda_direction = 0: no tokenization, no forward


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_extra_terms_sum_over_the_accumulation_window_like_trls_loss(env, loss_type):
    """GA = steps_per_generation = 2: the micro-batch terms TRL's buffer hands out sum to the window's token
    mean (dapo: TRL's normalizer) or to the mean of the micro-batch means (bnpo: / accumulation steps)."""
    from arms.papo.terms import papo_terms

    papo, model = build(env, "papo", "arm.gradient_accumulation_steps=2", "arm.steps_per_generation=2",
                        "train.save_steps=2", f"arm.loss_type={loss_type}")
    papo.current_gradient_accumulation_steps = 2
    torch.manual_seed(0)
    gen = next(iter(papo.get_train_dataloader()))
    papo._step, papo._buffered_inputs = 0, None
    parts = []
    for step in range(2):
        papo._step = step
        mb = papo._prepare_inputs(gen)  # TRL generates once, shuffles, splits, buffers; our keys ride along
        with torch.no_grad():
            p = papo.score_completions(model, mb, pixel_values=mb["pixel_values"])
        mask = papo.loss_mask(mb)
        term, _ = papo_terms(p, mb["papo_masked_logps"], mask, gamma=1.0)
        parts.append((term * papo.token_term_scale(mask, mb["num_items_in_batch"]), p, mb["papo_masked_logps"], mask))
    total = sum(t for t, *_ in parts)
    if loss_type == "dapo":
        whole, _ = papo_terms(torch.cat([q[1] for q in parts]), torch.cat([q[2] for q in parts]),
                              torch.cat([q[3] for q in parts]), gamma=1.0)
    else:
        whole = sum(papo_terms(p, m, mask, gamma=1.0)[0] for _, p, m, mask in parts) / 2
    assert total.item() == pytest.approx(whole.item(), rel=1e-5)


def test_evi_po_direction_term_is_a_mean_over_the_views_of_its_own_window(env):
    """steps_per_generation = accumulation = 2: TRL shuffles the round's rows before it splits them into 4
    micro-batches (2 optimizer steps of 2), so a step's window holds however many views' owner rows landed in it.
    Each window's direction term must be the mean over its own views, whatever the split: the hand computation
    scores each view alone. Before, the normalizer was the round's views / 2, and windows of 3 and 5 views weighed
    the term 0.75x and 1.25x."""
    from arms.evi_po.terms import direction_loss

    evi, model = build(env, "evi_po", "arm.gradient_accumulation_steps=2", "arm.steps_per_generation=2",
                       "train.save_steps=2")
    evi.current_gradient_accumulation_steps = 2
    windows = []
    for seed in range(4):  # several shuffles: at least one splits the views unevenly
        torch.manual_seed(seed)
        gen = next(iter(evi.get_train_dataloader()))
        evi._buffered_inputs = None
        mbs = []
        for step in range(4):
            evi._step = step
            mbs.append(evi._prepare_inputs(gen))  # TRL generates once, shuffles, splits, buffers
        for w in (0, 1):
            window = mbs[2 * w: 2 * w + 2]
            with torch.no_grad():
                got = sum(evi._direction_term(model, mb, {}) for mb in window)
                alone = []
                for mb in window:
                    for i in mb["evi_dir_owner"].nonzero().squeeze(1).tolist():
                        scores, valid = evi.direction_scores(model, mb, [i])
                        alone.append(direction_loss(scores, mb["evi_dir_target"][[i]], tau=evi.knobs.tau,
                                                    candidate_mask=valid)[0])
            assert int(window[0]["evi_num_views"]) == int(window[1]["evi_num_views"]) == len(alone)
            if alone:
                assert got.item() == pytest.approx(torch.stack(alone).mean().item(), rel=1e-4), (seed, w, len(alone))
            windows.append(len(alone))
    assert len(set(windows)) > 1, f"every shuffle split the views evenly ({windows}): the test has no uneven window"


def test_the_collective_timeout_reaches_trl_in_seconds(env):
    """placement.collective_timeout_s is TrainingArguments.ddp_timeout (seconds: transformers turns it into the
    timedelta it gives Accelerate's process group), the same timeout harness.dist.init gives the group it makes first."""
    trainer, _ = build(env, "grpo", "placement.collective_timeout_s=77")
    assert trainer.args.ddp_timeout == 77 and trainer.args.ddp_timeout_delta.total_seconds() == 77

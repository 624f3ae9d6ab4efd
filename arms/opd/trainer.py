"""opd's trainer: TRL's DistillationTrainer as shipped (generation, the chunked divergence, its loss scaling), with
the harness's accounting of the student's samples (docs/arms.md opd). Imports torch and trl.

Two private points of TRL are used, here only, tagged NOTE(trl-1.16) and pinned by tests/unit/test_opd.py's
contract test:

- `_generate_and_score_completions` is wrapped. TRL samples one completion per prompt there, once per optimizer
  step (its generation batch is the step's prompts); the wrapper hands the completions to the harness reward
  function, which writes their ledger rows and counts their tokens for the budget at once (the reward is
  recorded, not trained on), and holds their trace rows. It tags each completion with its index in the batch
  (`harness_index`): TRL shuffles the batch and splits it into the accumulation's micro-batches.
- `_compute_loss` is wrapped: while it runs, the module's ChunkedDivergenceFunction (the kernel that returns the
  per-token divergence TRL then sums into the loss) is seen through a recorder, so each completion's trace row
  gets the divergence the loss trained on: `kl` (nats per completion token, the mean over its `kl_tokens`
  tokens; beta=1: reverse KL, 0: forward KL, between: the generalized JSD) and `kl_sum`. The rows are written
  once the step's micro-batches have covered every completion.

The teacher is loaded from the plan's identity (the directory whose digest the plan recorded), merged if it is an
adapter, frozen, in eval mode.

The divergence: TRL passes one temperature to sampling and to the loss; here the student samples at
arm.temperature and the divergence compares the two distributions at arm.loss_temperature (1.0: the policies
themselves), so a sampling knob does not leak into the objective.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from arms.common import BuildContext, training_kwargs
from harness.rounds import GenerationRound

if TYPE_CHECKING:
    from harness.config.schema import ModelConfig


def opd_config_kwargs(ctx: BuildContext) -> dict:
    a = ctx.plan.cfg.arm
    rnd = ctx.plan.round  # the plan checked that it divides
    return dict(
        training_kwargs(ctx),
        # TRL's generation batch = per_device_train_batch_size x ranks x accumulation = one optimizer step's prompts
        per_device_train_batch_size=rnd.per_device_train_batch_size,
        max_completion_length=a.max_completion_length,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        beta=a.beta,
        # generation_kwargs REPLACES TRL's default suppress_tokens (docs/platform.md): list them ourselves
        generation_kwargs={"suppress_tokens": list(ctx.suppress_token_ids)},
        shuffle_dataset=True,
        log_completions=False,
        disable_dropout=True,
    )


def load_teacher(path: str, device: str, model_cfg: ModelConfig | None = None):
    """The teacher's model, frozen: a full policy directory, or an adapter merged into its base; in the student's
    dtype (`model_cfg`: the plan's cfg.model), not the checkpoint's own."""
    from harness.policy import load_policy

    model, _ = load_policy(Path(path), trainable=False, model_cfg=model_cfg)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.requires_grad_(False)
    return model.to(device).eval()


def build_trainer(ctx: BuildContext):
    from trl import DistillationConfig, DistillationTrainer

    class OpdTrainer(DistillationTrainer):
        """DistillationTrainer whose sampled completions go through the harness reward function (ledger, trace,
        budget); see the module docstring."""

        def __init__(self, *args, harness_reward, generation_round: GenerationRound, loss_temperature: float,
                     **kwargs):
            super().__init__(*args, **kwargs)
            self.harness_reward, self.generation_round = harness_reward, generation_round
            # TRL built its GenerationConfig from args.temperature above; from here on self.temperature is read
            # by the loss only (_compute_loss -> _chunked_divergence_loss(temperature=self.temperature))
            self.temperature = loss_temperature

        def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
            if "harness_index" not in inputs:  # not a training batch of ours (TRL's own eval)
                return super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
            with recorded_divergence() as seen:  # NOTE(trl-1.16): see recorded_divergence
                out = super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
            record_divergence(self.harness_reward, inputs, seen)
            return out

        def _generate_and_score_completions(self, inputs):
            # NOTE(trl-1.16): the one private hook. TRL samples the completions of `inputs` (one per prompt) and
            # returns the batch: prompt/completion ids and masks (right-padded), pixel_values, ...
            rnd = self.generation_round
            if self.model.training and len(inputs) != rnd.local_completions:
                raise RuntimeError(f"TRL sampled {len(inputs)} prompts on this rank, the harness's generation round "
                                   f"has {rnd.local_completions}: the TRL mapping (arms.opd) no longer matches TRL; "
                                   "run tests/unit/test_trl_contract.py")
            batch = super()._generate_and_score_completions(inputs)
            if self.model.training:
                ids = [row[mask.bool()].tolist() for row, mask in
                       zip(batch["completion_ids"].cpu(), batch["completion_mask"].cpu())]
                texts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
                rewards = self.harness_reward(prompts=[x["prompt"] for x in inputs], completions=texts,
                                              completion_ids=ids, trainer_state=self.state,
                                              row=[x["row"] for x in inputs])
                self._metrics["train"]["reward"].append(sum(rewards) / len(rewards))
                import torch

                batch["harness_index"] = torch.arange(len(ids), device=batch["completion_ids"].device)
            return batch

    a = ctx.plan.cfg.arm
    rnd = ctx.plan.round
    ctx.reward_fn.hold_trace()  # each trace row waits for its completion's divergence (_compute_loss)
    teacher = load_teacher(ctx.plan.identity["teacher"]["path"], ctx.device, ctx.plan.cfg.model)
    trainer = OpdTrainer(
        model=ctx.model,
        teacher_model=teacher,
        args=DistillationConfig(**opd_config_kwargs(ctx)),
        train_dataset=ctx.train_dataset,
        processing_class=ctx.processor,
        callbacks=ctx.callbacks,
        harness_reward=ctx.reward_fn,
        generation_round=rnd,
        loss_temperature=a.loss_temperature,
    )
    return trainer


@contextmanager
def recorded_divergence():
    """While it is open, TRL's distillation module sees its ChunkedDivergenceFunction through a recorder: the list
    it yields receives the per-token divergence of each call. NOTE(trl-1.16): TRL's _chunked_divergence_loss calls
    that kernel's apply once per micro-batch and sums its per-token divergence into the loss (the contract test
    in tests/unit/test_opd.py pins it)."""
    import trl.trainer.distillation_trainer as distillation

    kernel, seen = distillation.ChunkedDivergenceFunction, []

    class Recorded:
        @staticmethod
        def apply(*args):
            divergence, entropy = kernel.apply(*args)
            seen.append(divergence.detach())
            return divergence, entropy

    distillation.ChunkedDivergenceFunction = Recorded
    try:
        yield seen
    finally:
        distillation.ChunkedDivergenceFunction = kernel


def record_divergence(reward, inputs, seen: list) -> None:
    """Hand each completion of the micro-batch its summed divergence and token count (reward.complete), from the
    kernel's per-token values: one per position of the (B, K) completion block, or (on Triton devices) one per
    valid position, in order."""
    import torch

    if len(seen) != 1:
        raise RuntimeError(f"TRL's distillation loss called its divergence kernel {len(seen)} times (the harness "
                           "expects once): the TRL mapping (arms.opd) no longer matches TRL")
    per_token = seen[0]
    from arms.trl_hooks import loss_mask

    mask = loss_mask(inputs)
    valid = mask.reshape(-1) != 0
    full = torch.zeros(valid.numel(), dtype=torch.float64, device=per_token.device)
    if per_token.numel() == valid.numel():
        full = torch.where(valid.to(per_token.device), per_token.reshape(-1).double(), full)
    else:
        full[valid.to(per_token.device)] = per_token.double()
    sums = full.reshape(mask.shape).sum(dim=1).tolist()
    counts = (mask != 0).sum(dim=1).tolist()
    for index, kl_sum, n in zip(inputs["harness_index"].tolist(), sums, counts):
        reward.complete(index, {"kl": kl_sum / n if n else 0.0, "kl_sum": kl_sum, "kl_tokens": n})

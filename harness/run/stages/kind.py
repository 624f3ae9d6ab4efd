"""What a run of each kind does (the run-time half of harness.kinds, whose Kind answers at plan time): this
rank's logs and counters opened at the checkpoint's frontier, the training set and the reward function TRL calls,
what the run context reads from the built trainer, completion.json's budget fields and learning signal.

    kind_run(plan.kind)   SftRun | RlRun: the methods below, one each

Torch-free at import; what needs torch is imported inside the methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.kinds import Kind


class KindRun:
    """The run-time behaviour of one kind (`kind_run(kind)`)."""

    def open_logs(self, plan, run_dir: Path, rank: int, world: int, resume, opened) -> dict:
        """This rank's kind-specific logs and counters, as the run context's fields (`opened(key, rel)`: a log at
        the resume point's frontier)."""
        return {}

    def trainset(self, plan, data, policy, ctx) -> tuple[Any, Any]:
        """(the training dataset, the reward function TRL calls or None)."""
        raise NotImplementedError

    def built(self, trainer, ctx) -> None:
        """What the run context reads from the trainer once it is built."""

    def completion_fields(self, plan, run_path, ctx, trainer, ranks: list[dict]) -> dict:
        """completion.json's budget fields, checked against every rank's counters."""
        raise NotImplementedError

    def learning_signal(self, plan, run_path, world: int, eval_before: dict | None) -> dict:
        """completion.json's `learning_signal` (harness.run.learning): {} for a kind that samples nothing."""
        return {}



class SftRun(KindRun):
    """Supervised: whole rows over seeded passes; the loss tokens its trainer planned."""

    def trainset(self, plan, data, policy, ctx):
        from harness.data.trainsets import sft_dataset, sft_passes

        cfg = plan.cfg
        passes = sft_passes(cfg.arm, cfg.budget.max_steps, len(data.train_rows))
        return sft_dataset(data.root, data.train_rows, is_vlm=cfg.model.is_vlm, seed=cfg.seed, passes=passes), None

    def built(self, trainer, ctx) -> None:
        ctx.loss_tokens = trainer.harness_loss_token_plan["loss_tokens"]

    def completion_fields(self, plan, run_path, ctx, trainer, ranks: list[dict]) -> dict:
        plan_lt = trainer.harness_loss_token_plan
        trained = sum(r.get("trained_loss_tokens", 0) for r in ranks)
        out = dict(realized_loss_tokens=trained, planned_loss_tokens=plan_lt["loss_tokens"],
                   loss_token_ceiling=plan.budget["loss_token_ceiling"], sft_rows=plan_lt["rows"],
                   # the trainer's max_steps is the prefix's steps, so the Trainer's view says nothing: what cut
                   # the prefix of the epoch (the loss-token cap, budget.max_steps, or the end of the epoch)
                   stopped_by=plan_lt["limit"], stopped_by_source="sft_prefix")
        if len(ranks) > 1:
            out["ranks"] = [{"rank": r["rank"], "trained_loss_tokens": r.get("trained_loss_tokens", 0)} for r in ranks]
        return out



class RlRun(KindRun):
    """Samples completions: the ledger, trace and token counters; the prompts and the ledger's reward function."""

    def open_logs(self, plan, run_dir: Path, rank: int, world: int, resume, opened) -> dict:
        from harness.accounting.logs import ledger_path, trace_path

        totals = resume.totals(rank)
        signal = self._monitor(plan)
        if signal is not None and resume.checkpoint is not None:  # the window goes on from the checkpoint's
            from harness.run.learning import rounds_of_rows, trace_rows

            for r in rounds_of_rows(trace_rows(run_dir, world, before_step=resume.manifest["step"])):
                signal.observe(r)
        return dict(ledger=opened("ledger", ledger_path(rank)), trace=opened("trace", trace_path(rank)),
                    tokens_used=totals.get("completion_tokens", 0), completions=totals.get("completions", 0),
                    token_share=plan.budget["completion_token_ceiling"] // world, round=plan.round, signal=signal)

    @staticmethod
    def _monitor(plan):
        """The learning-signal monitor of this plan, None where the reward does not drive the update (opd)."""
        from harness.config.schema import BUILTIN_REWARD
        from harness.run.learning import Monitor

        cfg = plan.cfg
        extra = cfg.arm.reward_free_terms()
        if extra is None:
            return None
        return Monitor(cfg.train.signal_window, arm=cfg.arm.name, extra_terms=extra,
                       schema_reward=cfg.reward._target_ == BUILTIN_REWARD and not cfg.reward.components)

    def learning_signal(self, plan, run_path, world: int, eval_before: dict | None) -> dict:
        from harness.accounting.logs import METRICS_PATH, read_rows
        from harness.run.learning import at_ceiling, rounds_of_rows, summary, trace_rows

        mon = self._monitor(plan)
        out = {}
        if mon is not None:
            out = summary(rounds_of_rows(trace_rows(run_path, world)), mon.window, schema_reward=mon.schema_reward,
                          arm=mon.arm, extra_terms=mon.extra_terms)
            found = out["no_update"]
            metrics = Path(run_path) / METRICS_PATH
            if found is not None and metrics.is_file():  # the gradient the measured steps had (TRL's grad_norm)
                norms = [r["grad_norm"] for r in read_rows(metrics) if isinstance(r.get("grad_norm"), (int, float))
                         and found["since_step"] <= r["step"] <= found["until_step"] + plan.round.cycle - 1]
                found["grad_norm_max"] = max(norms) if norms else None
        out["eval_before_at_ceiling"] = at_ceiling(eval_before, plan.cfg.data.eval_split)
        return {"learning_signal": out}

    def trainset(self, plan, data, policy, ctx):
        from harness.accounting.ledger import HarnessReward, provenance_of
        from harness.eval.during import plan_rewards
        from harness.data.trainsets import rl_dataset

        dataset = rl_dataset(data.root, data.train_rows, is_vlm=plan.cfg.model.is_vlm)
        return dataset, HarnessReward(ctx, rewards=plan_rewards(plan), eos_token_ids=policy.eos_token_ids,
                                      provenance=provenance_of(plan))

    def completion_fields(self, plan, run_path, ctx, trainer, ranks: list[dict]) -> dict:
        from harness.accounting.logs import ledger_summary

        out = ledger_summary(run_path, ctx.world)
        out["completion_token_ceiling"] = plan.budget["completion_token_ceiling"]
        out["ranks"] = [{k: r[k] for k in ("rank", "completion_tokens", "completions")} for r in ranks]
        if out["realized_completion_tokens"] > out["completion_token_ceiling"]:
            raise RuntimeError(f"BUG: realized {out['realized_completion_tokens']} tokens > ceiling "
                               f"{out['completion_token_ceiling']}")
        if sum(r["completion_tokens"] for r in ranks) != out["realized_completion_tokens"]:
            raise RuntimeError(f"BUG: the ranks counted {[r['completion_tokens'] for r in ranks]} tokens, their "
                               f"ledgers hold {out['realized_completion_tokens']}")
        return out



_RUNS: dict[str, KindRun] = {"sft": SftRun(), "rl": RlRun()}


def kind_run(kind: Kind | str) -> KindRun:
    """What a run of this kind (harness.kinds) does."""
    return _RUNS[str(kind)]

"""An arm's kind, as one object: what differs between an arm that samples (rl) and one that does not (sft),
answered at plan time.

The registry gives each arm its kind by name (`ArmSpec(kind="rl")`) and keeps it as the object of this module
(`of(name)`); `Plan.kind` is that object. It is also its name: a `str` equal to "sft" or "rl", so the plan JSON,
the run manifest, completion.json and the report read and write it as before. What the kind decides before a run
lives here, one method each, and the planner and the run path ask the kind instead of testing it:

    the budget          the unit (sampled completion tokens | loss-bearing tokens), the plan's budget summary,
                        the fields the arm never reads (left out of semantic_sha256), the one-line budget
    a warm start        whether the plan carries an SFT parent (rl with arm.init=sft), where its policy starts
    evals               eval before training (rl), the eval curve's x axis (sampled tokens | steps)
    the preflight       the sampled tokens a prompt must leave room for (rl), whole rows against arm.max_length (sft)
    the display         the console line, the progress bar and the metrics row (from the run's counters), the
                        end-of-run summary and the model card's budget rows (from completion.json): formatting
                        only, no state of its own

What a run of the kind does (its logs and counters opened, its datasets, what it reads from its trainer,
completion.json's budget fields and learning signal) is harness.run.stages.kind's.

Torch-free, and light: it imports only what answers at plan time (the data spec, the generation round, the
reward's identity), so the arms' registry (arms.common.ArmSpec) can hold its objects.
"""

from __future__ import annotations


class Kind(str):
    """Base of the kinds: its instances are their names (`Kind` subclasses `str`)."""

    NAME = ""
    samples = False  # draws completions from the policy: token budget, reward, ledger, trace, generation round
    budget_unit = ""  # what the budget counts
    ceiling = ""  # the budget summary's key of the ceiling
    trains_on_rows = False  # trains on whole rows (prompt + answer), each of which must fit arm.max_length

    def __new__(cls, name: str | None = None):
        if name is not None and name != cls.NAME:
            raise ValueError(f"{cls.__name__} is the kind {cls.NAME!r}, not {name!r}")
        return super().__new__(cls, cls.NAME)

    def __repr__(self) -> str:
        return f"kinds.of({str(self)!r})"

    # --- plan time (torch-free)

    def warm_start(self, cfg) -> bool:
        """Whether a plan of this kind carries an SFT warm start (its parent), run first."""
        return False

    def policy_init(self, cfg) -> str | None:
        """arm.init, where the trained policy starts: sft (the parent's final policy) | scratch | a policy directory;
        None for a kind without the knob (it starts from the base model)."""
        return None

    def round(self, cfg):
        """The generation round (harness.rounds) of a plan of this kind, or None: it samples nothing."""
        return None

    def identity(self, config: dict) -> dict:
        """What this kind adds to a plan's identity."""
        return {}

    def irrelevant_fields(self) -> list[str]:
        """Config fields an arm of this kind never reads: left out of semantic_sha256, so they cannot split identical
        runs. SFT samples nothing (no rollout, reward or token budget); RL arms have no loss-token cap. Runs of a
        sweep that differ only there then share one SFT warm start."""
        raise NotImplementedError

    def budget_summary(self, cfg) -> dict:
        raise NotImplementedError

    def budget_line(self, budget: dict) -> str:
        """The budget in the run's first lines."""
        return f"{budget[self.ceiling]} {self.budget_unit.replace('_', ' ')}, <= {budget['max_steps']} steps"

    def sampled_tokens(self, cfg) -> int | None:
        """Tokens sampled after a training prompt at most (the preflight's room in the context), or None."""
        return None

    def evaluates_init(self, cfg) -> bool:
        """Whether a fresh run evaluates its init policy before training (eval before)."""
        return False

    def used(self, comp: dict) -> str:
        """The budget used, from completion.json: '1234/2048 tokens'."""
        raise NotImplementedError

    def curve_point(self, point: dict) -> str:
        """Where an eval point of train.eval_steps sits on the run's x axis."""
        return f"{point['step']}"

    curve_unit = "step"

    def console_step(self, step: int, max_steps: int) -> str:
        return f"step {step}/{max_steps}"

    def console_budget(self, ctx) -> str | None:
        """The console line's budget part."""
        return None

    def token_progress(self, ctx) -> tuple[int, int] | None:
        """(sampled tokens so far on all ranks, approximately; the ceiling): the progress bar's, or None (steps)."""
        return None

    def metrics_fields(self, ctx) -> dict:
        """What a metrics.jsonl row adds for this kind."""
        return {}

    def card_budget_rows(self, comp: dict) -> list[tuple[str, str, str]]:
        """The model card's budget rows (what, planned, realized), besides the optimizer steps."""
        raise NotImplementedError


class Sft(Kind):
    """Supervised: a loss-token cap, whole rows over seeded passes, no sampling."""

    NAME = "sft"
    budget_unit = "loss_tokens"
    ceiling = "loss_token_ceiling"
    trains_on_rows = True

    def irrelevant_fields(self) -> list[str]:
        return ["budget.max_completion_tokens", "budget.sft_warm_start_steps", "budget.sft_warm_start_epochs",
                "budget.sft_warm_start_max_length", "rollout", "reward", "train.eval_before"]

    def budget_summary(self, cfg) -> dict:
        from harness.data.spec import split_rows

        a, b = cfg.arm, cfg.budget
        rows = split_rows(cfg.data, cfg.data.train_split, cfg.model.patch_size)
        passes = None
        if rows:  # the passes over the training split budget.max_steps allows, capped by arm.epochs
            passes = round(b.max_steps * a.batch_size / rows, 2)
            passes = min(passes, a.epochs) if a.epochs is not None else passes
        return {
            "kind": "loss_tokens",
            "loss_token_ceiling": b.max_loss_tokens,
            "max_steps": b.max_steps,
            "train_rows": rows,
            "rows_per_step": a.batch_size,
            "epochs": passes,
            "epochs_cap": a.epochs,
            "rule": "train on the longest prefix of the planned passes (each a fresh seeded order of the training "
                    "split) whose loss tokens fit",
        }

    def used(self, comp: dict) -> str:
        return f"{comp['realized_loss_tokens']}/{comp['loss_token_ceiling']} loss tok"

    def console_budget(self, ctx) -> str | None:
        if not ctx.loss_tokens:
            return None
        return f"{ctx.loss_tokens} loss tokens planned (cap {ctx.plan.budget['loss_token_ceiling']})"

    def card_budget_rows(self, comp: dict) -> list[tuple[str, str, str]]:
        return [("loss tokens", f"cap {comp['loss_token_ceiling']} (budget.max_loss_tokens); the prefix of the planned "
                                f"passes that fits: {comp['planned_loss_tokens']}", str(comp["realized_loss_tokens"]))]


class Rl(Kind):
    """Samples completions: a sampled-token budget, a reward, the ledger and trace, a generation round."""

    NAME = "rl"
    samples = True
    budget_unit = "sampled_tokens"
    ceiling = "completion_token_ceiling"
    curve_unit = "tokens"

    def warm_start(self, cfg) -> bool:
        return cfg.arm.init == "sft"

    def policy_init(self, cfg) -> str:
        return cfg.arm.init

    def round(self, cfg):
        from harness.rounds import round_of

        return round_of(cfg)

    def identity(self, config: dict) -> dict:
        from harness.rewards.identity import reward_identity

        return {"reward": reward_identity(config["reward"])}  # the reward functions' sources

    def irrelevant_fields(self) -> list[str]:
        return ["budget.max_loss_tokens"]

    def budget_summary(self, cfg) -> dict:
        b, rnd = cfg.budget, self.round(cfg)
        rounds_that_fit = b.max_completion_tokens // rnd.token_bound
        return {
            "kind": "completion_tokens",
            "completion_token_ceiling": b.max_completion_tokens,
            "per_step_upper_bound": rnd.per_step_token_bound,
            "completions_per_step": rnd.completions_per_step,
            "generation_round": rnd.describe(),
            "max_steps": b.max_steps,
            # steps that fit even if every completion runs to max_completion_length; shorter ones buy more
            "guaranteed_steps": min(b.max_steps, rounds_that_fit * rnd.cycle),
            # at most this many tokens by max_steps: at or below the ceiling, max_steps binds before the budget
            # can, and "same budget" would mean "same steps"
            "max_steps_worst_case_tokens": -(-b.max_steps // rnd.cycle) * rnd.token_bound,
            "rule": "stop after the last step whose successor could exceed the remaining budget",
        }

    def sampled_tokens(self, cfg) -> int | None:
        return cfg.arm.max_completion_length

    def evaluates_init(self, cfg) -> bool:
        return cfg.train.eval_before

    def used(self, comp: dict) -> str:
        return f"{comp['realized_completion_tokens']}/{comp['completion_token_ceiling']} tokens"

    def curve_point(self, point: dict) -> str:
        return f"{point['completion_tokens']}"

    def console_step(self, step: int, max_steps: int) -> str:
        return f"step {step}"  # budget-bound: max_steps is only a cap, the token share is the progress that counts

    def console_budget(self, ctx) -> str | None:
        used, budget = self.token_progress(ctx)
        return f"tokens {used}/{budget} ({100 * used / budget:.0f}%)"

    def token_progress(self, ctx) -> tuple[int, int] | None:
        return ctx.tokens_used * ctx.world, ctx.plan.budget["completion_token_ceiling"]

    def metrics_fields(self, ctx) -> dict:
        return {"budget/tokens_used_rank0": ctx.tokens_used, **(ctx.signal_metrics or {})}

    def card_budget_rows(self, comp: dict) -> list[tuple[str, str, str]]:
        return [("sampled completion tokens", f"{comp['completion_token_ceiling']} (budget.max_completion_tokens)",
                 str(comp["realized_completion_tokens"])),
                ("completions", "", str(comp.get("realized_completion_count")))]


KINDS: dict[str, type[Kind]] = {k.NAME: k for k in (Sft, Rl)}


def of(name: str) -> Kind:
    """The kind named `name` (a registry entry's, a plan JSON's)."""
    try:
        return KINDS[str(name)]()
    except KeyError:
        raise ValueError(f"unknown arm kind {name!r}: one of {sorted(KINDS)}") from None

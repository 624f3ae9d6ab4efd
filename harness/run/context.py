"""This rank's run context: the run dir, the plan, its logs and the counters the harness's callbacks share.

Built once per attempt at training, restored from the resume point, by `harness.run.recipe.open_context` (the one
place that constructs it). After that every field has one writer: the file `WRITTEN_BY` names, and no other
(tests/unit/test_context.py reads the sources to hold it). A reader who asks "who set this?" looks there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from arms.common import trainer_totals
from harness.accounting.logs import AppendLog
from harness.rounds import GenerationRound

# What writes each field once the context is built ("-": only the construction sets it, from the resume point).
WRITTEN_BY = {
    "run_dir": "-", "plan": "-", "rank": "-", "world": "-",
    "ledger": "-", "trace": "-", "metrics": "-",  # this rank's logs, reopened at the checkpoint's frontier
    "token_share": "-", "round": "-", "signal": "-",
    "tokens_used": "harness/accounting/ledger.py",  # the ledger's reward function, per scored completion
    "completions": "harness/accounting/ledger.py",
    "trace_pending": "harness/accounting/ledger.py",
    "round_rows": "harness/accounting/ledger.py",
    "loss_tokens": "harness/run/stages/kind.py",  # SFT: read from the built trainer
    "stopped_by_budget": "harness/run/callbacks.py",  # BudgetCallback (restored for a final checkpoint)
    "halted": "harness/run/callbacks.py",  # HaltCallback
    "nonfinite_steps": "harness/run/callbacks.py",  # NonFiniteCallback
    "nonfinite_abort": "harness/run/callbacks.py",
    "step_clock": "harness/run/callbacks.py",  # MetricsCallback
    "pending_eval": "harness/eval/periodic.py",  # PeriodicEvalCallback
    "eval_s": "harness/eval/periodic.py",
    "signal_metrics": "harness/run/learning.py",  # observe_round
    "sampled_version": "arms/offpolicy.py",  # OffPolicyGRPOTrainer, as it takes a round from the buffer
}


@dataclass
class RunContext:
    run_dir: Path
    plan: object  # harness.plan.Plan
    rank: int = 0
    world: int = 1
    ledger: AppendLog | None = None
    trace: AppendLog | None = None
    metrics: AppendLog | None = None  # rank 0 only
    tokens_used: int = 0  # this rank's sampled completion tokens (ledger sum)
    completions: int = 0
    token_share: int | None = None  # this rank's share of budget.max_completion_tokens
    round: GenerationRound | None = None  # RL arms: the generation round (harness.rounds)
    loss_tokens: int = 0  # SFT: loss-bearing tokens trained on (counted up front)
    stopped_by_budget: bool = False
    halted: dict | None = None  # a planned stop after a step: {"status", "step", "signum"} (harness.halt)
    nonfinite_steps: int = 0  # optimizer steps skipped for a non-finite gradient (NonFiniteCallback), all of the run
    nonfinite_abort: list | None = None  # the skipped steps of this process, once over train.max_nonfinite_steps
    step_clock: tuple[float, int] | None = None  # (time, global_step) when this process's first step began
    pending_eval: tuple[int, dict] | None = None  # (step, eval_* logs) of a periodic eval, until its row is written
    eval_s: float = 0.0  # seconds of periodic evals in this process (not training time)
    trace_pending: int = 0  # trace rows sampled but held for their loss's fields (HarnessReward.hold_trace)
    round_rows: tuple[int, list] | None = None  # (step, this rank's scored completions) of the last round sampled
    signal: object | None = None  # harness.run.learning.Monitor of an RL run whose update the reward drives
    signal_metrics: dict | None = None  # the last round's signal/* values for the metrics row
    sampled_version: int | None = None  # rollout=async: the policy version that sampled the round being scored

    def frontier(self) -> dict:
        if self.trace_pending:  # a checkpoint would bind a trace without them: they would be lost on resume
            raise RuntimeError(f"{self.trace_pending} trace rows of this round are still held for their loss's "
                               "fields at a checkpoint: the arm's loss did not see every completion of the step")
        out = {}
        if self.ledger is not None:
            out["ledger"] = self.ledger.frontier().to_json()
        if self.trace is not None:
            out["trace"] = self.trace.frontier().to_json()
        if self.metrics is not None:
            out["metrics"] = self.metrics.frontier().to_json()
        return out


class TrainerLink:
    """The arm's trainer, for the callbacks built before it: they take these methods as constructor arguments,
    and the train stage binds the trainer once, right after building it."""

    def __init__(self):
        self.trainer = None

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def totals(self) -> dict:
        """The trainer's own counters (the counters protocol of arms.common.BuildContext), or none."""
        return trainer_totals(self.trainer)

    def log(self, logs: dict) -> None:
        """`logs` to every sink the trainer logs to (its callbacks' on_log: TensorBoard, W&B, metrics.jsonl)."""
        t = self.trainer
        t.callback_handler.on_log(t.args, t.state, t.control, logs)

"""Does an RL run learn? The learning-signal monitor of every RL run whose update is driven by the reward.

GRPO's advantage of a completion is its reward minus its group's mean (divided by the group's std): a group whose
completions all got the same reward contributes exactly 0 to the policy-gradient term. When every group of a round
is flat, the reward moves nothing; with `beta` 0 (the default) GRPO's whole gradient is then 0. PAPO's and evi_po's
extra terms (KL_prcp, the direction and evidence terms) still have a gradient: they move the policy without any
reward signal. A policy that writes no well-formed answer at all is the usual cause on a fresh checkpoint: every
completion gets the format penalty.

Per generation round (harness.rounds) the monitor measures, summed over every rank (`RoundStats`):
- the share of groups whose rewards are all equal (`flat_share`; TRL logs the same as frac_reward_zero_std),
- the share of well-formed completions (the answer schema's parse found an answer: harness.rewards.answers),
- the reward's spread (`reward_std`, over the round's completions),
and the run's `grad_norm` (TRL's log) goes into the statement. Over a rolling window of `train.signal_window`
rounds, no update can come from the reward when every round of the window had every group flat, or (built-in
reward: its score is the answer schema's) not one well-formed completion. The console says so once, with the
cause it measured, the step it started and the likely fixes; completion.json's `learning_signal` and the
metrics rows (`signal/*`) carry the same. A run is never stopped for it: in a comparison, budget parity comes
first. A run whose eval before RL is already at its ceiling (every view correct) is told that there is nothing left
to learn on that split.

The statement in completion.json is computed from the trace rows of every rank (the whole run, resumed or not),
so a resumed run states exactly what an uninterrupted one does. Torch-free.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

FLAT_ATOL = 1e-8  # a group is flat when max - min of its rewards is within this (TRL: torch.isclose(std, 0))
CEILING = 1.0 - 1e-9  # an accuracy at (or above) this is the eval's ceiling: every view correct


# --- what one round measured


@dataclass(frozen=True)
class RoundStats:
    """One generation round of every rank: counts and reward moments (mergeable across ranks)."""

    step: int  # the round's first optimizer step (the trace rows' `step`)
    completions: int = 0
    groups: int = 0
    flat_groups: int = 0
    well_formed: int = 0
    correct: int = 0
    truncated: int = 0
    rewards: tuple = ()  # every completion's reward, sorted: moments that do not depend on how ranks split them
    errors: dict = field(default_factory=dict)  # parser error -> completions

    @classmethod
    def of_rows(cls, step: int, rows: Iterable[dict]) -> "RoundStats":
        """The stats of one round's trace rows (one rank's, or all). A group is a prompt slot of the round: the
        completion id's `<tag>:<step>:<slot>:<generation>` (harness.accounting.ledger)."""
        groups: dict[str, list[float]] = {}
        n = ok = correct = trunc = 0
        errors: Counter = Counter()
        for r in rows:
            reward = float(r["reward"])
            groups.setdefault(str(r["completion_id"]).rsplit(":", 1)[0], []).append(reward)
            n += 1
            if r.get("parser_error") is None:
                ok += 1
            else:
                errors[str(r["parser_error"])] += 1
            correct += bool(r.get("correct"))
            trunc += bool(r.get("truncated"))
        flat = sum(1 for g in groups.values() if max(g) - min(g) <= FLAT_ATOL * max(1.0, abs(max(g))))
        return cls(step=step, completions=n, groups=len(groups), flat_groups=flat, well_formed=ok, correct=correct,
                   truncated=trunc, rewards=tuple(sorted(r for g in groups.values() for r in g)),
                   errors=dict(sorted(errors.items())))

    @classmethod
    def merge(cls, parts: list["RoundStats"]) -> "RoundStats":
        """One round from every rank's part (a group lives on one rank: harness.rounds)."""
        errors: Counter = Counter()
        for p in parts:
            errors.update(p.errors)
        return cls(step=parts[0].step, completions=sum(p.completions for p in parts),
                   groups=sum(p.groups for p in parts), flat_groups=sum(p.flat_groups for p in parts),
                   well_formed=sum(p.well_formed for p in parts), correct=sum(p.correct for p in parts),
                   truncated=sum(p.truncated for p in parts),
                   rewards=tuple(sorted(r for p in parts for r in p.rewards)), errors=dict(sorted(errors.items())))

    @property
    def flat_share(self) -> float:
        return self.flat_groups / self.groups if self.groups else 0.0

    @property
    def well_formed_share(self) -> float:
        return self.well_formed / self.completions if self.completions else 0.0

    @property
    def reward_mean(self) -> float:
        return math.fsum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def reward_std(self) -> float:
        """The population std of the round's rewards (all groups together)."""
        if not self.rewards:
            return 0.0
        mean = self.reward_mean
        return math.sqrt(math.fsum((r - mean) ** 2 for r in self.rewards) / len(self.rewards))

    def metrics(self) -> dict:
        """The metrics row's `signal/*` values of this round."""
        return {"signal/flat_groups": round(self.flat_share, 6), "signal/well_formed": round(self.well_formed_share, 6),
                "signal/reward_std": round(self.reward_std, 6)}


def rounds_of_rows(rows: Iterable[dict]) -> list[RoundStats]:
    """Every round of trace rows (any ranks, any order), by step."""
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    return [RoundStats.of_rows(step, by_step[step]) for step in sorted(by_step)]


def trace_rows(run_dir: Path | str, world: int, before_step: int | None = None) -> list[dict]:
    """The trace rows of every rank of a run; with `before_step` (a checkpoint's step), only those of rounds sampled
    before it: another rank's file may still hold rows past that checkpoint's frontier (its own rank truncates it
    when it reopens it), and the round sampled at the checkpoint's step is sampled again after the resume."""
    from harness.accounting.logs import read_rows, trace_path

    out = []
    for rank in range(world):
        path = Path(run_dir) / trace_path(rank)
        if path.is_file():
            out.extend(r for r in read_rows(path) if before_step is None or int(r["step"]) < before_step)
    return out


# --- the window and its verdict


def no_update_cause(r: RoundStats, schema_reward: bool) -> str | None:
    """Why the reward cannot move the policy in this round: "no_well_formed" (the built-in reward: not one
    completion parsed to an answer, so each got a format score), "flat_groups" (every group's rewards equal, so
    every advantage is 0), or None (some group carries signal)."""
    if not r.completions:
        return None
    if schema_reward and r.well_formed == 0:
        return "no_well_formed"
    if r.groups and r.flat_groups == r.groups:
        return "flat_groups"
    return None


class Monitor:
    """Rounds in, one finding out: the first time `window` consecutive rounds had no signal (or, at the end of a
    run shorter than the window, every one of its rounds). `schema_reward`: the reward is the built-in one (its
    score is the answer schema's, so no well-formed answer means no signal); `arm`: the arm's name; `extra_terms`:
    its active terms that move the policy without the reward (ArmConfig.reward_free_terms)."""

    def __init__(self, window: int, *, schema_reward: bool, arm: str, extra_terms: list[str]):
        self.window, self.schema_reward, self.arm, self.extra_terms = window, schema_reward, arm, extra_terms
        self.seen = 0  # rounds observed
        self.last_step: int | None = None  # the step of the last round observed
        self.stretch: list[RoundStats] = []  # the current run of rounds without signal
        self.finding: dict | None = None  # as said when established
        self._found: list[RoundStats] | None = None  # the finding's stretch, as far as it went on
        self._recovered: int | None = None  # the first step with signal after it

    def observe(self, r: RoundStats) -> dict | None:
        """The finding when this round establishes it (once per run), else None."""
        self.seen += 1
        self.last_step = r.step
        self.stretch = self.stretch + [r] if no_update_cause(r, self.schema_reward) else []
        if self.finding is not None:
            if self.stretch and self.stretch[0] is self._found[0]:
                self._found = list(self.stretch)  # the stretch of the finding goes on
            elif self._recovered is None:
                self._recovered = r.step + 1
            return None
        if len(self.stretch) >= self.window:
            self._found = list(self.stretch)
            self.finding = self._finding(self.stretch)
            return self.finding
        return None

    def end(self) -> dict | None:
        """At the end of the run: the finding over its whole stretch (`recovered_at`: the first round with signal
        after it, None when it lasted to the end), also for a run shorter than the window that never had signal."""
        if self.finding is None and self.stretch and len(self.stretch) == self.seen:
            self._found = list(self.stretch)
        if self._found is None:
            return None
        return {**self._finding(self._found), "recovered_at": self._recovered}

    def _finding(self, stretch: list[RoundStats]) -> dict:
        causes = [no_update_cause(r, self.schema_reward) for r in stretch]
        cause = "no_well_formed" if all(c == "no_well_formed" for c in causes) else "flat_groups"
        total = RoundStats.merge(stretch)
        # steps as the console counts them: a round sampled at global_step s trains optimizer step s + 1 onward
        f = {"cause": cause, "since_step": stretch[0].step + 1, "until_step": stretch[-1].step + 1, "rounds": len(stretch),
             "window": self.window,
             "completions": total.completions, "well_formed": round(total.well_formed_share, 6),
             "correct": round(total.correct / total.completions, 6) if total.completions else 0.0,
             "truncated": round(total.truncated / total.completions, 6) if total.completions else 0.0,
             "flat_groups": round(total.flat_share, 6),
             "reward": [total.rewards[0], total.rewards[-1]],
             "parser_errors": dict(Counter(total.errors).most_common(3))}
        f["text"] = finding_text(f, self.arm, self.extra_terms)
        f["fix"] = finding_fix(f)
        return f


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def finding_text(f: dict, arm: str, extra_terms: list[str]) -> str:
    """One paragraph: what was measured, since when, and what it means for the update."""
    lo, hi = f["reward"]
    rewards = (f"every completion got reward {lo:.3f}" if abs(hi - lo) <= FLAT_ATOL * max(1.0, abs(hi))
               else f"rewards {lo:.3f} to {hi:.3f}, equal within every group")
    errs = ", ".join(f"{k} {_pct(v / f['completions'])}" for k, v in f["parser_errors"].items())
    rounds = f"{f['rounds']} generation round{'s' if f['rounds'] != 1 else ''}"
    if f["cause"] == "no_well_formed":
        what = (f"not one of the {f['completions']} completions of {rounds} from step {f['since_step']} was a "
                f"well-formed answer ({errs or 'no parse'}; {_pct(f['truncated'])} truncated); {rewards}")
    else:
        solved = f["correct"] >= CEILING
        what = (f"in {rounds} from step {f['since_step']}, every group's completions got the same reward ({rewards}; "
                f"{_pct(f['well_formed'])} well-formed, {_pct(f['correct'])} correct)"
                + ("; every completion is correct: nothing is left to learn on these prompts" if solved else ""))
    effect = ("so every group's advantage is 0 and the reward gives the policy no update"
              + (f"; only {' and '.join(extra_terms)} of {arm} move it" if extra_terms else
                 f"; {arm}'s loss has no other term, so its gradient is 0"))
    return f"{what}, {effect}."


def finding_fix(f: dict) -> str:
    if f["cause"] == "no_well_formed":
        return ("fix: start RL from a policy that writes the answer format: an SFT warm start (arm.init=sft) long "
                "enough to pass its format check (raise budget.sft_warm_start_steps; keep "
                "budget.sft_warm_start_min_format > 0)" + ("; or raise arm.max_completion_length: completions are "
                                                           "cut" if f["truncated"] > 0.5 else "") + ".")
    if f["correct"] >= CEILING:
        return "fix: harder training data (this policy already solves every prompt), or stop RL here."
    if f["correct"] == 0:
        return ("fix: start from a policy that is sometimes right (a longer SFT warm start: "
                "budget.sft_warm_start_steps), sample more diverse groups (a larger arm.num_generations or "
                "arm.temperature), or a reward with partial credit.")
    return ("fix: sample more diverse groups (a larger arm.num_generations or arm.temperature), or mix easier and "
            "harder prompts so that groups disagree.")


def observe_round(ctx) -> dict | None:
    """After an optimizer step (harness.run.callbacks.SignalCallback): the round this step sampled, if any (the reward
    function left it in `ctx.round_rows`) and the monitor has not seen it, gathered from every rank (the same merged
    round on each), judged by `ctx.signal`; its signal/* values go to the step's metrics row. The finding when this
    round establishes it."""
    from harness import dist

    if ctx.round_rows is None or ctx.signal is None or ctx.round_rows[0] == ctx.signal.last_step:
        return None  # (every rank decides alike: the same steps sample, the monitor saw the same merged rounds)
    step, rows = ctx.round_rows
    merged = RoundStats.merge(dist.all_gather(RoundStats.of_rows(step, rows)))
    found = ctx.signal.observe(merged)
    ctx.signal_metrics = {**merged.metrics(), "signal/no_update": int(
        ctx.signal.finding is not None and no_update_cause(merged, ctx.signal.schema_reward) is not None)}
    return found


# --- what completion.json says


def summary(rounds: list[RoundStats], window: int, *, schema_reward: bool, arm: str, extra_terms: list[str]) -> dict:
    """completion.json's `learning_signal` of a run's rounds (all of them, every rank)."""
    mon = Monitor(window, schema_reward=schema_reward, arm=arm, extra_terms=extra_terms)
    for r in rounds:
        mon.observe(r)
    total = RoundStats.merge(rounds) if rounds else None
    return {
        "rounds": len(rounds), "window": window,
        "flat_groups": round(sum(r.flat_groups for r in rounds) / max(1, sum(r.groups for r in rounds)), 6),
        "well_formed": round(total.well_formed_share, 6) if total else None,
        "reward_std_mean": round(sum(r.reward_std for r in rounds) / len(rounds), 6) if rounds else None,
        "no_update": mon.end(),
    }


def at_ceiling(block: dict | None, split: str | None = None) -> dict | None:
    """{"accuracy", "n", "split", "text", "fix"} when an eval block (eval before RL) already scores every view
    correct; else None."""
    if not isinstance(block, dict):
        return None
    acc, n = block.get("accuracy"), block.get("n")
    if not isinstance(acc, (int, float)) or not n or acc < CEILING:
        return None
    split = split or block.get("split") or "eval"
    return {"accuracy": acc, "n": n, "split": split,
            "text": (f"the policy RL starts from already answers every one of the {n} {split} views correctly "
                     f"(accuracy {acc:.3f}): there is nothing left to learn on this split, and the eval after "
                     "training cannot show a gain"),
            "fix": ("fix: evaluate on a harder split (data.eval_split) or harder data; for a comparison of arms, "
                    "a shorter warm start (budget.sft_warm_start_steps) leaves RL something to do.")}

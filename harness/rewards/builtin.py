"""The harness reward: relation-aware answer correctness, optional format term, invalid penalty.

    total = correct_term + format_term + invalid_term

- correct_term = cfg.correct when the completion is valid and its normalized answer equals the
  view's target in target space (harness.rewards.answers): abstaining ("" after normalization) is
  correct only on MISSING views, and on MISSING any non-abstention is wrong. Else 0.
- format_term = cfg.format_weight for a valid completion (well-formed and not truncated), right
  or wrong; 0 otherwise.
- invalid_term = -cfg.invalid_penalty for an invalid completion: unparsable, OR truncated.
  A truncated completion hit the length limit before end-of-sequence, so it is invalid even
  when its text happens to parse (the tags may be cut mid-answer, and rewarding it would teach
  the policy to run into the limit); it earns neither correctness nor format. The trainer masks
  truncated completions from the loss separately; they still count against the budget.

`score` is pure and torch-free; ScoreTrace is one row of traces/rank-<r>.jsonl minus provenance
(the trainer adds completion id and identity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Protocol

from harness.rewards.answers import normalize_answer, normalize_target, parse_answer
from harness.identity import canonical_json


class RewardWeights(Protocol):
    """What `score` reads from its config (harness.config.schema.RewardConfig, or any object with these)."""

    correct: float
    format_weight: float
    invalid_penalty: float


@dataclass(frozen=True)
class RewardCfg:
    correct: float
    format_weight: float
    invalid_penalty: float


def reward_config(d: dict) -> RewardCfg:
    """The weights of a plan's `reward` config (a dict of plan.config)."""
    return RewardCfg(d["correct"], d["format_weight"], d["invalid_penalty"])


@dataclass(frozen=True)
class ScoreTrace:
    parsed: str | None  # text between the tags, None when malformed
    prediction: str | None  # target space: "" = abstention, None = unparsable or unrecognized
    gold: str  # the view's target in target space
    components: dict[str, float]  # correct, format, invalid
    total: float
    parser_error: str | None  # harness.rewards.answers error code, or "truncated"
    relation: str
    truncated: bool
    answer_type: str
    abstained: bool
    correct: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """One compact JSON line (sorted keys) for the reward trace."""
        return canonical_json(self.to_dict())


def score(completion: str, record: Mapping[str, Any], *, truncated: bool, cfg: RewardWeights) -> ScoreTrace:
    """Score one completion for one dataset row (fields relation, answer_type, target, choices)."""
    relation, atype, choices = str(record["relation"]), str(record["answer_type"]), record.get("choices")
    gold = normalize_target(str(record["target"]), atype, choices)
    parsed = parse_answer(completion)
    prediction = normalize_answer(parsed.answer, atype, choices) if parsed.ok else None
    valid = parsed.ok and not truncated
    abstained = prediction == ""
    if relation == "MISSING":
        correct = valid and abstained
    else:
        correct = valid and not abstained and prediction is not None and prediction == gold
    components = {
        "correct": float(cfg.correct) if correct else 0.0,
        "format": float(cfg.format_weight) if valid else 0.0,
        "invalid": 0.0 if valid else -float(cfg.invalid_penalty),
    }
    error = parsed.error if parsed.error is not None else ("truncated" if truncated else None)
    return ScoreTrace(
        parsed=parsed.answer,
        prediction=prediction,
        gold=gold,
        components=components,
        total=components["correct"] + components["format"] + components["invalid"],
        parser_error=error,
        relation=relation,
        truncated=truncated,
        answer_type=atype,
        abstained=abstained,
        correct=correct,
    )


def answer_reward(prompts, completions, completion_ids, *, target, answer_type, relation, choices=None, truncated=None,
                  correct: float = 1.0, format_weight: float = 0.0, invalid_penalty: float = 0.5, **_) -> list[float]:
    """The built-in reward in TRL's reward_funcs form (reward._target_'s default): `score(...).total` of each
    completion, with the weights as keyword arguments (the harness passes reward.correct / format_weight /
    invalid_penalty). `truncated` (one bool per completion; the harness passes it) makes a completion invalid."""
    cfg = RewardCfg(correct, format_weight, invalid_penalty)
    n = len(completions)
    choices = choices if choices is not None else [None] * n
    truncated = truncated if truncated is not None else [False] * n
    return [score(completion_text(c), {"relation": r, "answer_type": a, "target": t, "choices": ch}, truncated=tr,
                  cfg=cfg).total
            for c, t, a, r, ch, tr in zip(completions, target, answer_type, relation, choices, truncated)]


def cut_at_eos(ids: list[int], eos: set[int], pad: int | None = None) -> tuple[list[int], bool]:
    """(the completion's tokens up to and including its first end-of-sequence token, truncated).

    The one truncation rule (the reward and ledger, greedy eval, evi_po's grading): a completion with no
    end-of-sequence token within its sampled tokens is truncated (the invalid-format penalty, masked from
    the loss when arm.mask_truncated_completions). `pad`: padding dropped from a truncated, padded row.
    """
    end = next((j for j, t in enumerate(ids) if t in eos), None)
    if end is None:
        return [t for t in ids if t != pad] if pad is not None else list(ids), True
    return list(ids[: end + 1]), False


def completion_text(completion: Any) -> str:
    """The text of a completion as TRL passes it: a string, or a chat list of assistant messages."""
    if isinstance(completion, str):
        return completion
    parts = []
    for msg in completion:
        content = msg.get("content", "") if isinstance(msg, Mapping) else msg
        if isinstance(content, str):
            parts.append(content)
        else:  # [{"type": "text", "text": ...}, ...]
            parts.extend(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return "".join(parts)

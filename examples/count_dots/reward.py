"""A numeric-tolerance reward in TRL's reward_funcs form, for the harness's reward._target_:

    python -m harness data=jsonl data.path=DATA \
        reward._target_=examples/count_dots/reward.py:within_tolerance +reward.kwargs.tolerance=0

1.0 when the completion is one <answer>NUMBER</answer> within `tolerance` of the target, else 0.0; `format_bonus`
is added for a well-formed answer, right or wrong (shaping). The harness passes the dataset's columns (target, ...)
as keyword arguments, one entry per completion, and `truncated` (no end-of-sequence within the sampled tokens).
"""

import re

_ANSWER = re.compile(r"\s*<answer>\s*([-+]?\d+(?:\.\d+)?)\s*</answer>\s*")


def within_tolerance(prompts, completions, completion_ids, target, truncated, tolerance=0.0, format_bonus=0.0,
                     **kwargs):
    rewards = []
    for completion, gold, cut in zip(completions, target, truncated):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        m = None if cut else _ANSWER.fullmatch(text)
        if m is None:
            rewards.append(0.0)
            continue
        close = abs(float(m.group(1)) - float(gold)) <= tolerance
        rewards.append((1.0 if close else 0.0) + format_bonus)
    return rewards

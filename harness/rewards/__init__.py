"""Rewards: what a completion earns, from its parsed answer to the number TRL trains on. Torch-free.

    answers      the answer tags, the target space and the relation a view's target holds to the truth
    builtin      the built-in relation-aware reward: score, answer_reward (the default reward._target_,
                 "harness.rewards:answer_reward"), cut_at_eos
    functions    reward.* as the reward functions a run calls (Rewards.score): the built-in, a researcher's own,
                 weighted terms
    conventions  a researcher's function called in its own convention (trl, verl, easyr1), its result checked
    identity     the reward's source digests in a plan's identity; an edited reward refused on resume and eval

The built-in's names are re-exported here: `harness.rewards:answer_reward` is its documented target.
"""

from harness.rewards.builtin import (  # noqa: F401  (their documented import path: harness.rewards)
    RewardCfg, RewardWeights, ScoreTrace, answer_reward, completion_text, cut_at_eos, reward_config, score)

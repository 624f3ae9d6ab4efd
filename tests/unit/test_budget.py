"""The budget rule: stop after the last step whose successor could exceed the remaining budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from harness.run.callbacks import BudgetCallback
from harness.run.context import RunContext
from harness.rounds import GenerationRound


def simulate(tokens_per_step: list[int], *, share: int, bound: int, generate_every: int = 1, max_steps: int = 100):
    """`bound`: one round's worst case (4 prompts x 8 x bound/32 tokens); `generate_every`: the round's optimizer
    steps (num_iterations passes over one generation)."""
    plan = SimpleNamespace(budget={"completion_token_ceiling": share}, rl=True)
    rnd = GenerationRound(prompts_per_step=4, num_generations=8, steps_per_generation=1,
                          num_iterations=generate_every, gradient_accumulation_steps=1,
                          max_completion_length=bound // 32)
    assert rnd.token_bound == bound and rnd.cycle == generate_every
    ctx = RunContext(run_dir=None, plan=plan, token_share=share, round=rnd)
    cb = BudgetCallback(ctx)
    state, control = TrainerState(max_steps=max_steps), TrainerControl()
    args = SimpleNamespace()
    for step, tokens in enumerate(tokens_per_step, start=1):
        ctx.tokens_used += tokens
        assert ctx.tokens_used <= share, "a step ran that could exceed the budget"
        state.global_step = step
        cb.on_step_end(args, state, control)
        if control.should_training_stop:
            return step, ctx
    return None, ctx


@pytest.mark.parametrize("budget,expected", [
    (512 * 3, 3),  # exactly three worst-case steps
    (512 * 3 + 511, 3),  # one token short of a fourth
    (512 * 4, 4),
    (600, 1),
])
def test_worst_case_steps_stop_at_the_last_that_fits(budget, expected):
    step, ctx = simulate([512] * 20, share=budget, bound=512)
    assert step == expected and ctx.stopped_by_budget


def test_short_completions_buy_more_steps():
    # 300 tokens per step, bound 512, budget 1600: after 3 steps 900 (+512 fits), after 4 steps 1200 (+512 > 1600)
    step, _ = simulate([300] * 20, share=1600, bound=512)
    assert step == 4


def test_steps_without_generation_cost_nothing():
    # TRL regenerates every 2 steps: the odd steps' successors reuse the buffer
    step, _ = simulate([512, 0, 512, 0, 512, 0], share=1100, bound=512, generate_every=2)
    assert step == 4  # after step 4 (1024 used) the successor (step 5) generates: 1024 + 512 > 1100


def test_no_stop_when_max_steps_ends_the_run():
    step, ctx = simulate([10] * 5, share=10_000, bound=512, max_steps=5)
    assert step is None and not ctx.stopped_by_budget

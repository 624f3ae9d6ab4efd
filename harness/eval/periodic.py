"""The periodic eval (train.eval_steps): a TrainerCallback that evaluates the live weights after every N-th
optimizer step with the final eval's greedy eval (its scorer: harness.eval.during.periodic_eval), binds the result
to that step's checkpoint, and leaves every RNG the training reads as it was (`preserved_rng`), so that an eval
changes no sample and no update.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from transformers import TrainerCallback

from harness import dist
from harness.run.callbacks import training_ends_here
from harness.run.context import RunContext

log = logging.getLogger("harness")


def eval_logs(result: dict) -> dict:
    """An eval result as TRL-style `eval_*` logs (TensorBoard and W&B show them as eval/*)."""
    out = {f"eval_{k}": result[k] for k in ("accuracy", "abstention_rate", "format_valid", "direction_accuracy")
           if k in result}
    for rel, block in (result.get("per_relation") or {}).items():
        if "accuracy" in block:
            out[f"eval_accuracy_{rel}"] = block["accuracy"]
    return out


class PeriodicEvalCallback(TrainerCallback):
    """train.eval_steps=N: after every N-th optimizer step the final eval's greedy eval of the live weights (rank 0;
    the other ranks wait at the checkpoint's gather), bound to that step's checkpoint, which is saved and kept.

    The eval runs at step end, before the Trainer logs and saves: its eval_* values join the step's metrics row
    (MetricsCallback), so the checkpoint's metrics frontier includes them; its artifact, eval/<split>-checkpoint-N.json,
    is written at save time with the digest of the saved weights and the sampled tokens of all ranks, before the
    checkpoint is published (this callback precedes CheckpointCallback): a run killed in between repeats the steps
    and the eval. The RNG states are restored after it, so an eval changes no sample and no update. The run's last
    step is not evaluated here: the final eval scores the same weights."""

    def __init__(self, ctx: RunContext, every: int, evaluate, write, log, file_digest):
        # evaluate() -> (result, predictions); write(result, predictions); log(eval_* logs) to every sink;
        # file_digest(path): a checkpoint file's digest as publish records it (CheckpointCallback.file_digest)
        self.ctx, self.every, self.evaluate, self.write, self.log = ctx, every, evaluate, write, log
        self.file_digest = file_digest
        self.evaluated = None  # the step evaluated at its end (every rank: the decision is the same on all)
        self.pending = None  # (result, predictions) on rank 0, between step end and save

    def on_step_end(self, args, state, control, **kwargs):
        self.evaluated = self.pending = None
        step = state.global_step
        if step % self.every or training_ends_here(self.ctx, state, control):
            return control  # (the budget's decision is all-reduced: every rank agrees)
        self.evaluated = step
        control.should_save = True  # the eval's checkpoint (kept: CheckpointCallback)
        if state.is_world_process_zero:
            t0 = time.time()
            with preserved_rng():
                result, preds = self.evaluate(step)
            self.ctx.eval_s += time.time() - t0  # not training: s/step leaves it out
            self.pending = (result, preds)
            self.ctx.pending_eval = (step, eval_logs(result))
            log.info("eval at step %d: accuracy %.3f on %d %s views", step, result["accuracy"], result["n"],
                     result["split"])
        return control

    def on_save(self, args, state, control, **kwargs):
        from harness.accounting.weights import weights_digest_of_files

        step = state.global_step
        if self.evaluated != step:
            return control
        tokens = sum(dist.all_gather(self.ctx.tokens_used))  # every rank is here: the collective is safe
        if self.pending is None:  # the other ranks
            return control
        result, preds = self.pending
        self.pending = None
        result.update(step=step, checkpoint=f"checkpoint-{step}", completion_tokens=tokens,
                      policy_sha256=weights_digest_of_files(Path(args.output_dir) / f"checkpoint-{step}",
                                                            self.file_digest))
        self.write(result, preds)
        self.log(eval_logs(result))  # TensorBoard, W&B, and metrics.jsonl when no row was logged at this step
        self.ctx.pending_eval = None
        return control


class preserved_rng:
    """Every RNG the training reads (python, numpy, torch CPU and CUDA) as it was before the block."""

    def __enter__(self):
        import random

        import numpy as np
        import torch

        self.states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state(),
                       torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        return self

    def __exit__(self, *exc):
        import random

        import numpy as np
        import torch

        py, npy, cpu, cuda = self.states
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return False

"""The loggers of a run around training: its W&B and trackio runs opened before the trainer is built (rank 0;
the tracker-specific code is harness.trackers), the logger environment (arms.common.LOGGER_ENV) snapshotted
before and restored after, and the harness's logs and TensorBoard writers closed after training, also on
failure (the next job of a sweep in the same process must not inherit open loggers). Torch-free at import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from arms.common import LOGGER_ENV
from harness import dist

if TYPE_CHECKING:
    from harness.run.context import RunContext


def open_run_loggers(plan, run_dir: Path) -> dict:
    """Open the run's W&B / trackio runs (logger.wandb, logger.trackio; rank 0). Returns the logger environment
    as it was before (close_loggers restores it)."""
    env_before = {k: os.environ.get(k) for k in LOGGER_ENV}
    if plan.cfg.logger.wandb and dist.is_main():
        from harness.trackers import open_wandb

        open_wandb(plan, run_dir)  # with the run's identity; it stays open through the final eval (finalize)
    if plan.cfg.logger.trackio and dist.is_main():
        from harness.trackers import open_trackio

        open_trackio(plan)  # the same, into <output_root>/trackio
    return env_before


def close_loggers(trainer, ctx: RunContext, env_before: dict, *, failed: bool) -> None:
    """Close the harness's logs and TensorBoard writers, and restore the logger environment; a W&B run only on
    failure (else it stays open for the final eval: harness.trackers, finished when the run ends)."""
    for lg in (ctx.ledger, ctx.trace, ctx.metrics):
        if lg is not None:
            lg.close()
    for cb in trainer.callback_handler.callbacks:
        writer = getattr(cb, "tb_writer", None)
        if writer is not None:
            writer.close()
            cb.tb_writer = None
    if failed:
        from harness.trackers import finish

        finish(failed=True)
    for k, v in env_before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

"""What the benchmarks that race the harness against plain TRL share: the harness run of a plan (in this
process, as a one-process sweep runs its jobs) and the bare TRL GRPOTrainer a researcher would write instead
(same model, data, GRPOConfig, seed and checkpoint schedule; a plain reward function that scores the same way
and writes nothing; no harness callbacks, no image cache).

Both start from the same SFT warm start (the plan's parent, trained once into the output root). Run the
benchmarks on an otherwise idle machine: two trainings at once on 2 cores slow each other tenfold.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path


def quiet() -> None:
    """Library chatter and the harness's per-step console lines off (warnings stay)."""
    from harness.log import quiet_libraries

    quiet_libraries()
    logging.getLogger("harness").setLevel(logging.WARNING)


@dataclass
class Trial:
    kind: str
    wall_s: float  # the whole run: model load, trainer build, training, checkpoints, final save
    train_s: float  # Trainer.train alone
    steps: int
    tokens: list[int] = field(default_factory=list)  # sampled tokens per completion, in order


def harness_trial(plan, kind: str = "harness") -> Trial:
    """Run the plan through the harness (its parent complete), from a fresh run dir; the run dir is removed."""
    from harness.accounting.logs import read_rows
    from harness.run.lifecycle import run_with_prerequisites

    run_dir = Path(plan.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    assert run_with_prerequisites(plan) == 0
    wall = time.perf_counter() - t0
    comp = json.loads((run_dir / "completion.json").read_text())
    tokens = [r["tokens"] for r in read_rows(run_dir / "ledgers/rank-0.jsonl")] if plan.kind.samples else []
    shutil.rmtree(run_dir)
    return Trial(kind, wall, comp["train_runtime_s"], comp["optimizer_steps"], tokens)


def bare_reward(plan, eos_ids, tokens: list[int]):
    """The reward function a bare TRL script would pass: it scores like the harness's and writes nothing; the
    sampled length of every completion goes to `tokens` (the trials must sample the same work)."""
    from harness.rewards import completion_text, cut_at_eos, reward_config, score

    eos, cfg = set(eos_ids), reward_config(plan.config["reward"])

    def reward(prompts, completions, completion_ids, row, **_):
        scores = []
        for text, ids, rec in zip(completions, completion_ids, row):
            _, truncated = cut_at_eos(ids, eos)
            scores.append(score(completion_text(text), json.loads(rec), truncated=truncated, cfg=cfg).total)
            tokens.append(len(ids))
        return scores

    reward.__name__ = "harness"
    return reward


def bare_trial(plan, *, steps: int, trl_defaults: bool, scratch: Path, kind: str = "bare") -> Trial:
    """A bare TRL GRPOTrainer on the plan's model, data and GRPOConfig for `steps` steps from the plan's SFT
    warm start. trl_defaults: the GRPOConfig fields where the harness departs from TRL's defaults for speed
    (gradient_checkpointing) are left to TRL."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from arms.common import BuildContext
    from arms.grpo.trainer import grpo_config_kwargs
    from harness.data import load_split
    from harness.models import special_token_ids_to_suppress
    from harness.policy import eos_token_ids, load_policy
    from harness.data.trainsets import rl_dataset

    c = plan.config
    out = scratch / kind
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    model, processor = load_policy(Path(plan.parent.run_dir) / "final_policy")
    root = Path(json.loads((Path(plan.parent.run_dir) / "run_manifest.json").read_text())["identity"]["data"]["root"])
    dataset = rl_dataset(root, load_split(root, c["data"]["train_split"]), is_vlm=c["model"]["is_vlm"])
    tokens: list[int] = []
    reward = bare_reward(plan, eos_token_ids(processor), tokens)
    ctx = BuildContext(plan=plan, run_dir=out, model=model, processor=processor, train_dataset=dataset,
                       suppress_token_ids=special_token_ids_to_suppress(processor))
    kw = grpo_config_kwargs(ctx)
    kw.update(max_steps=steps, disable_tqdm=True)
    if trl_defaults:
        kw.pop("gradient_checkpointing")
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**kw), train_dataset=dataset,
                          processing_class=processor)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1
    trainer.save_model(str(out / "final"))
    processor.save_pretrained(str(out / "final"))
    wall = time.perf_counter() - t0
    shutil.rmtree(out)
    return Trial(kind, wall, train_s, trainer.state.global_step, tokens)


def spread(values: list[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def machine() -> str:
    import os
    import platform

    import torch

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
            f"{torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")

"""`python -m harness.export PATH [PATH ...] --to tensorboard|wandb|trackio`: a finished run's logged series and
final scalars sent to a logger after the fact.

A run's loggers are not part of its identity (logger.* is not semantic): running a completed run's command again
with `logger=tensorboard` finds it complete and trains nothing. Its record is all on disk, though: metrics.jsonl
(every logged step, TRL's names), the eval artifacts and completion.json. This command replays them into the
logger as a live run would have written them:

    train/* and eval/* per logged step   metrics.jsonl, named by transformers' rewrite_logs (as its own callbacks do)
    eval/*_before, eval/*_after, budget/*  completion.json, at the run's last step (harness.trackers.final_scalars)

tensorboard   <run_dir>/tensorboard (refused when it holds events already, e.g. from a live logger=tensorboard
              run, unless --force replaces them)
wandb         the run's W&B run (same id, name, group, tags and config as a live run: harness.trackers), offline
              unless --wandb-mode online; a run that logged to W&B live gets its steps again
trackio       <output_root>/trackio/<project>.db (or TRACKIO_DIR), the run's trackio run (same name, group, config)

PATH is a run dir, or a folder holding run dirs (an output_root, a sweep dir): every completed run in it. A run
that did not complete is refused (the same command that started it finishes it). Nothing of the run is changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from harness.errors import ConfigError, HarnessError, Problem

LOGGERS = ("tensorboard", "wandb", "trackio")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.export", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("paths", nargs="+", metavar="PATH", help="a run dir, or a folder of run dirs (output_root, sweep dir)")
    p.add_argument("--to", required=True, choices=LOGGERS, help="the logger to send the runs to")
    p.add_argument("--project", default=None, help="wandb / trackio project (default: the run's logger.*_project)")
    p.add_argument("--wandb-mode", default="offline", choices=("offline", "online"), help="default offline")
    p.add_argument("--force", action="store_true", help="tensorboard: replace the events a run dir already holds")
    return p


def run_dirs(paths: list[str]) -> list[Path]:
    """The completed run dirs named by `paths` (each a run dir or a folder of them), in order, without repeats."""
    from harness.report.runs import find_run_dirs, is_run_dir

    found, problems = [], []
    for text in paths:
        path = Path(text).expanduser()
        if not path.is_dir():
            problems.append(Problem("PATH", text, "is not a directory", "give a run dir or a folder of run dirs"))
            continue
        dirs = [path] if is_run_dir(path) else find_run_dirs(path)[0]
        if not dirs:
            problems.append(Problem("PATH", text, "holds no run dir (run_manifest.json)", "give a run dir or an output_root"))
        for d in dirs:
            status = json.loads((d / "run_manifest.json").read_text()).get("status")
            if status != "completed" or not (d / "completion.json").is_file():
                problems.append(Problem("PATH", str(d), f"the run is {status}, not completed",
                                        "finish it first (the command that started it continues it), then export"))
            elif d.resolve() not in [f.resolve() for f in found]:
                found.append(d)
    if problems:
        raise ConfigError(problems)
    return found


def records(run_dir: Path) -> tuple[object, list[tuple[int, dict]], dict]:
    """(the run's plan with its final identity, [(step, {name: value})] of metrics.jsonl renamed as transformers
    names them for its loggers, completion.json)."""
    from transformers.integrations.integration_utils import rewrite_logs

    from harness.accounting.logs import read_rows
    from harness.plan import Plan

    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    plan = Plan.from_json(manifest["plan"])
    plan = dataclasses.replace(plan, identity=manifest.get("identity") or plan.identity)
    rows = []
    metrics = run_dir / "metrics.jsonl"
    for row in read_rows(metrics) if metrics.is_file() else []:
        step = row.get("step")
        scalars = {k: v for k, v in row.items() if k not in ("step", "step_time") and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if isinstance(step, int) and scalars and "train_runtime" not in row:
            rows.append((step, rewrite_logs(scalars)))
    return plan, rows, json.loads((run_dir / "completion.json").read_text())


def to_tensorboard(run_dir: Path, rows, completion: dict, force: bool) -> str:
    from torch.utils.tensorboard import SummaryWriter

    from harness.trackers import final_scalars

    out = run_dir / "tensorboard"
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError([Problem("--to", "tensorboard", f"{out} holds TensorBoard events already (the run logged "
                                       "them live, or an earlier export)", "look at them with tensorboard --logdir, "
                                       "or pass --force to replace them")])
        shutil.rmtree(out)
    last = completion.get("optimizer_steps") or 0
    with SummaryWriter(log_dir=str(out)) as writer:
        for step, scalars in rows:
            for key, value in scalars.items():
                writer.add_scalar(key, value, global_step=step)
        for key, value in final_scalars(completion).items():
            writer.add_scalar(key, value, global_step=last)
    return f"{out} (tensorboard --logdir {out.parent.parent})"


def to_wandb(run_dir: Path, plan, rows, completion: dict, project: str | None, mode: str) -> str:
    import wandb

    from harness.trackers import condition_group, final_scalars, tags, wandb_id

    wandb.setup(settings=wandb.Settings(silent=True))
    run = wandb.init(project=project or plan.cfg.logger.wandb_project, mode=mode, dir=str(run_dir),
                     id=wandb_id(plan.run_name), resume="allow", name=plan.run_name, group=condition_group(plan),
                     tags=tags(plan), config={"harness": {"config": plan.config, "identity": plan.identity,
                                                           "budget": plan.budget}})
    try:
        for step, scalars in rows:
            wandb.log(scalars, step=step)
        final = final_scalars(completion)
        last = max([completion.get("optimizer_steps") or 0] + [s for s, _ in rows])
        wandb.log(final, step=last)
        run.summary.update({**final, "budget/stopped_by": completion.get("stopped_by")})
        where = run.settings.sync_dir
    finally:
        wandb.finish()
        wandb.teardown()
    return f"{where}" + (f" (upload: wandb sync {where})" if mode == "offline" else "")


def to_trackio(run_dir: Path, plan, rows, completion: dict, project: str | None) -> str:
    where = os.environ.get("TRACKIO_DIR") or str(run_dir.resolve().parent.parent / "trackio")
    os.environ.setdefault("TRACKIO_DIR", where)  # read once, when trackio is imported
    import trackio

    from harness.trackers import _quiet, condition_group, final_scalars, tags

    name = project or plan.cfg.logger.trackio_project
    _quiet(trackio.init, project=name, name=plan.run_name, group=condition_group(plan), resume="allow", embed=False,
           auto_log_cpu=False, auto_log_gpu=False,
           config={"harness": {"config": plan.config, "identity": plan.identity, "budget": plan.budget}, "tags": tags(plan)})
    try:
        for step, scalars in rows:
            trackio.log(scalars, step=step)
        trackio.log(final_scalars(completion), step=completion.get("optimizer_steps") or 0)
    finally:
        _quiet(trackio.finish)
    return f"{trackio.utils.TRACKIO_DIR}/{name}.db (TRACKIO_DIR={trackio.utils.TRACKIO_DIR} trackio show --project {name})"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        dirs = run_dirs(args.paths)
        from harness.log import quiet_libraries

        quiet_libraries()
        for d in dirs:
            plan, rows, completion = records(d)
            if args.to == "tensorboard":
                where = to_tensorboard(d, rows, completion, args.force)
            elif args.to == "wandb":
                where = to_wandb(d, plan, rows, completion, args.project, args.wandb_mode)
            else:
                where = to_trackio(d, plan, rows, completion, args.project)
            print(f"exported {d.name}: {len(rows)} logged steps and the final scalars -> {where}")
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    from harness.entry import run_command

    sys.exit(run_command(main))

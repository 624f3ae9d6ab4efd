"""The Hydra entry point: compose, plan, then either print the plan (mode=plan) or run the lifecycle.

    main(argv)                      a rank of a launch: run_plan(its plan file); flags, hydra.*, -m: Hydra's CLI
                                    (harness.config.argv's checks first, then _entry: run_job, or a sweep's
                                    run_sweep_job); else run_command_line(argv): composed once
      run_job(cfg)                  the strict check, the plan; mode=plan prints it, else run_plan
        run_plan(plan)              the directories probed; smoke | launch | lifecycle.run_with_prerequisites

Kept torch-free at import time: `--help`, `--cfg job` and `mode=plan` never import torch,
transformers or trl (checked by tests with `python -X importtime`).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.config.argv import needs_hydra_cli, precheck_hydra_cli
from harness.config.compose import CONF_DIR, compose
from harness.errors import HarnessError
from harness.halt import hand_over
from harness.log import log, setup_logging
from harness.plan import compose_plan  # noqa: F401  (the Plan of a command line; tests and bench import it here)


def run_job(cfg: DictConfig, choices: dict | None = None, overrides: list[str] | None = None,
            multirun: bool = False, checked: bool = False) -> int:
    """One job: plan, then print it or execute it. Returns the process exit code. `checked`: the config came from
    harness.config.compose.compose, whose strict check already passed for these overrides."""
    from harness.config.overrides import strict_check
    from harness.plan import build_plan, plan_json

    setup_logging()
    try:
        if not checked:  # a key the schema lacks, even with + or ++, is an error (exit 2)
            strict_check(cfg, overrides)
        if (choices or {}).get("sweep") and not multirun:
            from harness.errors import ConfigError, Problem

            raise ConfigError([Problem("sweep", choices["sweep"], "a named sweep defines several jobs; without -m "
                                       "only one would run", f"python -m harness -m sweep={choices['sweep']} ...")])
        plan = build_plan(cfg, choices, overrides)
        if multirun:
            from harness.sweep import remember_run_dir

            remember_run_dir(overrides or [], plan.run_dir)  # the job's record names it without planning again
        if plan.cfg.mode == "plan":
            from harness.rundir import check_writable_dirs

            check_writable_dirs(_dirs(plan), create=False)  # what the run refuses, the plan refuses (writing nothing)
            print(plan_json(plan))
            for w in plan.warnings:
                log.warning("warning: %s", w)
            return 0
        for w in plan.warnings:
            log.warning("warning: %s", w)
        return run_plan(plan)
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code


def run_plan(plan) -> int:
    """Execute a checked plan: the smoke self-test, the driver of a multi-process job, or the lifecycle.
    First the directories it writes are created and probed (an unwritable one is a ConfigError, not a traceback)."""
    from harness.rundir import check_writable_dirs

    from harness.errors import storage_error

    dirs = _dirs(plan)
    check_writable_dirs(dirs)
    try:
        if plan.cfg.run_mode == "smoke":
            from harness.smoke import smoke

            return smoke(plan)
        from harness.launch import launch, needs_launch

        if needs_launch(plan):
            return launch(plan)
        from harness.run.lifecycle import run_with_prerequisites

        return run_with_prerequisites(plan)
    except OSError as exc:  # a full disk, a read-only or unwritable directory mid-run: which field, why, the fix
        err = storage_error(exc, dirs)
        if err is None:
            raise
        raise err from exc


def _dirs(plan) -> dict[str, str]:
    """The directories a run writes: output_root (run dirs) and the caches (built data and tiny models)."""
    c = plan.cfg
    out = {"output_root": c.output_root}
    if c.data.cache_dir:
        out["data.cache_dir"] = c.data.cache_dir
    if c.model.cache_dir and c.model.source == "tiny":
        out["model.cache_dir"] = c.model.cache_dir
    return out


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _entry(cfg: DictConfig) -> float | None:
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    if hc.mode != RunMode.MULTIRUN:
        code = run_job(cfg, dict(hc.runtime.choices), overrides)
        hand_over()  # a scheduler's handler of the signal that stopped the run (submitit's requeue), if any
        if code:
            raise SystemExit(code)
        return
    from harness.sweep import run_sweep_job

    return run_sweep_job(cfg, hc, lambda c, choices, o: run_job(c, choices, o, multirun=True))


def run_command_line(argv: list[str]) -> int:
    """A single job composed once with Hydra's compose API (same overrides grammar and errors).

    `hydra.main` composes every config twice (once to read hydra.mode); a single run does not
    need that, and each rank of a multi-process launch pays the start-up cost again.
    """
    try:
        cfg, choices = compose(argv)
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    return run_job(cfg, choices, argv, checked=True)


def main() -> None:
    argv = sys.argv[1:]
    from harness.launch import plan_from_env

    plan = plan_from_env()  # a rank started by the driver form: run exactly the plan it wrote
    if plan is not None:
        from harness.launch import report_exit

        setup_logging()
        code = 1
        try:
            code = run_plan(plan)
        except HarnessError as exc:
            print(str(exc), file=sys.stderr)
            code = exc.exit_code
        finally:
            report_exit(code)  # the launcher's own exit code would hide the harness's (e.g. 5, 6)
        if code:
            raise SystemExit(code)
        return
    if needs_hydra_cli(argv):
        from harness.config.store import register

        # Hydra's CLI reads the ConfigStore (--help lists its schemas, its text built only when asked for);
        # a plain run registers only if it composes (a cached compose needs none of it: ~20-40 ms)
        register(with_help="--help" in argv)
        code = precheck_hydra_cli(argv)
        if code:
            raise SystemExit(code)
        setup_logging()  # a sweep's launcher and summary lines (its jobs may run elsewhere: joblib, SLURM)
        _entry()
        from harness.sweep import exit_code

        code = exit_code()  # a sweep: 1 when a job failed, else the first interrupted job's code (143: SIGTERM)
        if code:
            raise SystemExit(code)
        return
    code = run_command_line(argv)
    hand_over()  # a scheduler's handler of the signal that stopped the run (submitit's requeue), if any
    if code:
        raise SystemExit(code)

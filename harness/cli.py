"""The Hydra entry point: compose, plan, then either print the plan (mode=plan) or run the lifecycle.

Kept torch-free at import time: `--help`, `--cfg job` and `mode=plan` never import torch,
transformers or trl (checked by tests with `python -X importtime`).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.config.compose import CONF_DIR, compose
from harness.errors import HarnessError
from harness.halt import hand_over
from harness.log import log, setup_logging
from harness.plan import compose_plan  # noqa: F401  (the Plan of a command line; tests and bench import it here)


def run_config(cfg: DictConfig, choices: dict | None = None, overrides: list[str] | None = None,
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
        from harness.lifecycle import execute

        return execute(plan)
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
        code = run_config(cfg, dict(hc.runtime.choices), overrides)
        hand_over()  # a scheduler's handler of the signal that stopped the run (submitit's requeue), if any
        if code:
            raise SystemExit(code)
        return
    from harness.sweep import run_job

    return run_job(cfg, hc, lambda c, choices, o: run_config(c, choices, o, multirun=True))


def _needs_hydra_cli(argv: list[str]) -> bool:
    """Flags (--help, --cfg, -m, --info, ...) and hydra.* overrides need Hydra's own CLI machinery."""
    return any(a.startswith("-") or a.lstrip("+~").startswith("hydra") for a in argv)


def compose_and_run(argv: list[str]) -> int:
    """A single job composed once with Hydra's compose API (same overrides grammar and errors).

    `hydra.main` composes every config twice (once to read hydra.mode); a single run does not
    need that, and each rank of a multi-process launch pays the start-up cost again.
    """
    try:
        cfg, choices = compose(argv)
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    return run_config(cfg, choices, argv, checked=True)


def flag_problems(argv: list[str], known: set[str]) -> list:
    """`--output_root=/tmp/x` (a TRL or argparse habit): a Problem with its Hydra form `output_root=/tmp/x`, for each
    `--key[=value]` that is not one of Hydra's own flags (`known`)."""
    from harness.errors import Problem

    out = []
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if not a.startswith("--") or name in known or len(name) < 3:
            continue
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]:
            value = argv[i + 1]
        key = _schema_key(name[2:])
        out.append(Problem("command line", a, "the harness takes Hydra overrides key=value, not --key=value flags",
                           f"write {key}={value or '...'} (python -m harness --help lists every key)"))
    return out


def _schema_key(flag: str) -> str:
    """The schema key a flag's name means: itself, the one key it ends (learning_rate -> arm.learning_rate), or
    the closest; else the name as given."""
    from harness.config import schema
    from harness.config.overrides import suggest

    keys = [p for p, _ in schema.iter_fields(schema.Config)]
    keys += [f"{g}.{p}" for g, opts in schema.SCHEMAS.items() for c in opts.values() for p, _ in schema.iter_fields(c)]
    name = flag.replace("-", "_")
    if name in keys:
        return name
    ends = sorted({k for k in keys if k.endswith("." + name)})
    if ends:
        return ends[0]
    return suggest(name, keys) or name


def precheck_hydra_cli(argv: list[str]) -> int:
    """Before hydra.main composes (flags, hydra.* overrides, -m): the same strict check as a plain run.

    hydra.main would print Hydra's raw text and exit 1, or accept a `+`/`++` key the schema lacks. A single
    job is composed here once with the compose API (hydra.* overrides left to Hydra); a multirun is checked
    without composing: what no job of it could compose (each job refuses its own `+`/`++` keys, recorded as
    a failed job of the sweep). Returns 0 when hydra.main may go on, else the exit code (the error printed).
    """
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    flags = flag_problems(argv, set(parser._option_string_actions))
    if flags:
        from harness.errors import ConfigError

        print(ConfigError(flags), file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # a bad flag: Hydra's own usage message says it
        return 0
    if any(getattr(args, a, None) for a in ("hydra_help", "shell_completion", "experimental_rerun", "config_path",
                                             "config_name", "config_dir")):
        return 0  # nothing of this config is composed, or another config is
    from harness.errors import ConfigError
    from harness.config.overrides import check_static, is_hydra_key

    overrides = list(args.overrides or [])
    job = [o for o in overrides if not is_hydra_key(o.lstrip("+~"))]
    multirun = args.multirun or any(o.replace(" ", "").lower() == "hydra.mode=multirun" for o in overrides)
    try:
        if multirun:
            problems = check_static(job)
            if problems:
                raise ConfigError(problems)
        else:
            compose(job)
    except HarnessError as exc:
        setup_logging()
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    return 0


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
    if _needs_hydra_cli(argv):
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
    code = compose_and_run(argv)
    hand_over()  # a scheduler's handler of the signal that stopped the run (submitit's requeue), if any
    if code:
        raise SystemExit(code)

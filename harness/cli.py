"""The Hydra entry point: compose, plan, then either print the plan (mode=plan) or run the lifecycle.

Kept torch-free at import time: `--help`, `--cfg job` and `mode=plan` never import torch,
transformers or trl (checked by tests with `python -X importtime`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.config.compose import CONF_DIR, compose
from harness.errors import HarnessError
from harness.log import log, setup_logging


def run(cfg: DictConfig, choices: dict | None = None, overrides: list[str] | None = None,
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


_FAILED_JOBS: list[int] = []  # filled by SweepCallback in the launching process
_INTERRUPTED_JOBS: list[tuple[int, int | None]] = []  # (job, its exit code): the same


class SweepCallback(Callback):
    """Hydra callback (conf/config.yaml hydra.callbacks): at the end of a multirun, in the launching process
    whatever the launcher (basic, joblib, submitit), read <sweep dir>/jobs/*.json, write <sweep dir>/sweep.json
    (every job: overrides, status, run dir) and remember the failures for the exit code."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from harness.rundir import atomic_write_json, now

        sweep_dir = Path(config.hydra.sweep.dir)
        remove_empty_job_dirs(sweep_dir)
        jobs = []
        for p in sorted((sweep_dir / "jobs").glob("*.json"), key=lambda q: int(q.stem) if q.stem.isdigit() else -1):
            try:
                jobs.append(json.loads(p.read_text()))
            except (OSError, ValueError) as exc:
                jobs.append({"job": p.stem, "status": "unreadable", "error": str(exc)})
        paused = [j.get("job") for j in jobs if j.get("status") == "paused"]  # budget.stop_after_steps: on purpose
        # a signal (SIGTERM, Ctrl-C): a resumable checkpoint, not a failure; the same command finishes the job
        interrupted = [j for j in jobs if j.get("status") == "interrupted"]
        failed = [j.get("job") for j in jobs if j.get("status") not in ("completed", "paused", "interrupted")]
        _FAILED_JOBS.extend(failed)
        _INTERRUPTED_JOBS.extend((j.get("job"), j.get("exit_code")) for j in interrupted)
        completed = len(jobs) - len(failed) - len(paused) - len(interrupted)
        atomic_write_json(sweep_dir / "sweep.json", {
            "finished_at": now(), "launcher": str(config.hydra.launcher.get("_target_", "")),
            "jobs": len(jobs), "completed": completed, "paused": paused,
            "interrupted": [j.get("job") for j in interrupted], "failed": failed,
            "runs": [{k: j.get(k) for k in ("job", "status", "overrides", "run_dir", "exit_code")} for j in jobs]})
        log.info("sweep: %d job(s), %d completed, %s%s%d failed; %s", len(jobs), completed,
                 f"{len(paused)} paused, " if paused else "",
                 f"{len(interrupted)} interrupted, " if interrupted else "", len(failed), sweep_dir)


def remove_empty_job_dirs(sweep_dir: Path) -> None:
    """Hydra's launchers make <sweep dir>/<job number>/ for every job; the harness writes nothing there (run dirs
    come from the plan; each job's record is jobs/<n>.json): the empty ones go, so the sweep dir holds what it says."""
    for d in sweep_dir.iterdir() if sweep_dir.is_dir() else ():
        if d.is_dir() and d.name.isdigit():
            try:
                d.rmdir()  # only when empty: a launcher's own files (logs) stay
            except OSError:
                pass


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _entry(cfg: DictConfig) -> float | None:
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    if hc.mode != RunMode.MULTIRUN:
        code = run(cfg, dict(hc.runtime.choices), overrides)
        if code:
            raise SystemExit(code)
        return
    # A sweep job: a failure is recorded and the sweep goes on with the next job; a signal (harness.halt) ends
    # the sweep after this job's checkpoint (the same sweep command continues: complete runs are skipped).
    record = {"job": hc.job.num, "overrides": overrides, "status": "failed", "exit_code": None, "error": None}
    from harness.halt import interrupted

    code, value = 0, None
    try:
        code = run(cfg, dict(hc.runtime.choices), overrides, multirun=True)
        record.update(status="completed" if code == 0 else "interrupted" if interrupted(code) else "failed",
                      exit_code=code)
        if code == 0:
            value = record["objective"] = _objective(cfg, overrides)
    except Exception as exc:  # noqa: BLE001  (one failing job must not end the sweep)
        import traceback

        record.update(error={"type": type(exc).__name__, "message": str(exc)[:2000],
                             "traceback": traceback.format_exc()[-4000:]})
        log.error("sweep job %s failed: %s: %s", hc.job.num, type(exc).__name__, exc)
    finally:
        _record_sweep_job(hc, record)
    if interrupted(code):
        log.warning("sweep: job %s was interrupted by a signal; the sweep stops here (exit %d). The same sweep "
                    "command continues it.", hc.job.num, code)
        raise SystemExit(code)
    return value  # a sweeper that optimizes (hydra/sweeper=optuna) reads it; None fails its trial


def _objective(cfg: DictConfig, overrides: list[str]) -> float | None:
    """The finished job's `objective` (a harness.report metric, e.g. eval/accuracy), or None (a pause, no eval)."""
    from harness.report.runs import read_run

    try:
        value = read_run(Path(_run_dir_of(overrides))).metrics.get(cfg.objective)
    except Exception as exc:  # noqa: BLE001  (a job without a readable run has no value: the sweeper fails the trial)
        log.warning("objective %s: not read (%s)", cfg.objective, exc)
        return None
    if value is not None:
        log.info("objective %s = %.6g", cfg.objective, value)
    return value


def _record_sweep_job(hc, record: dict) -> None:
    """<sweep dir>/jobs/<num>.json: the job's overrides, status and run dir (the sweep folder lists its jobs)."""
    from pathlib import Path

    from harness.rundir import MANIFEST, atomic_write_json, read_json

    try:
        record["run_dir"] = _run_dir_of(record["overrides"])
    except Exception:  # noqa: BLE001  (a config that does not plan has no run dir)
        record["run_dir"] = None
    if record["status"] == "completed" and record["run_dir"]:  # exit 0 is also a pause (budget.stop_after_steps)
        try:
            if read_json(Path(record["run_dir"]) / MANIFEST).get("status") == "paused":
                record["status"] = "paused"
        except (OSError, ValueError):
            pass
    atomic_write_json(Path(hc.sweep.dir) / "jobs" / f"{record['job']}.json", record)


def _run_dir_of(overrides: list[str]) -> str:
    return compose_plan(overrides).run_dir


def compose_plan(argv: list[str]):
    """The Plan of a command line (its SFT parent included), composed once."""
    from harness.plan import build_plan

    cfg, choices = compose(argv)
    return build_plan(cfg, choices, argv)


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
    return run(cfg, choices, argv, checked=True)


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
        _entry()
        if _FAILED_JOBS:
            log.error("sweep finished with %d failed job(s): %s (see <sweep dir>/jobs/)", len(_FAILED_JOBS),
                      ", ".join(map(str, _FAILED_JOBS)))
            raise SystemExit(1)
        if _INTERRUPTED_JOBS:  # none failed: exit as the first interrupted job did (143 for SIGTERM)
            log.warning("sweep: %d job(s) interrupted by a signal: %s; each stopped at a checkpoint: run the same "
                        "command to finish them", len(_INTERRUPTED_JOBS), ", ".join(str(j) for j, _ in _INTERRUPTED_JOBS))
            raise SystemExit(_INTERRUPTED_JOBS[0][1] or 1)
        return
    code = compose_and_run(argv)
    if code:
        raise SystemExit(code)

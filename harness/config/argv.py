"""The command line before anything composes: flags and overrides that only Hydra's CLI takes, a TRL or argparse
habit (`--key=value`) named with its Hydra form, and the same strict check a plain run gets before hydra.main
composes (harness.cli). Torch-free."""

from __future__ import annotations

import sys

from harness.config.compose import compose
from harness.errors import HarnessError
from harness.log import setup_logging


def needs_hydra_cli(argv: list[str]) -> bool:
    """Flags (--help, --cfg, -m, --info, ...) and hydra.* overrides need Hydra's own CLI machinery."""
    return any(a.startswith("-") or a.lstrip("+~").startswith("hydra") for a in argv)


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

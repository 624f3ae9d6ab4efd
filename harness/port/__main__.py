"""`python -m harness.port SOURCE CONFIG.yaml [KEY=VALUE ...] [--harness KEY=VALUE ...] [--json] [--out FILE]`.

Exit 0 when every field is classified and the overrides compose and plan; 2 with every problem listed (field,
value, why, fix) otherwise. Never a traceback for bad input. Torch-free."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.port.pipeline import SOURCES, port, render_json
from harness.port.preset import render_table, write_preset

EPILOG = """\
examples:
  python -m harness.port easyr1 examples/configs/config_grpo_papo.yaml data.rollout_batch_size=384 \\
      worker.actor.global_batch_size=128 algorithm.kl_prcp_coef=0.02 --harness model=tiny_vlm --harness data=synthetic
  python -m harness.port verl recipe.yaml actor_rollout_ref.rollout.n=5 --json
  python -m harness.port easyr1 recipe.yaml --harness data.path=DIR --out conf/experiment/my_recipe.yaml
  python -m harness experiment=my_recipe              # then run the preset

Every leaf field of the source (its schema's defaults, the file, the overrides) is reported once as exact,
semantically_conformant, locally_lowered, informational_only, distributed_only, not_implemented or unsupported.
Exit 0: classified, and the harness overrides compose and plan; exit 2: a problem (an unknown field or
override key, an unsupported value, overrides that do not plan), each listed with its fix."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.port", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Port a verl (v0.9 ppo_trainer) or EasyR1 (PPOConfig, incl. the PAPO fork) recipe to harness "
                    "overrides, with a per-field report.")
    p.add_argument("source", metavar="SOURCE", help=f"the recipe's framework: {' | '.join(SOURCES)}")
    p.add_argument("config", metavar="CONFIG.yaml", help="the recipe's config file (over the source's defaults)")
    p.add_argument("overrides", metavar="KEY=VALUE", nargs="*",
                   help="overrides in the source's dotlist syntax, as its launch script passes them (applied first)")
    p.add_argument("--harness", metavar="KEY=VALUE", action="append", default=[],
                   help="a harness override added last (repeatable), e.g. model=tiny_vlm data=synthetic or "
                        "data.path=DIR; a group chosen here replaces what the recipe says of it")
    p.add_argument("--json", action="store_true", help="print {source, overrides, fields, runnable, problems} as JSON")
    p.add_argument("--all", action="store_true", help="the table lists every field (default: the fields the recipe "
                   "sets or that map to a harness key, plus a count of the others)")
    p.add_argument("--out", metavar="FILE", help="write a Hydra experiment preset (conf/experiment/<name>.yaml) with "
                   "the overrides and, as comments, the report; written only when the port is runnable")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_intermixed_args(argv)
    result = port(args.source, args.config, args.overrides, args.harness)
    command = "python -m harness.port " + shlex.join(argv)
    if args.json:
        print(render_json(result))
    else:
        print(render_table(result, every=args.all))
    if result.problems:
        n = len(result.problems)
        print(f"PortError: {n} problem{'s' if n != 1 else ''}; nothing written\n"
              + "\n".join(f"  - {p.render()}" for p in result.problems), file=sys.stderr)
        return 2
    if args.out:
        try:
            path = write_preset(result, args.out, command)
        except OSError as exc:
            print(f"PortError: --out {args.out}: {exc.strerror or exc}\n    fix: pass a writable file path",
                  file=sys.stderr)
            return 2
        print(f"wrote {path}; run it from conf/experiment/: python -m harness experiment={path.stem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from harness.entry import run_command

    raise SystemExit(run_command(main))

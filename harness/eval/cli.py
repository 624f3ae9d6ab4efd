"""`python -m harness.eval RUN_DIR [split=test] [policy=final|checkpoint-N] [max_items=N|all] [--force]`

Greedy evaluation of a finished run's final policy, or of any published checkpoint, on a split of the
run's own dataset. Writes a derived artifact, eval/<split>.json (final policy) or
eval/<split>-checkpoint-<N>.json, carrying the run's identity and the evaluated weights' digest, plus
its predictions JSONL; the run's provenance (manifest, completion.json, ledgers, traces, checkpoints)
is never touched. Every argument is checked before anything heavy is imported; the dataset on disk
must still be the one the run trained on (content digest; exit 4 otherwise, checked before an existing
artifact is reused, so a stored result is never printed for changed data). An existing artifact for the
same policy weights and settings is reported, not recomputed; one with other settings is replaced only
with --force.

Keys:
    split          a split of the run's dataset (default: the run's data.eval_split)
    policy         final (default) | checkpoint-<N> | <N>
    max_items      views to evaluate, the first N in row-key order (whole groups), or `all`
                   (default: the run's data.eval_max_items)
    batch_size     prompts per generation batch (default: the run's train.eval_batch_size)
    max_new_tokens greedy tokens per answer (default: the run's train.eval_max_new_tokens)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from harness.errors import ConfigError, HarnessError, Problem
from harness.eval import artifact_path
from harness.rundir import read_json

log = logging.getLogger("harness")
KEYS = ("split", "policy", "max_items", "batch_size", "max_new_tokens")


def _fail(field: str, value, why: str, fix: str) -> ConfigError:
    return ConfigError([Problem(field, value, why, fix)])


def parse_args(argv: list[str]) -> tuple[Path, dict, bool]:
    ap = argparse.ArgumentParser(prog="python -m harness.eval", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--force", action="store_true", help="replace an existing artifact made with other settings")
    ns = ap.parse_args(argv)
    opts: dict = {}
    for item in ns.overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in KEYS:
            raise _fail(key if sep else item, value if sep else None, f"is not an eval key (keys: {', '.join(KEYS)})",
                        "write key=value, e.g. split=val policy=checkpoint-4 max_items=all")
        opts[key] = value
    return ns.run_dir, opts, ns.force


def _int(opts: dict, key: str, default):
    if key not in opts:
        return default
    v = opts[key]
    if key == "max_items" and v in ("all", "null", "none"):
        return None
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise _fail(key, v, "must be a positive integer" + (" or `all`" if key == "max_items" else ""),
                    f"e.g. {key}=64")
    return n


def resolve(run_dir: Path, opts: dict) -> SimpleNamespace:
    """Check the run dir and the arguments; torch-free, nothing written."""
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, checkpoint_problems
    from harness.accounting.weights import POLICY_MANIFEST, weights_digest

    run_dir = run_dir.resolve()
    if not (run_dir / "run_manifest.json").is_file():
        raise _fail("RUN_DIR", str(run_dir), "is not a run directory (no run_manifest.json)",
                    "pass a directory under <output_root>/runs/")
    manifest = read_json(run_dir / "run_manifest.json")
    from harness.config.schema import Config
    from harness.config.typed import from_json
    from harness.data.records import RECORDS_DIR

    c = manifest["plan"]["config"]  # the config as the run recorded it (JSON)
    cfg = from_json(Config, c)  # typed; a field the run's harness did not have yet takes its default

    records = Path((manifest["identity"].get("data") or {}).get("root") or "/nonexistent") / RECORDS_DIR
    splits = (sorted(p.stem for p in records.glob("*.jsonl")) if records.is_dir()
              else sorted({cfg.data.train_split, cfg.data.eval_split, "val"}))
    split = opts.get("split", cfg.data.eval_split)
    if split not in splits:
        raise _fail("split", split, f"is not a split of this run's dataset ({', '.join(splits)})", "e.g. split=test")
    policy = opts.get("policy", "final")
    if policy == "final":
        comp = run_dir / "completion.json"
        if manifest.get("status") != "completed" or not comp.is_file():
            raise _fail("policy", policy, f"the run has not completed (status {manifest.get('status')!r})",
                        "finish the run first, or evaluate a published checkpoint: policy=checkpoint-<N>")
        path, label = run_dir / "final_policy", "final"
        if not (path / POLICY_MANIFEST).is_file():
            raise _fail("policy", policy, f"{path} has no {POLICY_MANIFEST}", "run harness.verify on the run dir")
    else:
        step = policy.removeprefix("checkpoint-")
        if not step.isdigit():
            raise _fail("policy", policy, "must be final, checkpoint-<N> or <N>", "e.g. policy=checkpoint-4")
        path = run_dir / "checkpoints" / f"checkpoint-{int(step)}"
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")
                      if (p / CHECKPOINT_MANIFEST).is_file()) if (run_dir / "checkpoints").is_dir() else []
        if not path.is_dir():
            raise _fail("policy", policy, f"no such checkpoint (published: {', '.join(have) or 'none'})",
                        "pick one of the published checkpoints, or policy=final")
        problems = checkpoint_problems(path)
        if problems:
            raise _fail("policy", policy, "the checkpoint is not intact: " + "; ".join(problems),
                        "pick another published checkpoint (harness.verify lists them)")
        label = f"checkpoint-{int(step)}"
    return SimpleNamespace(
        run_dir=run_dir, manifest=manifest, config=c, cfg=cfg, split=split, policy_path=path, label=label,
        out=artifact_path(run_dir, split, label), policy_sha256=weights_digest(path),
        max_items=_int(opts, "max_items", cfg.data.eval_max_items),
        batch_size=_int(opts, "batch_size", cfg.train.eval_batch_size),
        max_new_tokens=_int(opts, "max_new_tokens", cfg.train.eval_max_new_tokens))


def existing(job: SimpleNamespace, force: bool) -> dict | None:
    """The artifact already there for the same evaluation, or None to (re)compute. Refuses to replace one
    made with other settings unless forced."""
    if force or not job.out.is_file():
        return None
    old = read_json(job.out)
    same_policy = old.get("policy_sha256") == job.policy_sha256 and job.policy_sha256 is not None
    same_n = "max_items" in old and old["max_items"] == job.max_items  # None (the whole split) included
    same_dec = (old.get("decoding") or {}).get("max_new_tokens") == job.max_new_tokens
    if same_policy and same_n and same_dec:
        return old
    diffs = [k for k, ok in (("policy_sha256", same_policy), ("max_items", same_n), ("max_new_tokens", same_dec))
             if not ok]
    raise _fail("--force", False, f"{job.out} exists with other settings ({', '.join(diffs)} differ)",
                "add --force to replace it (it is a derived artifact; the run itself is not touched)")


def check_data(job: SimpleNamespace) -> Path:
    """The run's dataset root, validated and checked to be the one the run trained on; torch-free."""
    from harness.run.stages.data import prepare

    return prepare(job.cfg, job.manifest["identity"]["data"], run_dir=str(job.run_dir),
                   fix="restore the dataset to the data the run trained on, or train a new run on the changed "
                       "data (an eval of other data is not comparable with the run's own)").root


def evaluate(job: SimpleNamespace) -> dict:
    from harness.log import quiet_libraries

    quiet_libraries()
    from harness.data import load_split
    from harness.eval.greedy import eval_rows, run_eval
    from harness.identity import code_identity
    from harness.models import imagecache
    from harness.policy import device_for, eos_token_ids, fast_vision, load_policy, never_sampled
    from harness.rewards.functions import Rewards
    from harness.rewards.identity import check_sources

    c, ident = job.config, job.manifest["identity"]
    check_sources(c["reward"], ident.get("reward"), str(job.run_dir))  # the reward the run trained with, unedited
    rewards = Rewards(c["reward"], data_source=job.cfg.data.name)
    root = getattr(job, "data_root", None) or check_data(job)
    rows = eval_rows(load_split(root, job.split), job.max_items)
    m = job.cfg.model  # a field the run's harness did not have yet takes its default: the same tensors either way
    model, processor = load_policy(job.policy_path, base_path=ident["model"].get("base_path"), trainable=False,
                                   model_cfg=m)
    imagecache.install(processor, m.image_cache_mb)
    fast_vision(model, processor, m)  # the same, bit for bit, in a no-grad eval
    plan = SimpleNamespace(run_name=job.manifest["run_name"], identity=ident, config=c)
    model.to(device_for(job.cfg.placement.device))
    return run_eval(model, processor, root, rows, plan=plan, run_dir=job.run_dir, split=job.split, label=job.label,
                    policy=str(job.policy_path.relative_to(job.run_dir)), rewards=rewards,
                    is_vlm=job.cfg.model.is_vlm, max_new_tokens=job.max_new_tokens, batch_size=job.batch_size,
                    suppress_token_ids=never_sampled(model, processor),
                    eos_token_ids=eos_token_ids(processor, model),
                    extra={"policy_sha256": job.policy_sha256, "max_items": job.max_items,
                           "evaluated_by": {"command": "harness.eval", "code": code_identity()}})


def print_result(res: dict, out: Path, cached: bool) -> None:
    head = "already evaluated (same weights and settings)" if cached else f"evaluated in {res.get('wall_s', 0):.1f} s"
    print(f"{out}: {head}")
    print(f"  policy {res.get('policy')}  split {res.get('split')}  n={res.get('n')}  greedy")
    rows = [("overall", res)] + list((res.get("per_relation") or {}).items())
    print(f"  {'':<11} {'accuracy':>8} {'abstain':>8} {'format':>7} {'direction':>9}")
    for name, b in rows:
        dacc = b.get("direction_accuracy")
        print(f"  {name:<11} {b['accuracy']:>8.3f} {b['abstention_rate']:>8.3f} {b['format_valid']:>7.3f} "
              f"{'-' if dacc is None else f'{dacc:.3f}':>9}")


def main(argv: list[str] | None = None) -> int:
    from harness.log import setup_logging

    setup_logging()
    try:
        run_dir, opts, force = parse_args(sys.argv[1:] if argv is None else argv)
        job = resolve(run_dir, opts)
        job.data_root = check_data(job)  # before a stored result is reused: never report one for changed data
        old = existing(job, force)
        if old is not None:
            print_result(old, job.out, cached=True)
            return 0
        t0 = time.time()
        res = evaluate(job)
        res.setdefault("wall_s", time.time() - t0)
        print_result(res, job.out, cached=False)
        return 0
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code


"""`python -m harness.data {init,synth,validate,convert-hf,manifest,identity}`: dataset commands.

Every refusal prints its problems (file, line, field, why, fix) on stderr without a traceback
and exits with the error's code (2 for data and argument problems). validate is torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness.rewards.answers import ANSWER_TYPES
from harness.errors import HarnessError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.data", description="Datasets of the harness (docs/data.md).")
    sub = p.add_subparsers(dest="cmd", required=True)

    n = sub.add_parser("init", help="build a complete dataset from a table of questions plus images, or a datasets folder",
                       description="Build a validated dataset in DIR from SRC: a CSV or JSONL table of question/answer rows next to its "
                       "images (the table, or a folder holding exactly one), or a datasets save_to_disk folder (converted as convert-hf).")
    n.add_argument("root", metavar="DIR", help="the dataset folder to write (absent or empty unless --force)")
    n.add_argument("--from", dest="src", required=True, metavar="SRC", help="table.csv / table.jsonl, its folder, or a save_to_disk folder")
    n.add_argument("--image-column", metavar="C", default="image", help="image path relative to the table's folder; 'none' for text-only (default image)")
    n.add_argument("--question-column", metavar="C", default="question")
    n.add_argument("--answer-column", metavar="C", default="answer")
    n.add_argument("--answer-type", default="word", choices=ANSWER_TYPES)
    n.add_argument("--split-column", metavar="C", default=None, help="split of each row (default: a seeded split, see --test-fraction)")
    n.add_argument("--choices-column", metavar="C", default=None, help="options: a JSON list, or a|b|c in a CSV (keys A, B, ...)")
    n.add_argument("--id-column", metavar="C", default=None, help="base id of each row (default: the row position, row-000000, ...)")
    n.add_argument("--test-fraction", metavar="F", type=float, default=0.2, help="without --split-column: share of rows in test, at least 1 (default 0.2)")
    n.add_argument("--seed", metavar="S", type=int, default=0, help="seed of that split (default 0)")
    n.add_argument("--force", action="store_true", help="replace a non-empty DIR")

    s = sub.add_parser("synth", help="write the synthetic four-relation evidence set")
    s.add_argument("--out", required=True, help="output folder (must be absent or empty unless --force)")
    s.add_argument("--n-base", type=int, default=600, help="base items; each gives four views (default 600: >= 300 test views)")
    s.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    s.add_argument("--image-size", type=int, default=56, help="image side in pixels: 4 x patch size, 56 or 64 (default 56)")
    s.add_argument("--val-fraction", type=float, default=0.1)
    s.add_argument("--test-fraction", type=float, default=0.15)
    s.add_argument("--workers", type=int, default=0, help="rendering processes (0: in this process)")
    s.add_argument("--force", action="store_true", help="replace a non-empty --out")

    v = sub.add_parser("validate", help="check a dataset against the contract (torch-free, memoized)")
    v.add_argument("root")
    v.add_argument("--cache-dir", default=None, help="memo folder (default $XDG_CACHE_HOME/harness/validate)")
    v.add_argument("--no-cache", action="store_true", help="always run the full check")
    v.add_argument("--workers", type=int, default=0, help="threads for image digests and decodes")
    v.add_argument("--train-split", default="train", metavar="SPLIT", help="the split held-out images are compared with (a run's data.train_split; default train)")
    v.add_argument("--allow-split-overlap", action="store_true",
                   help="accept held-out views whose image is a byte copy of a training image (a run's data.allow_split_overlap=true); still reported as a warning")

    c = sub.add_parser("convert-hf", help="convert a datasets save_to_disk folder into this schema")
    c.add_argument("src")
    c.add_argument("--out", required=True)
    c.add_argument("--image-column", default="image", help="image column (a list of images is fine); 'none' for text-only")
    c.add_argument("--question-column", default="question")
    c.add_argument("--answer-column", default="answer")
    c.add_argument("--answer-type", default="word", choices=ANSWER_TYPES)
    c.add_argument("--split-column", default=None, help="default: the DatasetDict's split names, else all train")
    c.add_argument("--choices-column", default=None, help="list of option texts (keys A, B, ...) or of {key, text}")
    c.add_argument("--relation-column", default=None, help="FULL / CONTROL / MISSING / SUBSTITUTE per row (default: all FULL)")
    c.add_argument("--base-column", default=None, help="base item id (default: the row position)")
    c.add_argument("--group-column", default=None, help="question group id (default: the base id)")
    c.add_argument("--force", action="store_true", help="replace a non-empty --out")

    m = sub.add_parser("manifest", help="write manifest.json for a hand-made dataset, then validate it",
                       description="Write manifest.json for hand-written records/<split>.jsonl and images, then validate. Image "
                       "references without a sha256 get the file's; one that differs from its file is refused unless --fill-digests.")
    m.add_argument("root")
    m.add_argument("--fill-digests", action="store_true", help="set every row's image sha256 from the files, overwriting wrong ones")

    d = sub.add_parser("identity", help="print the data identity from manifest.json (JSON)")
    d.add_argument("root")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "init":
            _init(args)
        elif args.cmd == "synth":
            from harness.data.synth import write_synthetic
            from harness.data.validate import validate_dataset

            out = write_synthetic(args.out, n_base=args.n_base, data_seed=args.seed, image_size=args.image_size, val_fraction=args.val_fraction, test_fraction=args.test_fraction, workers=args.workers, force=args.force)
            _built(f"wrote {out}: ", validate_dataset(out))
        elif args.cmd == "validate":
            from harness.data.validate import validate_dataset

            report = validate_dataset(args.root, cache_dir=args.cache_dir, workers=args.workers, memoize=not args.no_cache,
                                      train_split=args.train_split, allow_split_overlap=args.allow_split_overlap)
            print(report.summary())
            for line in report.warnings():  # the accepted overlap's examples; stdout stays the one summary line
                print(f"warning: {line} (accepted: --allow-split-overlap)", file=sys.stderr)
        elif args.cmd == "convert-hf":
            from harness.data.convert import convert_hf
            from harness.data.validate import validate_dataset

            image_column = None if args.image_column.lower() == "none" else args.image_column
            out = convert_hf(args.src, args.out, image_column=image_column, question_column=args.question_column, answer_column=args.answer_column, answer_type=args.answer_type, split_column=args.split_column, choices_column=args.choices_column, relation_column=args.relation_column, base_column=args.base_column, group_column=args.group_column, force=args.force)
            _built(f"wrote {out}: ", validate_dataset(out))
        elif args.cmd == "manifest":
            from harness.data.manifest import seal_dataset
            from harness.data.validate import validate_dataset

            seal_dataset(args.root, fill_digests=args.fill_digests)
            _built("", validate_dataset(args.root))
        elif args.cmd == "identity":
            from harness.data.manifest import data_identity

            print(json.dumps(data_identity(args.root), indent=1, sort_keys=True))
    except HarnessError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    return 0


def _built(prefix: str, report) -> None:
    """A builder's summary line, then its warnings."""
    print(prefix + report.summary())
    _warn_built(report)


def _warn_built(report) -> None:
    """The split overlap a builder built anyway (harness/data/leakage.py), said now: a run will refuse it."""
    from harness.data.leakage import overlap_fix

    for line in report.warnings():
        print(f"warning: {line}\n  a run and `validate` refuse this dataset as it is; fix: {overlap_fix(report.overlap)}", file=sys.stderr)


def _init(args: argparse.Namespace) -> None:
    import shlex

    from harness.data.init import init_dataset
    from harness.data.validate import validate_dataset

    image_column = None if args.image_column.lower() == "none" else args.image_column
    res = init_dataset(args.root, args.src, image_column=image_column, question_column=args.question_column, answer_column=args.answer_column, answer_type=args.answer_type, split_column=args.split_column, choices_column=args.choices_column, id_column=args.id_column, test_fraction=args.test_fraction, seed=args.seed, force=args.force)
    report = validate_dataset(res.out)  # memoized: the next `validate` only stats files
    splits = ", ".join(f"{s} {n}" for s, n in sorted(res.splits.items(), key=lambda kv: (kv[0] != "train", kv[0])))
    print(f"wrote {res.out} from {res.src} ({res.source}): {report.rows} rows, {res.images} images")
    print(f"  splits: {splits} ({res.how_split})")
    print(f"  data sha256 {report.sha256[:12]}")
    for split, key in (("train", "data.train_split"), ("test", "data.eval_split")):
        if split not in res.splits:
            print(f"  note: no {split!r} split; name one of {sorted(res.splits)} with {key}=SPLIT when training")
    root = shlex.quote(str(res.out))
    print(f"next: python -m harness data=jsonl data.path={root}   (add mode=plan first to see the plan)")
    _warn_built(report)


if __name__ == "__main__":
    from harness.entry import run_command

    sys.exit(run_command(main))

"""The data stage: the dataset root (the synthetic cache, generated on first use, or data.path), validated
(memoized) and bound to the run's recorded content digest, before any model is built. Torch-free; also the
dataset check of `python -m harness.eval`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import DataChangedError

if TYPE_CHECKING:
    from harness.config.schema import Config

log = logging.getLogger("harness")


@dataclass(frozen=True)
class Data:
    root: Path
    content_sha256: str
    summary: str  # the validation report's one line
    train_rows: list = field(default_factory=list)  # filled by `load_rows`
    test_rows: list = field(default_factory=list)  # the held-out views evaluated (data.eval_max_items)


def dataset_root(config: Config, recorded: dict) -> Path:
    """Where the plan's dataset is: data.path, or the synthetic set of the plan's parameters (generated into
    its cache when missing; the recorded root of a run is reused while it holds the set)."""
    from harness.data import ensure_synthetic
    from harness.data.spec import synthetic_args

    d = config.data
    if recorded.get("kind") != "synthetic":
        return Path(d.path)
    root = Path(recorded.get("root") or "")
    if recorded.get("root") and (root / "manifest.json").is_file():
        return root
    return Path(ensure_synthetic(**synthetic_args(d, config.model.patch_size), cache_dir=d.cache_dir,
                                 workers=d.num_workers))


def prepare(config: Config, recorded: dict, *, run_dir: str, fix: str) -> Data:
    """The validated dataset of a plan (`config`: its typed config, plan.cfg); `recorded` is the run's
    identity.data. A content digest other than the recorded one raises DataChangedError (exit 4) with `fix`."""
    from harness.data import data_identity, validate_dataset

    root = dataset_root(config, recorded)
    # Held-out images are compared with the split the run trains on; only data=jsonl has the flag (the
    # synthetic set has no overlap by construction: an overlap there is a generator bug, refused).
    report = validate_dataset(root, cache_dir=Path(config.output_root) / "cache" / "validate",
                              workers=config.data.num_workers, train_split=config.data.train_split,
                              allow_split_overlap=getattr(config.data, "allow_split_overlap", False))
    for line in report.warnings():
        log.warning("data: %s (accepted: data.allow_split_overlap=true)", line)  # knowingly, and still said
    content = data_identity(root)["sha256"]
    expected = recorded.get("content_sha256")
    if expected and expected != content:
        raise DataChangedError(run_dir, str(root), expected, content, fix)
    return Data(root=root, content_sha256=content, summary=report.summary())


def load_rows(config: Config, data: Data) -> Data:
    """The record with the training split and the evaluated held-out views loaded."""
    from harness.data import load_split
    from harness.eval.greedy import eval_rows

    d = config.data
    return replace(data, train_rows=load_split(data.root, d.train_split),
                   test_rows=eval_rows(load_split(data.root, d.eval_split), d.eval_max_items))

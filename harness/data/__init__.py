"""Datasets of the harness: the schema of docs/data.md, the synthetic evidence set, validation.

Layout of a dataset root (every path in it is relative and POSIX):

    manifest.json              written last: schema_version, data identity `sha256`, digests and row
                               counts of the records files, sha256 of every image, a summary, and for
                               the synthetic set the generator spec and its `spec_sha256`
    records/<split>.jsonl      one JSON object per view; a row sits in the file of its split
    images/...                 image files (the synthetic set: images/<base_id>-<view_id>.png)

A row: base_id (the unit of splitting), group_id (views answering one question about one base
item), view_id (unique within the group), split, relation (FULL | CONTROL | MISSING | SUBSTITUTE),
question, optional choices [{key, text}], images [{path, sha256, optional index}], answer_type
(choice | word | number | text), target ("" = the abstention, required on MISSING and only there),
evidence [[x0, y0, x1, y1], ...] (pixels of the first image, x1/y1 exclusive; [] when unknown or
on MISSING), and optionally candidates (the group's answers in target space, for evi_po),
missing_images / control_images (on FULL rows: the group's MISSING and CONTROL images), meta.

Public API (nothing here imports torch; `datasets` is imported only by convert_hf):

    synthetic_spec / synthetic_spec_sha256 / synthetic_dir     identity and cache path, no generation
    ensure_synthetic(..., cache_dir) -> Path                   generate once into the cache, atomically
    write_synthetic(out, ...) -> Path                          `python -m harness.data synth`
    validate_dataset(root, *, cache_dir, workers) -> ValidationReport   (DataContractError)
    data_identity(root) -> dict                                reads manifest.json only
    load_split(root, split) -> list[dict]                      rows of one split, split-checked
    convert_hf(src, out, ...) -> Path                          `python -m harness.data convert-hf`
    seal_dataset(root, *, fill_digests) -> dict                `python -m harness.data manifest`

Attributes load lazily so `import harness.data` costs nothing (numpy and PIL come with the
function that needs them).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "synthetic_spec": "spec",
    "synthetic_spec_sha256": "spec",
    "synthetic_dir": "spec",
    "ensure_synthetic": "synth",
    "write_synthetic": "synth",
    "validate_dataset": "validate",
    "ValidationReport": "validate",
    "default_cache_dir": "validate",
    "data_identity": "manifest",
    "seal_dataset": "manifest",
    "load_split": "records",
    "row_key": "records",
    "RELATIONS": "records",
    "convert_hf": "convert",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"harness.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'harness.data' has no attribute {name!r}")

"""Split overlap by content: held-out views whose image is a byte copy of a training image.

The base_id rule (validate._cross_row) catches one base item in two splits, not the same picture
under two base_ids: a counting set whose test images were copies of training images passed it and
reported 0.375 -> 1.000 accuracy. So validation also compares image digests (sha256 of the file
bytes) across splits:

- held out: every row of a split other than the training split (data.train_split) that carries
  evidence, i.e. any relation but MISSING, with its `images` and `control_images`. MISSING views
  and the `missing_images` links to them are left out: their image is blank by design, so many
  of them share one blank file, in every split;
- training: every image any training row references (all IMAGE_LISTS, all relations): a held-out
  input the model was trained on, under whatever target, is leakage.

Copies inside one split are fine. The result is data (`OverlapCollector.find`: a JSON-able dict
or None, kept in the validation memo), and the verdict applies the caller's flag afterwards
(`overlap_problem`, `overlap_warning`), so a memoized success can never hide an overlap.

Who refuses: what uses a dataset, a run (data.allow_split_overlap) and `python -m harness.data
validate` (--allow-split-overlap), refuses an overlap unless told to accept it. What builds one
(init, convert-hf, manifest, synth) warns and builds: the split is the user's to fix or accept,
and a refused build would leave nothing behind to accept. Torch-free.
"""

from __future__ import annotations

from typing import Any

from harness.data.records import GROUP_SHOW, IMAGE_LISTS, path_problem
from harness.errors import DataProblem

#: what lets a run, and `python -m harness.data validate`, accept an overlap knowingly
FLAG_RUN, FLAG_CLI = "data.allow_split_overlap=true", "--allow-split-overlap"
HELD_LISTS = ("images", "control_images")  # not missing_images: MISSING images are blank by design
WARN_SHOW = 3  # examples named in the one-line warning of an accepted overlap


class OverlapCollector:
    """Fed every row (in reading order) by validate._cross_row; compared once the image digests are known."""

    def __init__(self, train_split: str) -> None:
        self.train_split = train_split
        self.train: list[tuple[str, str, int, str]] = []  # (path, file, line, field)
        self.held: list[tuple[str, str, int, list[tuple[str, str]]]] = []  # (split, file, line, [(field, path)])

    def add(self, row: dict, file: str, line: int) -> None:
        split = row.get("split")
        if not isinstance(split, str):
            return
        train = split == self.train_split
        if not train and row.get("relation") == "MISSING":
            return
        refs = []
        for key in IMAGE_LISTS if train else HELD_LISTS:
            items = row.get(key)
            for i, ref in enumerate(items if isinstance(items, list) else []):
                if isinstance(ref, dict) and path_problem(ref.get("path")) is None:
                    refs.append((f"{key}[{i}]", ref["path"]))
        if train:
            self.train += [(path, file, line, field) for field, path in refs]
        elif refs:
            self.held.append((split, file, line, refs))

    def find(self, digests: dict[str, str]) -> dict | None:
        """{rows, splits: {split: rows}, examples: [...]} over the held-out rows with an image whose digest
        (`digests`: path -> sha256 of the file) is a training image's; None when there is none."""
        first_train: dict[str, tuple[str, int, str]] = {}  # digest -> (file, line, path) of its first training use
        for path, file, line, _field in self.train:
            if path in digests:
                first_train.setdefault(digests[path], (file, line, path))
        if not first_train:
            return None
        hits, splits = [], {}
        for split, file, line, refs in self.held:
            for field, path in refs:
                twin = first_train.get(digests.get(path, ""))
                if twin is not None:  # one example per row: the count is of rows, not of images
                    hits.append({"file": file, "line": line, "field": field, "path": path,
                                 "train_file": twin[0], "train_line": twin[1], "train_path": twin[2]})
                    splits[split] = splits.get(split, 0) + 1
                    break
        if not hits:
            return None
        return {"rows": len(hits), "splits": dict(sorted(splits.items())), "train_split": self.train_split,
                "examples": hits[:GROUP_SHOW]}


def _example(e: dict) -> str:
    return f"{e['file']}:{e['line']} {e['field']} {e['path']} = {e['train_file']}:{e['train_line']} {e['train_path']}"


def _what(overlap: dict) -> str:
    per_split = ", ".join(f"{s} {n}" for s, n in overlap["splits"].items())
    n = overlap["rows"]
    return (f"{n} held-out row{'s' if n != 1 else ''} with evidence ({per_split}) "
            f"{'have' if n != 1 else 'has'} an image byte-equal to an image of split {overlap['train_split']!r}")


def _examples(overlap: dict, show: int) -> str:
    shown = overlap["examples"][:show]
    more = f" and {overlap['rows'] - len(shown)} more" if overlap["rows"] > len(shown) else ""
    return ", ".join(map(_example, shown)) + more


def overlap_fix(overlap: dict) -> str:
    return (f"remove the copies from the held-out split or from {overlap['train_split']!r} (or give a copy's rows one "
            f"split), then rebuild the manifest (`python -m harness.data manifest DIR`); or accept the overlap "
            f"knowingly: {FLAG_RUN} for a run, {FLAG_CLI} for `python -m harness.data validate`")


def overlap_problem(overlap: dict) -> DataProblem:
    """The refusal of an overlap not accepted: one problem with the count and the first GROUP_SHOW rows, at the
    first row's place (a converter maps that place to its source row)."""
    first: Any = overlap["examples"][0]
    return DataProblem(
        file=first["file"], line=first["line"], field=first["field"],
        why=f"{_what(overlap)} (split overlap: eval would score inputs the model trained on): {_examples(overlap, GROUP_SHOW)}",
        fix=overlap_fix(overlap))


def overlap_warning(overlap: dict, *, examples: bool = True) -> str:
    """The line an accepted overlap leaves in the validation result (in its one-line summary: without examples)."""
    return f"split overlap: {_what(overlap)}" + (f": {_examples(overlap, WARN_SHOW)}" if examples else "")

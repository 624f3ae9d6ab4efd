"""Record schema of a dataset (docs/data.md): field rules, path rules, loading by split.

A record is one *view* of one question about one base item, one JSON object per line of
`records/<split>.jsonl` (layout in harness/data/__init__.py). `check_row` returns every problem
of one row as DataProblem (file, line, field, why, fix); cross-row rules (unique views, split
leakage, linkage) live in harness/data/validate.py. Pure and torch-free.
"""

from __future__ import annotations

import json
from collections import defaultdict
import os
import posixpath
import re
import stat
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.rewards.answers import ANSWER_TYPES, normalize_target, target_problem
from harness.errors import DataContractError, DataProblem

# --- layout and vocabulary

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RECORDS_DIR = "records"
IMAGES_DIR = "images"
RELATIONS = ("FULL", "CONTROL", "MISSING", "SUBSTITUTE")
SPLIT_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")

REQUIRED = ("base_id", "group_id", "view_id", "split", "relation", "question", "images", "answer_type", "target", "evidence")
#: Optional fields. candidates: the answer candidates C_q of the row's group in target space
#: ("" = abstention), for evi_po's direction term; missing_images / control_images: on a FULL
#: row, the images of its group's MISSING and CONTROL views (evi_po's evidence term), so no
#: cross-row sampler is needed; meta: free-form (generator attributes, source ids).
OPTIONAL = ("choices", "candidates", "missing_images", "control_images", "meta")
KNOWN = REQUIRED + OPTIONAL
IMAGE_LISTS = ("images", "missing_images", "control_images")


def records_path(split: str) -> str:
    """Relative path of a split's records file."""
    return f"{RECORDS_DIR}/{split}.jsonl"


def row_key(row: dict) -> str:
    """A row's unique name, `<group_id>:<view_id>` (unique per dataset, checked by validate)."""
    return f"{row['group_id']}:{row['view_id']}"


# --- paths


def path_problem(path: Any) -> str | None:
    """Why `path` is not a safe dataset-relative POSIX path, or None.

    Symlinks are checked against the real root separately (validate), since that needs the disk.
    """
    if not isinstance(path, str) or not path:
        return "path must be a non-empty string"
    if "\\" in path:
        return "path contains a backslash; paths are POSIX, relative to the dataset root"
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return "absolute path; paths must be relative to the dataset root"
    parts = path.split("/")
    if ".." in parts:
        return "path contains '..'; it must stay inside the dataset root"
    if posixpath.normpath(path) != path or "." in parts:
        return f"path is not normalized (expected {posixpath.normpath(path)!r})"
    if "\x00" in path or "\n" in path:
        return "path contains a NUL or newline character"
    return None


def inside_root(real_root: str, full: str) -> bool:
    """True when `full` resolves (symlinks followed) to a path under the real root."""
    return RootGuard(real_root).inside(full)


class RootGuard:
    """Symlink-escape check for many files: realpath once per folder, one lstat per file."""

    def __init__(self, root: str | Path):
        self.real = os.path.realpath(root)
        self._prefix = self.real.rstrip("/") + "/"
        self._dirs: dict[str, str] = {}

    def inside(self, full: str) -> bool:
        folder, name = os.path.split(full)
        real_dir = self._dirs.get(folder)
        if real_dir is None:
            real_dir = self._dirs[folder] = os.path.realpath(folder)
        try:
            is_link = stat.S_ISLNK(os.lstat(full).st_mode)
        except OSError:
            is_link = False  # missing: reported by whoever reads it
        real = os.path.realpath(full) if is_link else os.path.join(real_dir, name)
        return real == self.real or real.startswith(self._prefix)


# --- one row


def _p(file: str, line: int | None, field: str | None, why: str, fix: str) -> DataProblem:
    return DataProblem(file=file, line=line, field=field, why=why, fix=fix)


def _check_image_list(row: dict, key: str, file: str, line: int) -> list[DataProblem]:
    out: list[DataProblem] = []
    refs = row.get(key)
    if not isinstance(refs, list):
        return [_p(file, line, key, f"{key} must be a list of {{path, sha256}}, got {type(refs).__name__}", f"write {key} as a JSON list")]
    has_index = [isinstance(r, dict) and "index" in r for r in refs]
    for i, ref in enumerate(refs):
        fld = f"{key}[{i}]"
        if not isinstance(ref, dict):
            out.append(_p(file, line, fld, f"expected an object {{path, sha256}}, got {type(ref).__name__}", "write each image as {\"path\": ..., \"sha256\": ...}"))
            continue
        unknown = sorted(set(ref) - {"path", "sha256", "index"})
        if unknown:
            out.append(_p(file, line, fld, f"unknown image fields {unknown}", "keep only path, sha256 and optional index"))
        why = path_problem(ref.get("path"))
        if why:
            out.append(_p(file, line, f"{fld}.path", f"{ref.get('path')!r}: {why}", "store the image under the dataset root and give its relative path, e.g. images/x.png"))
        sha = ref.get("sha256")
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            out.append(_p(file, line, f"{fld}.sha256", f"{sha!r} is not a lower-case hex sha256", "put the file's sha256 (sha256sum) here, or run `python -m harness.data manifest DIR --fill-digests`"))
        if any(has_index):
            # Contiguous image indices: index k sits at position k, so prompts and images pair up.
            if ref.get("index") != i:
                out.append(_p(file, line, f"{fld}.index", f"index {ref.get('index')!r} at position {i}; indices must be 0..{len(refs) - 1} in order", "renumber the images contiguously from 0, or drop index everywhere"))
    return out


def _check_choices(row: dict, file: str, line: int) -> list[DataProblem]:
    choices = row.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list) or not choices:
        return [_p(file, line, "choices", "choices must be a non-empty list of {key, text} (or absent)", "drop choices for open answers, or list the options")]
    out, seen = [], set()
    for i, c in enumerate(choices):
        if not isinstance(c, dict) or not isinstance(c.get("key"), str) or not isinstance(c.get("text"), str):
            out.append(_p(file, line, f"choices[{i}]", f"expected {{\"key\": str, \"text\": str}}, got {c!r}", "write each option as {\"key\": \"A\", \"text\": \"...\"}"))
            continue
        if not re.fullmatch(r"[A-Za-z0-9]{1,3}", c["key"]):
            out.append(_p(file, line, f"choices[{i}].key", f"{c['key']!r} is not 1-3 letters or digits", "use keys such as A, B, C or 1, 2, 3"))
        if c["key"].casefold() in seen:
            out.append(_p(file, line, f"choices[{i}].key", f"duplicate key {c['key']!r} (keys compare case-insensitively)", "give every option its own key"))
        seen.add(c["key"].casefold())
    return out


def check_row(row: Any, *, file: str, line: int, split: str) -> list[DataProblem]:
    """Every problem of one decoded JSON line of `records/<split>.jsonl`."""
    if not isinstance(row, dict):
        return [_p(file, line, None, f"a record must be a JSON object, got {type(row).__name__}", "write one JSON object per line")]
    out: list[DataProblem] = []
    for key in REQUIRED:
        if key not in row:
            out.append(_p(file, line, key, "required field is missing", f"add {key} (fields: {', '.join(REQUIRED)})"))
    for key in sorted(set(row) - set(KNOWN)):
        out.append(_p(file, line, key, "unknown field (a typo would otherwise be ignored silently)", f"rename it to one of {', '.join(KNOWN)}, or move it under meta"))
    for key in ("base_id", "group_id", "view_id", "question"):
        if key in row and (not isinstance(row[key], str) or not row[key].strip()):
            out.append(_p(file, line, key, f"must be a non-empty string, got {row[key]!r}", f"give every record a {key}"))
    if "split" in row and row["split"] != split:
        out.append(_p(file, line, "split", f"row says split={row['split']!r} but sits in the file of split {split!r}", f"move the row to {records_path(str(row['split']))} or fix its split"))
    relation = row.get("relation")
    if "relation" in row and relation not in RELATIONS:
        out.append(_p(file, line, "relation", f"unknown relation {relation!r}", f"use one of {', '.join(RELATIONS)}"))
    atype = row.get("answer_type")
    if "answer_type" in row and atype not in ANSWER_TYPES:
        out.append(_p(file, line, "answer_type", f"unknown answer_type {atype!r}", f"use one of {', '.join(ANSWER_TYPES)}"))
    out += _check_choices(row, file, line)
    if atype == "choice" and not row.get("choices"):
        out.append(_p(file, line, "choices", "answer_type choice needs choices", "list the options as [{\"key\": \"A\", \"text\": ...}, ...]"))
    for key in IMAGE_LISTS:
        if key in row:
            out += _check_image_list(row, key, file, line)
    for key in ("missing_images", "control_images"):
        if key in row and relation != "FULL":
            out.append(_p(file, line, key, f"{key} belongs on the FULL view, this row is {relation}", f"drop {key} from non-FULL rows"))
    out += _check_target(row, file, line)
    out += _check_evidence(row, file, line)
    if "meta" in row and not isinstance(row["meta"], dict):
        out.append(_p(file, line, "meta", "meta must be an object", "wrap free-form fields in a JSON object"))
    return out


@lru_cache(maxsize=4096)
def _target_verdict(target: str, atype: str, choices: tuple | None) -> tuple[str | None, str]:
    """(target_problem, normalized target), cached: a dataset repeats few distinct targets."""
    ch = [{"key": k, "text": t} for k, t in choices] if choices is not None else None
    why = target_problem(target, atype, ch)
    return why, (normalize_target(target, atype, ch) if why is None else target)


def _check_target(row: dict, file: str, line: int) -> list[DataProblem]:
    if "target" not in row or row.get("answer_type") not in ANSWER_TYPES:
        return []
    target, atype, choices, relation = row["target"], row["answer_type"], row.get("choices"), row.get("relation")
    ok = isinstance(choices, list) and all(isinstance(c, dict) and isinstance(c.get("key"), str) and isinstance(c.get("text"), str) for c in choices)
    key = tuple((c["key"], c["text"]) for c in choices) if ok else None

    def verdict(t: Any) -> tuple[str | None, Any]:
        return _target_verdict(t, atype, key) if isinstance(t, str) else (target_problem(t, atype, None), t)

    why = verdict(target)[0]
    if why:
        return [_p(file, line, "target", f"{target!r}: {why}", "fix the target so <answer>TARGET</answer> parses and normalizes under its answer_type")]
    out = []
    if relation == "MISSING" and target != "":
        out.append(_p(file, line, "target", f"{target!r} on a MISSING view; the evidence is absent so the answer is the abstention", "store the empty target \"\" on MISSING views"))
    if relation in ("FULL", "CONTROL", "SUBSTITUTE") and target == "":
        out.append(_p(file, line, "target", f"empty target (abstention) on a {relation} view; abstaining is correct only on MISSING", "give the answer the image shows, or mark the view MISSING"))
    cands = row.get("candidates")
    if cands is not None:
        if not isinstance(cands, list) or not all(isinstance(c, str) for c in cands):
            return out + [_p(file, line, "candidates", "candidates must be a list of strings (target space, \"\" = abstention)", "list the group's answers, e.g. [\"red\", \"\", \"blue\"]")]
        verdicts = [verdict(c) for c in cands]
        bad = [c for c, (why_c, _) in zip(cands, verdicts) if why_c]
        norm = [n for _, n in verdicts]
        if bad:
            out.append(_p(file, line, "candidates", f"candidates {bad!r} are not representable as {atype} answers", "fix or drop those candidates"))
        elif len(set(norm)) != len(norm):
            out.append(_p(file, line, "candidates", f"candidates {cands!r} repeat after normalization", "list every candidate answer once"))
        elif verdict(target)[1] not in norm:
            out.append(_p(file, line, "candidates", f"the target {target!r} is not among the candidates {cands!r}", "add the row's target to its group's candidates"))
        if "" not in cands:
            out.append(_p(file, line, "candidates", "the abstention \"\" is not a candidate", "add \"\" (the abstention) to the candidates"))
    return out


def _check_evidence(row: dict, file: str, line: int) -> list[DataProblem]:
    ev = row.get("evidence")
    if "evidence" not in row:
        return []
    if not isinstance(ev, list):
        return [_p(file, line, "evidence", f"evidence must be a list of [x0, y0, x1, y1] boxes, got {type(ev).__name__}", "write [] when no box is known")]
    out = []
    for i, box in enumerate(ev):
        ok = isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)
        if not ok or not (0 <= box[0] < box[2] and 0 <= box[1] < box[3]):
            out.append(_p(file, line, f"evidence[{i}]", f"{box!r} is not a box [x0, y0, x1, y1] with 0 <= x0 < x1 and 0 <= y0 < y1", "give pixel boxes on the first image, x1/y1 exclusive"))
    if row.get("relation") == "MISSING" and ev:
        out.append(_p(file, line, "evidence", "a MISSING view has evidence boxes, but its evidence was removed", "write evidence [] on MISSING views"))
    return out


# --- loading


def read_jsonl_bytes(data: bytes, file: str) -> tuple[list[tuple[int, Any]], list[DataProblem]]:
    """Decode a JSONL file's bytes: (line number, object) pairs and the lines that failed (UTF-8 or JSON)."""
    rows: list[tuple[int, Any]] = []
    problems: list[DataProblem] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline
    for n, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(_p(file, n, None, f"not UTF-8: byte {raw[e.start]:#04x} at column {e.start + 1}", "re-encode the file as UTF-8"))
            continue
        if not text.strip():
            problems.append(_p(file, n, None, "blank line", "remove blank lines; JSONL is one object per line"))
            continue
        try:
            rows.append((n, json.loads(text)))
        except json.JSONDecodeError as e:
            problems.append(_p(file, n, None, f"malformed JSON: {e.msg} at column {e.colno}", "write one complete JSON object per line"))
    return rows, problems


def load_split(root: str | Path, split: str) -> list[dict]:
    """The rows of one split, in file order; every row is checked to carry split == `split`.

    Call validate_dataset(root) first (training does, before building any model); this
    re-checks only what the trainer relies on: the file parses and no row of another split
    slips in (docs/data.md: every training row has split=train).
    """
    rel = records_path(split)
    path = Path(root) / rel
    if not SPLIT_RE.fullmatch(split) or not path.is_file():
        have = sorted(p.stem for p in (Path(root) / RECORDS_DIR).glob("*.jsonl"))
        raise DataContractError(str(root), [_p(rel, None, "split", f"no split {split!r} in this dataset (splits: {have})", "pick one of the listed splits (data.train_split / data.eval_split)")])
    pairs, problems = read_jsonl_bytes(path.read_bytes(), rel)
    for n, row in pairs:
        if not isinstance(row, dict) or row.get("split") != split:
            got = row.get("split") if isinstance(row, dict) else row
            problems.append(_p(rel, n, "split", f"row has split {got!r} in the file of split {split!r}", "run `python -m harness.data validate` and fix the row"))
    if problems:
        raise DataContractError(str(root), problems)
    return [row for _, row in pairs]


# --- one cause once

GROUP_MIN = 3  # identical problems in this many places or more are reported as one
GROUP_SHOW = 5  # places named in a grouped problem


def group_problems(problems: list[DataProblem]) -> list[DataProblem]:
    """Fold identical problems (same field, why and fix) found in GROUP_MIN or more places into one.

    The folded problem keeps the first place's file, has no line, and its why names the count
    and the first GROUP_SHOW places (file:line), so 40 rows missing one field read as one line.
    Order is kept: a folded problem sits where its first occurrence was.
    """
    by_key: dict[tuple, list[DataProblem]] = defaultdict(list)
    for p in problems:
        by_key[(p.field, p.why, p.fix)].append(p)
    out: list[DataProblem] = []
    for p in problems:
        same = by_key[(p.field, p.why, p.fix)]
        if len(same) < GROUP_MIN:
            out.append(p)
        elif same[0] is p:
            places = [q.file + (f":{q.line}" if q.line is not None else "") for q in same]
            what = "rows" if all(q.line is not None for q in same) else "files" if all(q.line is None for q in same) else "places"
            more = f" and {len(places) - GROUP_SHOW} more" if len(places) > GROUP_SHOW else ""
            out.append(DataProblem(p.file, None, p.field, f"{p.why} (in {len(same)} {what}: {', '.join(places[:GROUP_SHOW])}{more})", p.fix))
    return out

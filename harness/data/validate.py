"""Dataset contract check (docs/data.md), torch-free, memoized by a fingerprint.

`validate_dataset(root)` collects EVERY problem (DataProblem: file, line, field, why, fix) and
raises one DataContractError, or returns a ValidationReport. Checked:

- manifest.json: parses, schema version, its sha256 matches its content, its summary matches
  the rows; every records file listed, none unlisted, digests and row counts match.
- records/<split>.jsonl: UTF-8, one JSON object per line, the field rules of
  harness/data/records.py (relations, answer types, targets representable by the answer
  schema, safe relative paths, contiguous image indices, evidence boxes), rows in the file of
  their split; across rows: unique (group_id, view_id), no base_id in two splits, one base and
  at most one FULL per group, FULL links equal to the group's MISSING / CONTROL images.
- images: every referenced image is listed in the manifest with the same sha256; every listed
  image stays inside the root (symlinks resolved), exists, matches its digest and decodes
  (PIL); evidence boxes lie inside their image. With workers > 1, digests and decodes run in
  that many processes (threads would not help: opening a PNG is mostly Python).
- split overlap by content (harness/data/leakage.py): no held-out view with evidence whose image
  is byte-equal to a training image, unless the caller accepts it (allow_split_overlap: then
  the report carries it, ValidationReport.warnings()). A run and `validate` refuse it unless
  the user's flag says otherwise; builders (init, convert-hf, manifest, synth) warn.

One cause is reported once. Without a readable manifest.json, that is one problem with its fix
(`python -m harness.data manifest DIR`); what follows from it (image digests that cannot be
compared, rows whose image sha256 the manifest command fills in) is not reported, while genuine
record problems still are (bad fields, bad JSON, missing or undecodable images, a row's
sha256 that differs from its file). Identical problems (same field, why and fix) in
GROUP_MIN or more places become one problem naming the count and the first GROUP_SHOW places
(`group_problems`).

Memoization: the fingerprint is the sha256 of the validator version, the training split (the
overlap is measured against it), the real root, the manifest bytes, and (path, size, mtime_ns,
ctime_ns, inode) of every listed file plus the names under records/. A success is stored as
<cache_dir>/<fingerprint>.json; a second run on an unchanged dataset only stats files. Any
rewrite changes ctime, so it changes the fingerprint, except within one clock tick of the
validation that read the file: files whose ctime falls in the last RACY_WINDOW_NS before the run
are re-hashed on every hit (the "racy git" rule), so a tamper right after a memoized success is
still caught. A success with a split overlap is memoized too, the overlap kept as data: the flag
is applied after, on a hit as on a full check, so a memo written with the flag never hides the
overlap from a run without it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from harness.data.leakage import OverlapCollector, overlap_problem, overlap_warning
from harness.data.manifest import atomic_write_bytes, manifest_digest, read_manifest, sha256_bytes, sha256_file, summarize
from harness.data.records import (  # noqa: F401  (group_problems: re-exported)
    GROUP_MIN,
    GROUP_SHOW,
    group_problems,
    IMAGE_LISTS,
    MANIFEST,
    RECORDS_DIR,
    SPLIT_RE,
    RootGuard,
    check_row,
    inside_root,
    path_problem,
    read_jsonl_bytes,
    records_path,
)
from harness.errors import DataContractError, DataProblem

VALIDATOR_VERSION = 2  # 2: split overlap by content (a memo of 1 never checked it)
RACY_WINDOW_NS = 50_000_000  # > the coarsest kernel clock tick (10 ms at HZ=100), with margin
POOL_MIN_IMAGES = 256  # below this, starting worker processes costs more than it saves
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_REF_SHA_FIELD = re.compile(r"(%s)\[(\d+)\]\.sha256" % "|".join(IMAGE_LISTS))


@dataclass(frozen=True)
class ValidationReport:
    root: str
    sha256: str  # the data identity (manifest sha256)
    rows: int
    images: int
    splits: dict[str, dict[str, int]]  # split -> relation -> rows
    fingerprint: str
    memoized: bool
    seconds: float
    overlap: dict | None = None  # the split overlap the caller accepted (OverlapCollector.find's dict), else None

    def warnings(self) -> list[str]:
        """What the dataset passed only because the caller accepted it, one line each, with examples."""
        return [overlap_warning(self.overlap)] if self.overlap else []

    def summary(self) -> str:
        per_split = ", ".join(f"{s} {sum(r.values())}" for s, r in sorted(self.splits.items()))
        rel = Counter()
        for r in self.splits.values():
            rel.update(r)
        per_rel = ", ".join(f"{k} {rel[k]}" for k in ("FULL", "CONTROL", "MISSING", "SUBSTITUTE") if rel[k])
        memo = " (memoized)" if self.memoized else ""
        warn = f"; WARNING: {overlap_warning(self.overlap, examples=False)} (accepted)" if self.overlap else ""
        return f"ok: {self.rows} rows ({per_split}; {per_rel}), {self.images} images, data sha256 {self.sha256[:12]}, {self.seconds:.2f}s{memo}{warn}"


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/harness/validate (else ~/.cache/...): never inside a possibly read-only dataset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "harness" / "validate"


# --- fingerprint


def _listed_files(manifest: dict) -> list[str]:
    return sorted(p for p in list(manifest.get("records", {})) + list(manifest.get("images", {})) if isinstance(p, str))


def _fingerprint(root: Path, raw: bytes, manifest: dict, train_split: str) -> tuple[str, dict[str, int]]:
    """(fingerprint, {path: ctime_ns}) over the stat of every listed file; no file is read.

    Plain strings and os.stat, no pathlib: this loop is the whole cost of a memoized run.
    """
    base = str(root) + "/"
    h = hashlib.sha256(f"v{VALIDATOR_VERSION}\0{train_split}\0{os.path.realpath(root)}\0{sha256_bytes(raw)}\n".encode())
    ctimes: dict[str, int] = {}
    parts = []
    for rel in _listed_files(manifest):
        try:
            st = os.stat(base + rel)  # harmless even for a bad path; the full check reports those
        except (OSError, ValueError):
            parts.append(f"{rel}\0missing\n")
            continue
        ctimes[rel] = st.st_ctime_ns
        parts.append(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n")
    h.update("".join(parts).encode())
    try:  # an added records file must invalidate the memo (load_split would read it)
        h.update("\0".join(sorted(os.listdir(root / RECORDS_DIR))).encode())
    except OSError:
        h.update(b"no-records-dir")
    return h.hexdigest(), ctimes


def _expected_sha(manifest: dict, rel: str) -> str | None:
    if rel in manifest["images"]:
        return manifest["images"][rel]
    entry = manifest["records"].get(rel)
    return entry.get("sha256") if isinstance(entry, dict) else None


def _memo_hit(cache_dir: Path, fp: str, root: Path, manifest: dict) -> dict | None:
    try:
        memo = json.loads((cache_dir / f"{fp}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(memo, dict) or "overlap" not in memo:  # a memo that cannot say whether splits overlap
        return None
    for rel in memo.get("racy", []):  # written too close to the last run for ctime to tell
        try:
            if sha256_file(root / rel) != _expected_sha(manifest, rel):
                return None
        except OSError:
            return None
    return memo


# --- one cause once


def _blank_sha(row: dict, field: str | None) -> bool:
    """True when `field` is a row's `<list>[i].sha256` left out, null or "" (the manifest command fills it)."""
    m = _REF_SHA_FIELD.fullmatch(field or "")
    if m is None:
        return False
    refs = row.get(m.group(1))
    i = int(m.group(2))
    if not isinstance(refs, list) or i >= len(refs) or not isinstance(refs[i], dict):
        return False
    return refs[i].get("sha256") in (None, "")


# --- the full check


def _p(file: str, line: int | None, field: str | None, why: str, fix: str) -> DataProblem:
    return DataProblem(file=file, line=line, field=field, why=why, fix=fix)


class _State:
    """What the full check accumulates across files and rows."""

    def __init__(self, train_split: str) -> None:
        self.problems: list[DataProblem] = []
        self.overlap = OverlapCollector(train_split)
        self.views: dict[tuple[str, str], str] = {}
        self.base_split: dict[str, tuple[str, str]] = {}
        self.group_base: dict[str, str] = {}
        self.group_rows: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        self.refs: dict[str, list[tuple[str, str, int, str]]] = defaultdict(list)  # path -> (sha, file, line, field)
        self.boxes: list[tuple[str, int, str, list]] = []  # (file, line, image path, evidence)
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.reported_groups: set[str] = set()


def _check_manifest(m: dict, st: _State, root: Path) -> list[str]:
    """Manifest-level checks; returns the records files to read."""
    if manifest_digest(m) != m["sha256"]:
        st.problems.append(_p(MANIFEST, None, "sha256", "does not match the manifest's records and images (edited by hand?)", "rebuild it with `python -m harness.data manifest DIR`"))
    files = []
    for rel, entry in m["records"].items():
        why = path_problem(rel)
        split = rel[len(RECORDS_DIR) + 1 : -len(".jsonl")] if rel.startswith(RECORDS_DIR + "/") and rel.endswith(".jsonl") else ""
        if why or rel != records_path(split) or not SPLIT_RE.fullmatch(split):
            st.problems.append(_p(MANIFEST, None, f"records[{rel!r}]", why or "records files must be records/<split>.jsonl with a lower-case split name", "rename the file to records/<split>.jsonl"))
            continue
        if not isinstance(entry, dict) or not {"sha256", "rows"} <= set(entry):
            st.problems.append(_p(MANIFEST, None, f"records[{rel!r}]", "expected {sha256, rows, bytes}", "rebuild it with `python -m harness.data manifest DIR`"))
        files.append(rel)
    on_disk = {f"{RECORDS_DIR}/{p.name}" for p in (root / RECORDS_DIR).glob("*.jsonl")}
    for rel in sorted(on_disk - set(files)):
        st.problems.append(_p(rel, None, None, "records file not listed in manifest.json (it would be loaded unchecked)", "delete it, or rebuild the manifest with `python -m harness.data manifest DIR`"))
    for rel in m["images"]:
        why = path_problem(rel)
        if why:
            st.problems.append(_p(MANIFEST, None, f"images[{rel!r}]", why, "keep images under the dataset root and list them by relative path"))
    return sorted(files)


def _check_records_file(rel: str, m: dict | None, st: _State, real_root: str, root: Path) -> None:
    full = root / rel
    if not inside_root(real_root, str(full)):
        st.problems.append(_p(rel, None, None, "resolves outside the dataset root (symlink)", "copy the file into the dataset instead of linking it"))
        return
    try:
        data = full.read_bytes()
    except OSError as e:
        st.problems.append(_p(rel, None, None, f"cannot be read: {e.strerror or e}", "restore the file or rebuild the dataset"))
        return
    split = rel[len(RECORDS_DIR) + 1 : -len(".jsonl")]
    pairs, problems = read_jsonl_bytes(data, rel)
    st.problems += problems
    entry = (m or {}).get("records", {}).get(rel)
    if isinstance(entry, dict):
        if entry.get("sha256") != sha256_bytes(data):
            st.problems.append(_p(rel, None, None, "sha256 differs from manifest.json (modified after the manifest was written)", "restore the file, or rebuild the manifest if the change is intended"))
        if entry.get("rows") != len(pairs) + len(problems):
            st.problems.append(_p(rel, None, None, f"{len(pairs) + len(problems)} lines, manifest.json says {entry.get('rows')}", "restore the file, or rebuild the manifest"))
    for line, row in pairs:
        row_problems = check_row(row, file=rel, line=line, split=split)
        if m is None and isinstance(row, dict):
            # No manifest yet: `python -m harness.data manifest DIR` fills the missing digests.
            row_problems = [p for p in row_problems if not _blank_sha(row, p.field)]
        st.problems += row_problems
        if isinstance(row, dict):
            _cross_row(row, rel, line, st)


def _cross_row(row: dict, file: str, line: int, st: _State) -> None:
    here = f"{file}:{line}"
    gid, vid, bid = row.get("group_id"), row.get("view_id"), row.get("base_id")
    if isinstance(gid, str) and isinstance(vid, str):
        if (gid, vid) in st.views:
            st.problems.append(_p(file, line, "view_id", f"duplicate view ({gid!r}, {vid!r}), first at {st.views[(gid, vid)]}", "give every view of a group its own view_id"))
        else:
            st.views[(gid, vid)] = here
    if isinstance(bid, str):
        split = row.get("split")
        first = st.base_split.setdefault(bid, (split, here))
        if first[0] != split:
            st.problems.append(_p(file, line, "base_id", f"base {bid!r} is in split {split!r} here and in {first[0]!r} at {first[1]} (split leakage)", "put all views of a base item in one split"))
        if isinstance(gid, str) and st.group_base.setdefault(gid, bid) != bid and gid not in st.reported_groups:
            st.reported_groups.add(gid)  # once per group, not once per view
            st.problems.append(_p(file, line, "group_id", f"group {gid!r} spans base items {st.group_base[gid]!r} and {bid!r}", "a group's views must share one base_id"))
    if isinstance(gid, str):
        st.group_rows[gid][str(row.get("relation"))].append({"file": file, "line": line, **{k: row.get(k) for k in IMAGE_LISTS}})
    for key in IMAGE_LISTS:
        refs = row.get(key)
        for i, ref in enumerate(refs if isinstance(refs, list) else []):
            if isinstance(ref, dict) and path_problem(ref.get("path")) is None:
                st.refs[ref["path"]].append((ref.get("sha256"), file, line, f"{key}[{i}]"))
    images, ev = row.get("images"), row.get("evidence")
    if isinstance(images, list) and images and isinstance(images[0], dict) and isinstance(ev, list) and ev:
        st.boxes.append((file, line, images[0].get("path"), ev))
    if isinstance(row.get("split"), str) and isinstance(row.get("relation"), str):
        st.counts[row["split"]][row["relation"]] += 1
    st.overlap.add(row, file, line)


def _check_groups(st: _State) -> None:
    for gid, by_rel in st.group_rows.items():
        fulls = by_rel.get("FULL", [])
        if len(fulls) > 1:
            st.problems.append(_p(fulls[1]["file"], fulls[1]["line"], "relation", f"group {gid!r} has {len(fulls)} FULL views", "keep one FULL view per group"))
        for full in fulls[:1]:
            for key, rel in (("missing_images", "MISSING"), ("control_images", "CONTROL")):
                others = by_rel.get(rel, [])
                if full.get(key) is not None and len(others) == 1 and full[key] != others[0]["images"]:
                    st.problems.append(_p(full["file"], full["line"], key, f"differs from the images of the group's {rel} view ({others[0]['file']}:{others[0]['line']})", f"set {key} to that view's images"))


def _check_image(guard: RootGuard, base: str, rel: str, expected: Any) -> tuple[str, tuple[int, int] | None, str | None, list[DataProblem]]:
    """(rel, size or None, the file's sha256 or None, problems); expected None: no manifest digest to compare."""
    full = base + rel
    if not guard.inside(full):
        return rel, None, None, [_p(rel, None, None, "resolves outside the dataset root (symlink)", "copy the image into the dataset instead of linking it")]
    try:
        with open(full, "rb") as fh:
            data = fh.read()
    except OSError as e:
        return rel, None, None, [_p(rel, None, None, f"image is missing or unreadable: {e.strerror or e}", "restore the file, or regenerate / reconvert the dataset")]
    problems = []
    digest = sha256_bytes(data)
    if expected is not None and digest != expected:
        problems.append(_p(rel, None, "sha256", "content differs from the sha256 in manifest.json (tampered or corrupted)", "restore the original file, or rebuild the manifest if the change is intended"))
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()  # a full decode, not just the header
            size = img.size
    except Exception as e:  # PIL raises many types for broken files; all mean the same here
        return rel, None, digest, problems + [_p(rel, None, None, f"does not decode as an image: {type(e).__name__}: {e}", "replace it with a valid PNG or JPEG")]
    return rel, size, digest, problems


def _check_image_chunk(root: str, items: list[tuple[str, Any]]) -> list[tuple[str, tuple[int, int] | None, str | None, list[DataProblem]]]:
    """One worker's share (a module-level function, so a process pool can pickle it)."""
    guard = RootGuard(root)
    return [_check_image(guard, root + "/", rel, expected) for rel, expected in items]


def _check_images(root: Path, m: dict | None, st: _State, workers: int) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """({path: (width, height)} of the images that decode, {path: sha256 of the file} of those that read)."""
    listed = (m or {}).get("images", {})
    for path, uses in sorted(st.refs.items()):
        for sha, file, line, field in uses:
            if m is not None and path not in listed:
                st.problems.append(_p(file, line, f"{field}.path", f"{path!r} is not listed in manifest.json", "add the image to the manifest (`python -m harness.data manifest DIR`)"))
            elif m is not None and sha != listed[path] and isinstance(sha, str) and _SHA256_RE.fullmatch(sha):
                # (a missing or malformed sha256 is the row's own problem, reported by check_row)
                st.problems.append(_p(file, line, f"{field}.sha256", f"{sha!r} differs from manifest.json's {listed[path]!r} for {path}", "copy the digest from the file (sha256sum) into the row"))
    if m is not None:
        items = [(rel, listed[rel]) for rel in sorted(listed) if path_problem(rel) is None]
    else:  # no manifest: still check that the referenced files exist and decode; no digest to compare
        items = [(rel, None) for rel in sorted(st.refs)]
    if workers > 1 and len(items) > POOL_MIN_IMAGES:
        # Processes, not threads: opening a PNG is mostly Python code, which holds the GIL.
        from concurrent.futures import ProcessPoolExecutor

        n = max(1, len(items) // (workers * 4))
        chunks = [items[i : i + n] for i in range(0, len(items), n)]
        with ProcessPoolExecutor(workers) as pool:
            results = [r for part in pool.map(_check_image_chunk, [str(root)] * len(chunks), chunks) for r in part]
    else:
        results = _check_image_chunk(str(root), items)
    sizes, digests = {}, {}
    for rel, size, digest, problems in results:
        if m is None and st.refs.get(rel):
            # No manifest lists the image: name the first row that uses it instead.
            _, file, line, field = st.refs[rel][0]
            problems = [_p(file, line, f"{field}.path", f"{rel}: {p.why}", p.fix) if p.file == rel and p.line is None else p for p in problems]
        st.problems += problems
        if size is not None:
            sizes[rel] = size
        if digest is not None:
            digests[rel] = digest
        if m is None and digest is not None:
            # A row's own digest that is wrong is a row problem even without a manifest (the
            # manifest command would refuse it); a missing one is filled in by that command.
            for sha, file, line, field in st.refs.get(rel, []):
                if isinstance(sha, str) and _SHA256_RE.fullmatch(sha) and sha != digest:
                    st.problems.append(_p(file, line, f"{field}.sha256", f"{sha!r} differs from the sha256 of {rel} ({digest!r})", "correct it, or let `python -m harness.data manifest DIR --fill-digests` set every row's image sha256 from the files"))
    return sizes, digests


def _check_boxes(st: _State, sizes: dict[str, tuple[int, int]]) -> None:
    for file, line, path, boxes in st.boxes:
        if path not in sizes:
            continue
        w, h = sizes[path]
        for i, box in enumerate(boxes):
            if isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box) and (box[2] > w or box[3] > h):
                st.problems.append(_p(file, line, f"evidence[{i}]", f"{box} extends beyond the {w}x{h} image {path}", "clip the box to the image (x1 <= width, y1 <= height)"))


def _full_check(root: Path, m: dict | None, manifest_error: DataContractError | None, workers: int, train_split: str) -> tuple[list[DataProblem], dict, dict | None]:
    """(every problem of the dataset but a split overlap, the summary, the overlap or None), given the manifest the
    fingerprint was computed from. The overlap is data, not a problem yet: the caller's flag decides."""
    st = _State(train_split)
    real_root = str(root.resolve())
    if manifest_error is not None:
        st.problems += manifest_error.problems
    if m is not None:
        files = _check_manifest(m, st, root)
    else:
        files = sorted(f"{RECORDS_DIR}/{p.name}" for p in (root / RECORDS_DIR).glob("*.jsonl") if SPLIT_RE.fullmatch(p.stem))
    if not files:
        st.problems.append(_p(RECORDS_DIR, None, None, "no records files", "write rows to records/<split>.jsonl"))
    for rel in files:
        _check_records_file(rel, m, st, real_root, root)
    _check_groups(st)
    sizes, digests = _check_images(root, m, st, workers)
    _check_boxes(st, sizes)
    overlap = st.overlap.find(digests)  # the files' own digests: byte-equal is what leaks, whatever a row claims
    summary = summarize(st.counts, len((m or {}).get("images", {})))
    # The summary is derived from the records, whose digests are checked above: compare it only
    # when everything else holds, so a broken row is not reported twice.
    if m is not None and not st.problems and m["summary"] != summary:
        st.problems.append(_p(MANIFEST, None, "summary", f"says {m['summary'].get('rows')} rows / {m['summary'].get('splits')}, the records give {summary['rows']} / {summary['splits']}", "rebuild the manifest with `python -m harness.data manifest DIR`"))
    return st.problems, summary, overlap


# --- entry point


def validate_dataset(root: str | Path, *, cache_dir: str | Path | None = None, workers: int = 0, memoize: bool = True, group: bool = True,
                     train_split: str = "train", allow_split_overlap: bool = True) -> ValidationReport:
    """Check the dataset at `root`; DataContractError listing every problem, else a report.

    A success is memoized under `cache_dir` (default: default_cache_dir()); an unwritable cache
    only costs the memo, never the check. group=False keeps one problem per place (a converter
    maps them to its source rows, then groups them itself). `train_split` is the split held-out
    images are compared with (data.train_split). A split overlap is one more problem when
    allow_split_overlap=False, what a run and `validate` pass unless the user accepts it
    (data.allow_split_overlap, --allow-split-overlap); otherwise the report carries it
    (ValidationReport.overlap, warnings(), summary()). The default, True, is the builders' (init,
    convert-hf, manifest, synth: they build and warn, harness/data/leakage.py).
    """
    t0, t0_ns = time.perf_counter(), time.time_ns()
    root = Path(root)
    if not root.is_dir():
        raise DataContractError(str(root), [_p(str(root), None, None, "dataset root is not a directory", "pass the folder that holds manifest.json and records/ (e.g. one written by `python -m harness.data synth`)")])
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fp, ctimes, m, manifest_error = "", {}, None, None
    try:
        m, raw = read_manifest(root)
        fp, ctimes = _fingerprint(root, raw, m, train_split)
    except DataContractError as e:
        manifest_error = e  # the full check reports it, with everything else
    if memoize and fp:
        memo = _memo_hit(cache, fp, root, m)
        if memo is not None:
            return _verdict(ValidationReport(str(root), memo["sha256"], memo["rows"], memo["images"], memo["splits"], fp, True, time.perf_counter() - t0, memo["overlap"]), allow_split_overlap)
    problems, summary, overlap = _full_check(root, m, manifest_error, workers, train_split)
    if problems:
        problems += [overlap_problem(overlap)] if overlap and not allow_split_overlap else []
        raise DataContractError(str(root), group_problems(problems) if group else problems)
    report = ValidationReport(str(root), m["sha256"], summary["rows"], summary["images"], summary["splits"], fp, False, time.perf_counter() - t0, overlap)
    if memoize and fp:
        # Memoized with its overlap, whatever the flag: the next call applies its own flag to the memo.
        racy = sorted(rel for rel, c in ctimes.items() if c >= t0_ns - RACY_WINDOW_NS)
        memo = {k: v for k, v in asdict(report).items() if k not in ("memoized", "seconds")} | {"racy": racy}
        try:
            cache.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(cache / f"{fp}.json", json.dumps(memo, sort_keys=True).encode())
        except OSError:
            pass  # read-only cache: validation still succeeded
    return _verdict(report, allow_split_overlap)


def _verdict(report: ValidationReport, allow_split_overlap: bool) -> ValidationReport:
    """The report of a dataset without other problems, refused when it has a split overlap the caller did not accept."""
    if report.overlap and not allow_split_overlap:
        raise DataContractError(report.root, [overlap_problem(report.overlap)])
    return report

"""The dataset manifest: digests of every records file and image, and the data identity.

manifest.json (written last, atomically, so a dataset without it is never mistaken for a
complete one):

    schema_version  1
    sha256          data identity: sha256 of the canonical JSON of {schema_version, records, images}
                    (content only: the same files give the same identity wherever they live)
    kind            synthetic | converted | custom
    generator       synthetic only: the generator spec (harness.data.spec), else null
    spec_sha256     synthetic only: sha256 of that spec, the identity the planner computes
                    without generating; else null
    source          converted only: where the rows came from (informational, not in sha256)
    summary         {rows, images, splits: {split: {relation: rows}}} (checked by validate)
    records         {"records/<split>.jsonl": {sha256, rows, bytes}}
    images          {"images/...": sha256}

`data_identity(root)` reads only this file (torch-free, milliseconds) and checks that its
`sha256` matches its content; `python -m harness.data validate` checks the files against it.
`DatasetWriter` is the one writer both the synthetic generator and the converters use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from harness.data.records import MANIFEST, SCHEMA_VERSION, records_path
from harness.errors import ConfigError, DataContractError, DataProblem, Problem
from harness.identity import canonical_json as _canonical_text
from harness.identity import sha256_file  # noqa: F401  (re-exported for harness.data modules)
from harness.rundir import atomic_write_bytes, fsync_dir  # noqa: F401  (one implementation of atomic writes)

# --- bytes on disk


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON (harness.identity's: sorted keys, no spaces, UTF-8) as bytes: the input of every digest here."""
    return _canonical_text(obj).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_temp_dir(target: Path) -> Path:
    """A fresh hidden folder next to `target` (same filesystem, so the final rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))


def check_out_dir(out: Path, *, force: bool, flag: str = "--out") -> None:
    """Refuse to write a dataset over a non-empty folder unless force (it would mix two datasets)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConfigError([Problem(flag, str(out), "exists and is not empty; writing into it would mix two datasets", "choose a new folder, or pass --force to replace it")])


def publish_dir(tmp: Path, target: Path, *, replace: bool) -> bool:
    """Rename the finished folder `tmp` to `target`; False when a complete dataset was already there.

    replace=False (caches): a folder with a manifest wins and `tmp` is discarded (a concurrent
    generator finished first); a folder without one is a crashed writer's and is moved aside.
    replace=True (--force): whatever is there is moved aside and deleted.
    """
    for _ in range(3):
        try:
            os.rename(tmp, target)  # atomic; also replaces an empty folder
            fsync_dir(target.parent)
            return True
        except OSError:
            if (target / MANIFEST).is_file() and not replace:
                shutil.rmtree(tmp, ignore_errors=True)
                return False
            trash = target.with_name(f".{target.name}.old-{os.getpid()}-{os.urandom(4).hex()}")
            try:
                os.rename(target, trash)
            except FileNotFoundError:
                continue  # someone else moved it meanwhile: try again
            if trash.is_dir() and not trash.is_symlink():
                shutil.rmtree(trash, ignore_errors=True)
            else:  # --force over a file (or a link): rmtree would leave it behind
                trash.unlink(missing_ok=True)
    raise OSError(f"could not publish {tmp} as {target} after 3 attempts")


# --- the manifest


def manifest_digest(manifest: dict) -> str:
    """The data identity: sha256 over the content part of a manifest."""
    core = {k: manifest.get(k) for k in ("schema_version", "records", "images")}
    return sha256_bytes(canonical_json(core))


def build_manifest(
    records: dict[str, dict],
    images: dict[str, str],
    summary: dict,
    *,
    kind: str = "custom",
    generator: dict | None = None,
    spec_sha256: str | None = None,
    source: dict | None = None,
) -> dict:
    m = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "generator": generator,
        "spec_sha256": spec_sha256,
        "source": source,
        "summary": summary,
        "records": dict(sorted(records.items())),
        "images": dict(sorted(images.items())),
    }
    m["sha256"] = manifest_digest(m)
    return m


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _problem(root: Path, why: str, fix: str, field: str | None = None) -> DataContractError:
    return DataContractError(str(root), [DataProblem(MANIFEST, None, field, why, fix)])


def read_manifest(root: str | Path) -> tuple[dict, bytes]:
    """The parsed manifest and its raw bytes; DataContractError when missing or unreadable."""
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        raise DataContractError(str(root), [DataProblem(str(root), None, None, "dataset root is not a directory", "pass the folder that holds manifest.json and records/")])
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise _problem(root, "manifest.json is missing (an unfinished or hand-made dataset); digests and row counts are checked once it exists", f"run `python -m harness.data manifest {shlex.quote(str(root))}` to write it (it also fills in the rows' image sha256); a synthetic or converted set: build it again") from None
    except OSError as e:
        raise _problem(root, f"manifest.json cannot be read: {e.strerror or e}", "fix its permissions, or rebuild it with `python -m harness.data manifest DIR`") from None
    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _problem(root, f"manifest.json does not parse: {e}", "rebuild it with `python -m harness.data manifest DIR`") from None
    if not isinstance(m, dict):
        raise _problem(root, "manifest.json is not a JSON object", "rebuild it with `python -m harness.data manifest DIR`")
    if m.get("schema_version") != SCHEMA_VERSION:
        raise _problem(root, f"schema_version {m.get('schema_version')!r}, this harness reads {SCHEMA_VERSION}", "regenerate or convert the dataset with this harness", "schema_version")
    for key, typ in (("records", dict), ("images", dict), ("summary", dict), ("sha256", str)):
        if not isinstance(m.get(key), typ):
            raise _problem(root, f"{key} is missing or not a {typ.__name__}", "rebuild it with `python -m harness.data manifest DIR`", key)
    return m, raw


def data_identity(root: str | Path) -> dict:
    """The dataset's identity from its manifest alone (cheap, torch-free); refuses a manifest edited by hand."""
    m, _ = read_manifest(root)
    if manifest_digest(m) != m["sha256"]:
        raise _problem(Path(root), "manifest sha256 does not match its records and images (edited by hand?)", "rebuild it with `python -m harness.data manifest DIR`", "sha256")
    summary = m["summary"]
    return {
        "sha256": m["sha256"],
        "schema_version": m["schema_version"],
        "kind": m.get("kind"),
        "spec_sha256": m.get("spec_sha256"),
        "rows": summary.get("rows"),
        "images": summary.get("images"),
        "splits": summary.get("splits"),
    }


# --- writing a dataset


class DatasetWriter:
    """Writes images and rows under `root`, then the records files, then the manifest (last)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.images: dict[str, str] = {}
        self.lines: dict[str, list[bytes]] = defaultdict(list)
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self._dirs: set[Path] = set()

    def add_image(self, rel: str, data: bytes) -> dict:
        """Write one image file; returns its reference {path, sha256} for a row's images list."""
        full = self.root / rel
        if full.parent not in self._dirs:
            full.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(full.parent)
        with open(full, "wb") as fh:
            fh.write(data)
        digest = sha256_bytes(data)
        self.images[rel] = digest
        return {"path": rel, "sha256": digest}

    def add_row(self, row: dict) -> None:
        # Insertion order of keys is kept (reads naturally); bytes are deterministic for equal rows.
        self.lines[row["split"]].append(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        self.counts[row["split"]][row["relation"]] += 1

    def finish(self, **manifest_fields: Any) -> dict:
        records = {}
        for split in sorted(self.lines):
            data = b"".join(line + b"\n" for line in self.lines[split])
            rel = records_path(split)
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_bytes(data)
            records[rel] = {"sha256": sha256_bytes(data), "rows": len(self.lines[split]), "bytes": len(data)}
        summary = summarize(self.counts, len(self.images))
        manifest = build_manifest(records, self.images, summary, **manifest_fields)
        atomic_write_bytes(self.root / MANIFEST, manifest_bytes(manifest))
        return manifest


def summarize(counts: dict[str, Counter], n_images: int) -> dict:
    splits = {s: dict(sorted(c.items())) for s, c in sorted(counts.items())}
    return {"rows": sum(sum(c.values()) for c in counts.values()), "images": n_images, "splits": splits}


# --- sealing a hand-made dataset


def seal_dataset(root: str | Path, *, fill_digests: bool = False) -> dict:
    """Write manifest.json for rows and images already under `root` (`python -m harness.data manifest`).

    Every image reference without a sha256 (key absent, null or "") gets the file's digest; a
    reference whose sha256 differs from its file is refused (a wrong digest is a typo or a
    changed image), unless fill_digests, which sets every reference's sha256 from the files.
    Only the lines that change are rewritten (atomically); the others keep their bytes. Every
    problem is found before anything is written. Rows are not judged here: run validate afterwards.
    """
    from harness.data.records import IMAGE_LISTS, RECORDS_DIR, SPLIT_RE, inside_root, path_problem, read_jsonl_bytes

    root = Path(root)
    if not root.is_dir():
        raise DataContractError(str(root), [DataProblem(str(root), None, None, "dataset root is not a directory", "pass the folder that holds records/<split>.jsonl and the images")])
    real_root = str(root.resolve())
    problems: list[DataProblem] = []
    files = sorted(p for p in (root / RECORDS_DIR).glob("*.jsonl") if SPLIT_RE.fullmatch(p.stem))
    if not files:
        raise DataContractError(str(root), [DataProblem(RECORDS_DIR, None, None, "no records/<split>.jsonl files", "write one JSON object per view to records/<split>.jsonl")])
    parsed: dict[str, tuple[bytes, list[tuple[int, Any]], set[int]]] = {}  # rel -> (bytes, rows, changed lines)
    images: dict[str, str] = {}
    counts: dict[str, Counter] = defaultdict(Counter)
    for path in files:
        rel = f"{RECORDS_DIR}/{path.name}"
        data = path.read_bytes()
        pairs, bad = read_jsonl_bytes(data, rel)
        problems += bad
        changed: set[int] = set()
        parsed[rel] = (data, pairs, changed)
        for line, row in pairs:
            if not isinstance(row, dict):
                continue
            counts[path.stem][str(row.get("relation"))] += 1
            for key in IMAGE_LISTS:
                refs = row.get(key)
                for i, ref in enumerate(refs if isinstance(refs, list) else []):
                    p = ref.get("path") if isinstance(ref, dict) else None
                    if path_problem(p) or not inside_root(real_root, str(root / p)) or not (root / p).is_file():
                        problems.append(DataProblem(rel, line, f"{key}[{i}].path", f"image {p!r} is not a file inside the dataset root", "fix the path or add the file"))
                        continue
                    if p not in images:
                        images[p] = sha256_file(root / p)
                    have = ref.get("sha256")
                    if have == images[p]:
                        continue
                    if fill_digests or have in (None, ""):
                        ref["sha256"] = images[p]
                        changed.add(line)
                    else:
                        problems.append(DataProblem(rel, line, f"{key}[{i}].sha256", f"{have!r} differs from the sha256 of {p} ({images[p]!r})", "correct or delete it (a missing sha256 is filled in), or pass --fill-digests to set every row's image sha256 from the files"))
    if problems:
        from harness.data.records import group_problems

        raise DataContractError(str(root), group_problems(problems))
    records = {}
    for rel, (data, pairs, changed) in parsed.items():
        if changed:
            lines = data.split(b"\n")
            for line, row in pairs:
                if line in changed:
                    lines[line - 1] = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            data = b"\n".join(lines)
            atomic_write_bytes(root / rel, data)
        records[rel] = {"sha256": sha256_bytes(data), "rows": len(pairs), "bytes": len(data)}
    manifest = build_manifest(records, images, summarize(counts, len(images)), kind="custom")
    atomic_write_bytes(root / MANIFEST, manifest_bytes(manifest))
    return manifest

"""`python -m harness.data init DIR --from SRC`: a complete dataset from what researchers hold.

SRC is one of:

- a table of question/answer rows, CSV (UTF-8, a header row) or JSONL (one object per line),
  next to its images: the table file itself, or a folder holding exactly one *.csv / *.jsonl.
  The image column holds a path relative to the table's folder (a JSONL cell may hold a list
  of paths); `--image-column none` makes a text-only dataset. A CSV choices cell is a JSON list
  (`["cat", "dog"]`) or options separated by `|`.
- a Hugging Face `datasets` folder written by save_to_disk (it holds dataset_info.json,
  dataset_dict.json or state.json): converted by convert_hf with the same column flags.

Every table row becomes one FULL view: base_id from --id-column (else `row-NNNNNN`, the row's
position), group_id = base_id, view_id `full`, evidence []. Splits come from --split-column,
else a seeded split by row (convert.seeded_test_rows: --test-fraction of the rows, at least 1, go to
`test`, the rest to `train`). Images are copied to images/<path relative to the table's
folder> (a leading images/ is not doubled); an image outside that folder keeps its file name.

Every problem of the table (a missing column, a missing or unreadable image, two files for one
name, a bad split name, a duplicate id, a row the contract refuses) is found and reported with
its table file and line before anything is copied. Then the dataset is built in a temp folder
next to DIR, validated and renamed (convert.build_validated), so nothing half-written is left.
Torch-free for tables; `datasets` is imported only for a save_to_disk SRC.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.rewards.answers import ANSWER_TYPES
from harness.data.convert import Origin, build_validated, choices_of, full_row, seeded_test_rows, target_of
from harness.data.manifest import DatasetWriter, check_out_dir, read_manifest
from harness.data.records import IMAGES_DIR, SPLIT_RE, check_row, path_problem, records_path
from harness.errors import ConfigError, DataContractError, DataProblem, Problem

HF_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")
TABLE_SUFFIXES = (".csv", ".jsonl")
_PLACEHOLDER_SHA = "0" * 64  # rows are checked before copying, when no digest is known yet


@dataclass(frozen=True)
class InitResult:
    out: Path
    source: str  # csv | jsonl | hf
    src: Path  # the table file, or the datasets folder
    splits: dict[str, int]  # split -> rows
    images: int
    how_split: str  # how the splits were made, for the printout


def init_dataset(
    out: str | Path,
    src: str | Path,
    *,
    image_column: str | None = "image",
    question_column: str = "question",
    answer_column: str = "answer",
    answer_type: str = "word",
    split_column: str | None = None,
    choices_column: str | None = None,
    id_column: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    force: bool = False,
) -> InitResult:
    """Build a validated dataset at `out` from `src` (module docstring); refusals raise ConfigError / DataContractError."""
    out, src = Path(out).expanduser(), Path(src).expanduser()
    problems = []
    if answer_type not in ANSWER_TYPES:
        problems.append(Problem("--answer-type", answer_type, "unknown answer type", f"use one of {', '.join(ANSWER_TYPES)}"))
    if not 0 < test_fraction < 1:
        problems.append(Problem("--test-fraction", test_fraction, "must lie strictly between 0 and 1", "pass e.g. --test-fraction 0.2"))
    if problems:
        raise ConfigError(problems)
    kind, path = _source(src)
    here = (path if kind == "hf" else path.parent).resolve()
    if out.resolve() in (here, path.resolve(), *here.parents):
        raise ConfigError([Problem("DIR", str(out), f"holds the source {path}; writing the dataset there would replace it", "choose a folder outside the source")])
    check_out_dir(out, force=force, flag="DIR")
    if kind == "hf":
        return _init_hf(out, path, image_column, question_column, answer_column, answer_type, split_column, choices_column, id_column, test_fraction, seed, force)

    plan = _plan_table(kind, path, image_column, question_column, answer_column, answer_type, split_column, choices_column, id_column, test_fraction, seed)
    source = {"format": kind, "src": str(path.resolve()), "columns": {"image": image_column, "question": question_column, "answer": answer_column, "split": split_column, "choices": choices_column, "id": id_column}}
    if split_column is None:
        source |= {"test_fraction": test_fraction, "seed": seed}

    def write(tmp: Path) -> Origin:
        writer = DatasetWriter(tmp)
        refs = {dest: writer.add_image(dest, Path(full).read_bytes()) for dest, full in plan.images.items()}
        origin: Origin = {(dest, None): (full, None) for dest, full in plan.images.items()}
        lines: dict[str, int] = {}
        for line, row in plan.rows:
            row["images"] = [refs[ref["path"]] for ref in row["images"]]
            writer.add_row(row)
            lines[row["split"]] = lines.get(row["split"], 0) + 1
            origin[(records_path(row["split"]), lines[row["split"]])] = (str(path), line)
        writer.finish(kind="converted", source=source)
        return origin

    _build(path, out, write)
    return InitResult(out, kind, path, plan.splits, len(plan.images), plan.how_split)


# --- the source


def _source(src: Path) -> tuple[str, Path]:
    """(csv | jsonl | hf, the table file or the datasets folder)."""
    fix = "pass the table (.csv or .jsonl), the folder holding it and its images, or a folder written by datasets' save_to_disk"
    if not src.exists():
        raise ConfigError([Problem("--from", str(src), "does not exist", fix)])
    if src.is_file():
        if src.suffix.lower() not in TABLE_SUFFIXES:
            raise ConfigError([Problem("--from", str(src), f"is a {src.suffix or 'suffix-less'} file, not a .csv or .jsonl table", fix)])
        return src.suffix.lower()[1:], src
    if not src.is_dir():
        raise ConfigError([Problem("--from", str(src), "is neither a file nor a folder", fix)])
    if any((src / name).is_file() for name in HF_MARKERS):
        return "hf", src
    try:
        tables = sorted(p for p in src.iterdir() if p.suffix.lower() in TABLE_SUFFIXES and p.is_file())
    except OSError as e:
        raise ConfigError([Problem("--from", str(src), f"cannot be listed: {e.strerror or e}", "fix its permissions")]) from None
    if len(tables) != 1:
        found = f"{len(tables)} tables ({', '.join(p.name for p in tables)})" if tables else "no .csv or .jsonl table and no datasets files"
        raise ConfigError([Problem("--from", str(src), f"holds {found}", "pass the table file itself (--from DIR/table.csv), or keep exactly one table next to the images")])
    return tables[0].suffix.lower()[1:], tables[0]


def _read_table(kind: str, table: Path) -> tuple[list[str], list[tuple[int, dict]], list[DataProblem]]:
    """(columns in order, [(line, row)], the lines that do not read as rows); refuses a table that does not read at all."""
    try:
        data = table.read_bytes()
    except OSError as e:
        raise ConfigError([Problem("--from", str(table), f"cannot be read: {e.strerror or e}", "fix its permissions, or pass another table")]) from None
    if kind == "jsonl":
        from harness.data.records import read_jsonl_bytes

        pairs, problems = read_jsonl_bytes(data, str(table))
        problems += [DataProblem(str(table), line, None, f"a row must be a JSON object, got {type(row).__name__}", "write one JSON object per line") for line, row in pairs if not isinstance(row, dict)]
        pairs = [(line, row) for line, row in pairs if isinstance(row, dict)]
        columns = list(dict.fromkeys(k for _, row in pairs for k in row))
        return columns, pairs, problems
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's UTF-8 export starts with a BOM
    except UnicodeDecodeError as e:
        raise ConfigError([Problem("--from", str(table), f"is not UTF-8 (byte {data[e.start]:#04x} at offset {e.start})", "save the table as UTF-8 (\"CSV UTF-8\")")]) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        header = []
    except csv.Error as e:
        raise ConfigError([Problem("--from", str(table), f"the header does not parse as CSV: {e}", "fix the first line")]) from None
    if not any(header):
        raise ConfigError([Problem("--from", str(table), "has no header row", "write the column names (e.g. image,question,answer) on the first line")])
    rows, problems, end = [], [], reader.line_num
    try:
        for cells in reader:
            start, end = end + 1, reader.line_num
            if not cells or not any(c.strip() for c in cells):
                continue  # a blank line
            if len(cells) != len(header):
                more = len(cells) > len(header)
                problems.append(DataProblem(str(table), start, None, f"{len(cells)} cells, the header has {len(header)}" + (" (an unquoted comma?)" if more else ""), "quote cells that hold commas (\"a, b\")" if more else "give every row a cell for every column (an empty one is fine)"))
                continue
            rows.append((start, dict(zip(header, cells))))
    except csv.Error as e:
        problems.append(DataProblem(str(table), reader.line_num, None, f"does not parse as CSV: {e}", "fix the quoting of that line"))
    dup = sorted({h for h in header if header.count(h) > 1 and h})
    if dup:
        raise ConfigError([Problem("--from", str(table), f"the header repeats the columns {dup}", "give every column its own name")])
    return header, rows, problems


@dataclass
class _Plan:
    rows: list[tuple[int, dict]] = field(default_factory=list)  # (table line, row with placeholder digests)
    images: dict[str, str] = field(default_factory=dict)  # dataset path -> source file
    splits: dict[str, int] = field(default_factory=dict)
    how_split: str = ""


def _plan_table(kind, table, image_column, question_column, answer_column, answer_type, split_column, choices_column, id_column, test_fraction, seed) -> _Plan:
    """Every row as it will be written, or every problem of the table (nothing is copied yet)."""
    columns, rows, problems = _read_table(kind, table)
    if not rows and not problems:
        raise ConfigError([Problem("--from", str(table), "has no rows", "add one row per question")])
    wanted = {"--image-column": image_column, "--question-column": question_column, "--answer-column": answer_column, "--split-column": split_column, "--choices-column": choices_column, "--id-column": id_column}
    missing = [Problem(flag, col, f"no such column in {table.name}", f"pick one of {columns}" + (", or pass --image-column none for a text-only dataset" if flag == "--image-column" else "")) for flag, col in wanted.items() if col is not None and col not in columns]
    if missing:
        raise ConfigError(missing)

    here = str(table)
    plan = _Plan()
    first_id: dict[str, int] = {}
    sources: dict[str, tuple[str, int]] = {}  # dataset path -> (real source path, first line)
    checked: dict[str, str | None] = {}  # real source path -> why it is not an image, or None
    base_ids, splits = [], []
    skip: set[int] = set()  # rows whose contract check would only repeat a problem found here
    for i, (line, rec) in enumerate(rows):
        absent = [c for c in (image_column, question_column, answer_column, split_column, choices_column, id_column) if c is not None and c not in rec]
        if absent:  # a JSONL row without some keys (a CSV row has every column)
            problems.append(DataProblem(here, line, absent[0], f"the row has no {', '.join(map(repr, absent))}", f"give every row the keys {[c for c in wanted.values() if c is not None]}"))
            skip.add(i)
        # id
        if id_column is not None:
            base = _text(rec.get(id_column))
            if not base:
                problems.append(DataProblem(here, line, id_column, "empty id", "give every row an id, or drop --id-column (ids are then the row positions)"))
            elif base in first_id:
                problems.append(DataProblem(here, line, id_column, f"duplicate id {base!r}, first at line {first_id[base]}", "give every row its own id"))
            else:
                first_id[base] = line
        else:
            base = f"row-{i:06d}"
        base_ids.append(base)
        # split
        split = None
        if split_column is not None:
            split = _text(rec.get(split_column))
            if not SPLIT_RE.fullmatch(split):
                problems.append(DataProblem(here, line, split_column, f"split {split!r} is not a lower-case name of letters, digits and _ (starting with a letter)", "use names such as train, val, test"))
        splits.append(split)
        # images
        refs = []
        if image_column is not None:
            cell = rec.get(image_column)
            cells = cell if isinstance(cell, list) else [cell]
            for value in cells:
                dest, real, why = _image(table.parent, value, checked)
                if why:
                    if image_column in rec:
                        problems.append(DataProblem(here, line, image_column, why[0], why[1]))
                    continue
                first = sources.setdefault(dest, (real, line))
                if first[0] != real:
                    problems.append(DataProblem(here, line, image_column, f"{value!r} and the image of line {first[1]} ({first[0]}) would both be copied to {dest}", "rename one of the two files"))
                    continue
                plan.images.setdefault(dest, real)
                refs.append({"path": dest, "sha256": _PLACEHOLDER_SHA})
        # choices, question, answer
        choices = None
        if choices_column is not None:
            try:
                choices = choices_of(_options(rec.get(choices_column)))
            except ValueError as e:
                problems.append(DataProblem(here, line, choices_column, str(e), "write the options as a JSON list [\"cat\", \"dog\"] or as cat|dog"))
        question = _text(rec.get(question_column))
        target = target_of(rec.get(answer_column), answer_type, choices)
        meta = {"source_row": i}
        plan.rows.append((line, full_row(base, split or "", question, answer_type, target, refs, choices, meta)))

    cols = {"question": question_column, "target": answer_column, "choices": choices_column, "base_id": id_column,
            "group_id": id_column, "split": split_column, "images": image_column}
    return _split_and_check(plan, here, len(rows), base_ids, splits, problems, skip, cols, split_column, test_fraction,
                            seed)


def _split_and_check(plan: _Plan, here: str, n_rows: int, base_ids: list[str], splits: list, problems: list,
                     skip: set[int], names: dict, split_column, test_fraction: float, seed: int) -> _Plan:
    """The splits (the column's, or a seeded split by row), then the contract's row rules at the table's lines and
    columns; every problem of the table at once, grouped, in table order."""
    if split_column is None:
        if n_rows < 2 and not problems:
            problems.append(DataProblem(here, None, None, "one row cannot be split into train and test", "add rows, or give the split in a column (--split-column)"))
        test = seeded_test_rows(base_ids, test_fraction, seed)
        splits = ["test" if i in test else "train" for i in range(n_rows)]
        plan.how_split = f"seeded by row: --test-fraction {test_fraction}, --seed {seed}"
    else:
        plan.how_split = f"from column {split_column!r}"
    # The row rules of the contract (targets, choices, questions), at the table's lines and columns.
    for i, ((line, row), split) in enumerate(zip(plan.rows, splits)):
        row["split"] = split or ""
        if i not in skip and SPLIT_RE.fullmatch(row["split"]):
            for p in check_row(row, file=here, line=line, split=row["split"]):
                col = names.get((p.field or "").split("[")[0].split(".")[0])
                problems.append(DataProblem(here, line, col or p.field, p.why, p.fix))
    if problems:
        from harness.data.records import group_problems

        problems.sort(key=lambda p: p.line or 0)  # in table order (stable: a row's problems keep theirs)
        raise DataContractError(here, group_problems(problems))
    for s in splits:
        plan.splits[s] = plan.splits.get(s, 0) + 1
    return plan


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _options(value: Any) -> list | None:
    """A choices cell as a list: a JSON list (or, in a CSV, `a|b|c`); empty means no choices."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, list):
        return value
    text = str(value).strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{text!r} is not a JSON list: {e.msg}") from None
        if not isinstance(value, list):
            raise ValueError(f"{text!r} is not a list")
        return value
    return [t.strip() for t in text.split("|")]


def _image(folder: Path, value: Any, checked: dict[str, str | None]) -> tuple[str, str, tuple[str, str] | None]:
    """(the dataset path, the real source path, None) for one image cell, or ("", "", (why, fix))."""
    if not isinstance(value, str) or not value.strip():
        return "", "", (f"no image path ({value!r})", "give the image's path relative to the table's folder, or pass --image-column none for a text-only dataset")
    rel = value.strip().replace("\\", "/")
    full = folder / rel
    real = os.path.realpath(full)
    if real not in checked:
        checked[real] = _not_an_image(full)
    if checked[real]:
        return "", "", (f"image {value!r}: {checked[real]}", f"fix the path (relative to the table's folder {folder}) or add the file")
    norm = posixpath.normpath(rel)
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../"):
        name = posixpath.basename(norm)  # outside the table's folder: keep the file name only
    else:
        name = norm[len(IMAGES_DIR) + 1 :] if norm.startswith(IMAGES_DIR + "/") else norm
    dest = f"{IMAGES_DIR}/{name}"
    why = path_problem(dest)
    if why:
        return "", "", (f"image {value!r} cannot be stored as {dest!r}: {why}", "rename the file")
    return dest, real, None


def _not_an_image(full: Path) -> str | None:
    """Why `full` is not an image file PIL reads (header only: the full decode is validation's), or None."""
    from PIL import Image

    if not full.is_file():
        return f"not found ({full})" if not full.exists() else f"not a file ({full})"
    try:
        with Image.open(full) as img:
            img.size  # noqa: B018  (the header is parsed on open)
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, DecompressionBombError, ...)
        return f"cannot be read as an image: {type(e).__name__}: {e}"
    return None


# --- building


def _build(src: Path, out: Path, write) -> None:
    """build_validated, with filesystem errors as refusals (an unwritable DIR, a vanished image)."""
    try:
        build_validated(src, out, write)
    except OSError as e:
        raise _fs_refusal(e, out) from None


def _fs_refusal(e: OSError, out: Path) -> ConfigError:
    """An OSError as a refusal naming DIR (writing the dataset) or --from (reading the source)."""
    name = Path(e.filename) if e.filename else out
    writing = e.filename is None or name in (out, *out.parents) or any(part.startswith(f".{out.name}.") for part in name.parts)
    if writing:
        why = f"{name} is a file, not a folder" if isinstance(e, (FileExistsError, NotADirectoryError)) and name != out else f"{type(e).__name__}: {e.strerror or e} ({name})"
        return ConfigError([Problem("DIR", str(out), f"cannot be written: {why}", "choose a folder you can write (its parent must be a folder you can write, or creatable)")])
    return ConfigError([Problem("--from", str(name), f"cannot be read: {type(e).__name__}: {e.strerror or e}", "restore the file, or fix its permissions")])


def _init_hf(out, src, image_column, question_column, answer_column, answer_type, split_column, choices_column, id_column, test_fraction, seed, force) -> InitResult:
    from harness.data.convert import convert_hf

    dict_splits = (src / "dataset_dict.json").is_file()
    try:
        convert_hf(src, out, image_column=image_column, question_column=question_column, answer_column=answer_column, answer_type=answer_type, split_column=split_column, choices_column=choices_column, base_column=id_column, test_fraction=test_fraction, seed=seed, force=force)
    except OSError as e:
        raise _fs_refusal(e, out) from None
    except ConfigError as e:  # convert-hf's flag names, as init spells them
        rename = {"--base-column": "--id-column", "--out": "DIR", "SRC": "--from"}
        raise ConfigError([Problem(rename.get(p.field, p.field), p.value, p.why, p.fix) for p in e.problems]) from None
    summary = read_manifest(out)[0]["summary"]
    splits = {s: sum(r.values()) for s, r in summary["splits"].items()}
    how = f"from column {split_column!r}" if split_column else "the DatasetDict's splits" if dict_splits else f"seeded by row: --test-fraction {test_fraction}, --seed {seed}"
    return InitResult(out, "hf", src, splits, summary["images"], how)

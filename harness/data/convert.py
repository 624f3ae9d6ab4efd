"""Convert a Hugging Face `datasets` folder (save_to_disk) into the harness dataset schema.

    python -m harness.data convert-hf SRC --out DIR --image-column image \\
        --question-column question --answer-column answer [--answer-type word] \\
        [--split-column split] [--choices-column choices] [--relation-column relation] \\
        [--base-column id] [--group-column qid]

Every row becomes one view: FULL unless --relation-column names its relation (then MISSING rows
get the empty target, the abstention). Splits come from --split-column, else from the
DatasetDict's split names, else all rows are `train`. base_id is --base-column (else the row's
position), group_id is --group-column (else the base_id), view_id the relation in lower case.
Image bytes are copied as stored (PIL images are written as PNG); choices given as a list of
strings get keys A, B, C, ... and an integer answer is read as an index into them.

The output is built in a temp folder next to DIR, validated, then renamed: a conversion with
problems leaves nothing behind, and each problem names the source row. `datasets` is imported
inside `convert_hf` only, so the rest of harness.data stays torch-free.

Shared with `python -m harness.data init` (harness/data/init.py): choices_of, target_of,
full_row, seeded_test_rows (the seeded split by row) and build_validated (temp folder, validate, map
problems to the source, rename).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import string
from pathlib import Path
from typing import Any, Callable

from harness.rewards.answers import ANSWER_TYPES, normalize_word
from harness.data.manifest import DatasetWriter, check_out_dir, new_temp_dir, publish_dir
from harness.data.records import IMAGES_DIR, RELATIONS, SPLIT_RE, records_path
from harness.errors import ConfigError, DataContractError, DataProblem, Problem


def _image_bytes(value: Any, src: Path) -> tuple[bytes, str]:
    """(bytes, extension) of one image cell: {bytes, path} dict, PIL image, path or raw bytes."""
    from PIL import Image

    data = None
    if isinstance(value, dict):
        data = value.get("bytes")
        if data is None and value.get("path"):
            p = Path(value["path"])
            data = (p if p.is_absolute() else src / p).read_bytes()
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    elif isinstance(value, str):
        p = Path(value)
        data = (p if p.is_absolute() else src / p).read_bytes()
    elif isinstance(value, Image.Image):
        buf = io.BytesIO()
        value.save(buf, format="PNG", compress_level=6)
        return buf.getvalue(), "png"
    if data is None:
        raise ValueError(f"unsupported image cell of type {type(value).__name__}")
    with Image.open(io.BytesIO(data)) as img:
        fmt = (img.format or "png").lower()
    return data, {"jpeg": "jpg"}.get(fmt, fmt)


def choices_of(value: Any) -> list[dict] | None:
    """A choices cell as [{key, text}]: a list of option texts gets keys A, B, C, ...; {key, text} items are kept."""
    if value is None:
        return None
    out = []
    for i, c in enumerate(value):
        if isinstance(c, dict):
            out.append({"key": str(c.get("key")), "text": str(c.get("text"))})
        else:
            out.append({"key": string.ascii_uppercase[i] if i < 26 else str(i + 1), "text": str(c)})
    return out


def target_of(answer: Any, answer_type: str, choices: list[dict] | None) -> str:
    """An answer cell in target space: a choice answer becomes its key (index, key or option text); 4.0 becomes "4"."""
    if answer is None:
        return ""
    if answer_type == "choice" and choices:
        if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
            return choices[answer]["key"]  # an index into the options
        text = str(answer).strip()
        for c in choices:
            if text.casefold() == c["key"].casefold() or normalize_word(text) == normalize_word(c["text"]):
                return c["key"]
        return text
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer).strip()


def n_test_rows(n: int, test_fraction: float) -> int:
    """Rows of the test split: the fraction rounded half up, at least 1, and at most n - 1 (train keeps one)."""
    return min(max(1, int(n * test_fraction + 0.5)), max(n - 1, 1))


def seeded_test_rows(keys: list[str], test_fraction: float, seed: int) -> set[int]:
    """The positions of the seeded test split: the n_test_rows(...) keys first in sha256(seed, key) order.

    Deterministic across machines and Python versions; a row's place in the order depends only
    on its own key, so appending rows moves few others.
    """
    order = sorted(range(len(keys)), key=lambda i: (hashlib.sha256(f"{seed}\0{keys[i]}".encode()).digest(), i))
    return set(order[: n_test_rows(len(keys), test_fraction)])


def full_row(base: str, split: str, question: str, answer_type: str, target: str, images: list[dict], choices: list[dict] | None, meta: dict, *, group: str | None = None, relation: str = "FULL") -> dict:
    """One record (docs/data.md) in the field order every converter writes; view_id is the relation in lower case."""
    row = {
        "base_id": base,
        "group_id": base if group is None else group,
        "view_id": relation.lower() if relation in RELATIONS else relation,
        "split": split,
        "relation": relation,
        "question": question,
        "answer_type": answer_type,
        "target": "" if relation == "MISSING" else target,
        "images": images,
        "evidence": [],
    }
    if choices is not None:
        row["choices"] = choices
    row["meta"] = meta
    return row


Origin = dict[tuple[str, int | None], tuple[str, int | None]]


def build_validated(src: str | Path, out: Path, write: Callable[[Path], Origin]) -> None:
    """Build a dataset in a temp folder next to `out`, validate it, then rename it to `out`.

    `write(tmp)` writes rows, images and the manifest and returns where each records line and
    image came from: {(file, line): (source file, source line)}; validation problems are
    reported at those source places (the temp folder is deleted), identical ones grouped. On any
    error nothing is left behind. Call check_out_dir first.
    """
    from harness.data.records import group_problems
    from harness.data.validate import validate_dataset

    tmp = new_temp_dir(out)
    try:
        origin = write(tmp)
        try:
            validate_dataset(tmp, memoize=False, group=False)
        except DataContractError as e:
            problems = [DataProblem(*origin[(p.file, p.line)], p.field, p.why, p.fix) if (p.file, p.line) in origin else p for p in e.problems]
            raise DataContractError(str(src), group_problems(problems)) from None
        publish_dir(tmp, out, replace=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _splits(ds: Any, split_column: str | None) -> list[tuple[str | None, Any]]:
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        return list(ds.items()) if split_column is None else [(None, d) for d in ds.values()]
    return [(None, ds)]


def convert_hf(
    src: str | Path,
    out: str | Path,
    *,
    image_column: str | None = "image",
    question_column: str = "question",
    answer_column: str = "answer",
    answer_type: str = "word",
    split_column: str | None = None,
    choices_column: str | None = None,
    relation_column: str | None = None,
    base_column: str | None = None,
    group_column: str | None = None,
    default_split: str = "train",
    test_fraction: float | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Convert the save_to_disk folder `src` into a validated dataset at `out`; returns `out`.

    test_fraction: when the rows carry no split (no split_column, a plain Dataset), put this
    share of them in `test` by the seeded split of seeded_test_rows (seed); None: all in default_split.
    """
    import datasets  # heavy (pyarrow, and torch when installed): only here

    src, out = Path(src), Path(out)
    if answer_type not in ANSWER_TYPES:
        raise ConfigError([Problem("--answer-type", answer_type, "unknown answer type", f"use one of {', '.join(ANSWER_TYPES)}")])
    check_out_dir(out, force=force)
    try:
        ds = datasets.load_from_disk(str(src))
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError([Problem("SRC", str(src), f"not a datasets folder: {e}", "pass a folder written by Dataset.save_to_disk or DatasetDict.save_to_disk")]) from None
    parts = _splits(ds, split_column)
    wanted = {"--image-column": image_column, "--question-column": question_column, "--answer-column": answer_column, "--split-column": split_column, "--choices-column": choices_column, "--relation-column": relation_column, "--base-column": base_column, "--group-column": group_column}
    columns = set(parts[0][1].column_names)
    missing = [Problem(flag, col, "no such column", f"pick one of {sorted(columns)}") for flag, col in wanted.items() if col is not None and col not in columns]
    if missing:
        raise ConfigError(missing)

    def write(tmp: Path) -> Origin:
        return _write(tmp, src, parts, image_column, question_column, answer_column, answer_type, split_column, choices_column, relation_column, base_column, group_column, default_split, test_fraction, seed)

    build_validated(src, out, write)
    return out


def _write(tmp: Path, src: Path, parts, image_column, question_column, answer_column, answer_type, split_column, choices_column, relation_column, base_column, group_column, default_split, test_fraction, seed) -> Origin:
    """Write rows and images; returns {(records file or image, line): ("SRC split NAME row i", None)} for error messages."""
    import datasets

    writer = DatasetWriter(tmp)
    origin: Origin = {}
    lines: dict[str, int] = {}
    bad: dict[str, str] = {}  # split names that cannot be file names -> first source row
    unreadable: list[DataProblem] = []
    n = 0
    for name, part in parts:
        if image_column is not None and isinstance(part.features.get(image_column), datasets.Image):
            part = part.cast_column(image_column, datasets.Image(decode=False))  # keep the stored bytes
        seeded: set[int] | None = None
        if test_fraction is not None and split_column is None and name is None:
            keys = [str(b) for b in part[base_column]] if base_column else [f"row-{i:06d}" for i in range(len(part))]
            seeded = seeded_test_rows(keys, test_fraction, seed)
        for i, rec in enumerate(part):
            where = f"{src} split {name or '-'} row {i}"
            if seeded is not None:
                split = "test" if i in seeded else "train"
            else:
                split = str(rec[split_column]) if split_column else (name or default_split)
            if not SPLIT_RE.fullmatch(split):
                bad.setdefault(split, where)
                continue
            relation = str(rec[relation_column]).upper() if relation_column else "FULL"
            base = str(rec[base_column]) if base_column else f"{name or 'row'}-{i:06d}"
            cells = rec[image_column] if image_column is not None else None
            cells = [] if cells is None else cells if isinstance(cells, list) else [cells]
            images = []
            for k, cell in enumerate(cells):
                try:
                    data, ext = _image_bytes(cell, src)
                except (OSError, ValueError) as e:  # a missing file, bytes PIL cannot identify, an odd cell
                    unreadable.append(DataProblem(where, None, image_column, f"image cannot be read: {type(e).__name__}: {e}", "fix or replace that row's image"))
                    continue
                images.append(writer.add_image(f"{IMAGES_DIR}/{n:07d}-{k}.{ext}", data))
                origin[(images[-1]["path"], None)] = (where, None)
            choices = choices_of(rec[choices_column]) if choices_column else None
            target = target_of(rec[answer_column], answer_type, choices)
            row = full_row(base, split, str(rec[question_column]), answer_type, target, images, choices, {"source_split": name, "source_index": i}, group=str(rec[group_column]) if group_column else None, relation=relation)
            writer.add_row(row)
            lines[split] = lines.get(split, 0) + 1
            origin[(records_path(split), lines[split])] = (where, None)
            n += 1
    if bad or unreadable:
        from harness.data.records import group_problems

        splits = [DataProblem(where, None, "split", f"split name {s!r} is not lower-case letters, digits and _", "rename the splits (e.g. train, val, test) or pass another --split-column") for s, where in bad.items()]
        raise DataContractError(str(src), group_problems(splits + unreadable))
    writer.finish(kind="converted", source={"format": "hf_save_to_disk", "src": str(src.resolve()), "columns": {"image": image_column, "question": question_column, "answer": answer_column, "split": split_column, "choices": choices_column, "relation": relation_column}, **({"test_fraction": test_fraction, "seed": seed} if test_fraction is not None else {})})
    return origin

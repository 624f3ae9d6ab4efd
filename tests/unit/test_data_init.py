"""`python -m harness.data init DIR --from SRC`: a complete dataset from a table plus images, or a datasets folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from harness.rewards.answers import ANSWER_TYPES
from harness.data.convert import n_test_rows, seeded_test_rows
from harness.data.init import init_dataset
from harness.data.manifest import read_manifest
from harness.data.records import load_split
from harness.data.validate import validate_dataset
from harness.errors import ConfigError, DataContractError

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}


def png(path: Path, color: tuple[int, int, int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)
    return path.name


def csv_source(root: Path, n: int = 10, header: str = "image,question,answer", rows: list[str] | None = None) -> Path:
    """root/table.csv with n rows over root/images/<i>.png (8x8, one colour each); returns the table."""
    names = list(COLORS)
    if rows is None:
        rows = []
        for i in range(n):
            # a shade per image: no test image is a byte copy of a training one (validation refuses that)
            png(root / "images" / f"{i}.png", tuple(min(255, c + i) for c in COLORS[names[i % 4]]))
            rows.append(f"images/{i}.png,What color is it?,{names[i % 4]}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return root / "table.csv"


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env={**os.environ, "XDG_CACHE_HOME": str(cache)})


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# --- tables


def test_init_from_csv(tmp_path):
    table = csv_source(tmp_path / "src", n=10)
    png(tmp_path / "src" / "more" / "x.png", (1, 2, 3))  # a nested image keeps its folder
    with open(table, "a") as fh:
        fh.write('more/x.png,"Which one, then?",Red\n')
    res = init_dataset(tmp_path / "ds", table)
    assert (res.source, res.splits, res.images, res.how_split) == ("csv", {"train": 9, "test": 2}, 11, "seeded by row: --test-fraction 0.2, --seed 0")
    report = validate_dataset(res.out, memoize=False)
    assert (report.rows, report.images, set(report.splits)) == (11, 11, {"train", "test"})
    rows = load_split(res.out, "train") + load_split(res.out, "test")
    assert {r["relation"] for r in rows} == {"FULL"} and {r["view_id"] for r in rows} == {"full"}
    assert all(r["group_id"] == r["base_id"] and r["base_id"] == f"row-{r['meta']['source_row']:06d}" for r in rows)
    last = next(r for r in rows if r["meta"]["source_row"] == 10)
    assert (last["question"], last["target"], last["images"][0]["path"]) == ("Which one, then?", "Red", "images/more/x.png")
    assert sorted(p.relative_to(res.out / "images").as_posix() for p in (res.out / "images").rglob("*.png")) == sorted([f"{i}.png" for i in range(10)] + ["more/x.png"])
    assert (res.out / "images" / "3.png").read_bytes() == (tmp_path / "src" / "images" / "3.png").read_bytes()
    m, _ = read_manifest(res.out)
    assert m["kind"] == "converted" and m["source"]["format"] == "csv" and m["source"]["seed"] == 0
    assert listing(tmp_path) == ["ds", "src"]  # no temp folder left


def test_init_from_a_jsonl_folder_with_ids_splits_and_choices(tmp_path):
    src = tmp_path / "src"
    lines = []
    for i in range(6):
        png(src / f"p{i}.png", (i, i, i))
        lines.append({"img": f"p{i}.png", "q": "Which pet?", "a": i % 2, "options": ["cat", "dog"], "id": f"item{i}", "part": "test" if i < 2 else "train"})
    src.mkdir(exist_ok=True)
    (src / "rows.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = init_dataset(tmp_path / "ds", src, image_column="img", question_column="q", answer_column="a", answer_type="choice", choices_column="options", id_column="id", split_column="part")
    assert (res.source, res.splits, res.how_split) == ("jsonl", {"test": 2, "train": 4}, "from column 'part'")
    test = load_split(res.out, "test")
    assert [(r["base_id"], r["target"], r["images"][0]["path"]) for r in test] == [("item0", "A", "images/p0.png"), ("item1", "B", "images/p1.png")]
    assert test[0]["choices"] == [{"key": "A", "text": "cat"}, {"key": "B", "text": "dog"}]


def test_csv_choices_cells_and_a_text_only_table(tmp_path):
    table = csv_source(tmp_path / "src", header="question,answer,options", rows=['Pet?,dog,cat|dog', 'Pet?,A,"[""cat"", ""dog""]"', "Pet?,cat,cat | dog"])
    res = init_dataset(tmp_path / "ds", table, image_column=None, answer_type="choice", choices_column="options", test_fraction=0.3)
    rows = load_split(res.out, "train") + load_split(res.out, "test")
    assert sorted((r["meta"]["source_row"], r["target"]) for r in rows) == [(0, "B"), (1, "A"), (2, "A")]
    assert all(r["images"] == [] for r in rows) and res.images == 0


def test_seeded_split_is_deterministic(tmp_path):
    keys = [f"row-{i:06d}" for i in range(40)]
    assert seeded_test_rows(keys, 0.2, 0) == seeded_test_rows(keys, 0.2, 0) and len(seeded_test_rows(keys, 0.2, 0)) == 8
    assert seeded_test_rows(keys, 0.2, 0) != seeded_test_rows(keys, 0.2, 1)
    assert [n_test_rows(n, f) for n, f in ((40, 0.2), (10, 0.25), (3, 0.1), (2, 0.9), (5, 0.5))] == [8, 3, 1, 1, 3]
    table = csv_source(tmp_path / "src", n=12)
    splits = []
    for name, seed in (("a", 0), ("b", 0), ("c", 5)):
        out = init_dataset(tmp_path / name, table, seed=seed, test_fraction=0.25).out
        splits.append(sorted(r["meta"]["source_row"] for r in load_split(out, "test")))
    assert splits[0] == splits[1] and splits[0] != splits[2] and len(splits[0]) == 3
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()


# --- a datasets save_to_disk folder


def test_init_from_save_to_disk(tmp_path):
    import datasets

    src = tmp_path / "hf"
    datasets.Dataset.from_dict({"image": [Image.new("RGB", (8, 8), (i, 0, 0)) for i in range(5)], "question": ["How many?"] * 5, "answer": [1, 2, 3, 4, 5], "uid": [f"u{i}" for i in range(5)]}).save_to_disk(str(src))
    res = init_dataset(tmp_path / "ds", src, answer_type="number", id_column="uid", test_fraction=0.2, seed=3)
    assert (res.source, res.splits, res.images) == ("hf", {"train": 4, "test": 1}, 5)
    (row,) = load_split(res.out, "test")
    assert row["base_id"].startswith("u") and row["target"] == str(int(row["base_id"][1:]) + 1)
    with pytest.raises(ConfigError) as e:
        init_dataset(tmp_path / "ds2", src, id_column="nope")
    assert [(p.field, p.value) for p in e.value.problems] == [("--id-column", "nope")] and "uid" in e.value.problems[0].fix

    dd = tmp_path / "hfdict"
    part = {"image": [Image.new("RGB", (8, 8), (9, 9, 9))], "question": ["Color?"], "answer": ["grey"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(part), "test": datasets.Dataset.from_dict(part)}).save_to_disk(str(dd))
    res = init_dataset(tmp_path / "ds3", dd)
    assert (res.splits, res.how_split) == ({"train": 1, "test": 1}, "the DatasetDict's splits")


# --- refusals: named, before anything is copied, nothing left behind


def test_missing_column_names_it_and_the_columns(tmp_path):
    table = csv_source(tmp_path / "src", n=3)
    with pytest.raises(ConfigError) as e:
        init_dataset(tmp_path / "ds", table, answer_column="label")
    (p,) = e.value.problems
    assert (p.field, p.value) == ("--answer-column", "label") and "no such column" in p.why and "['image', 'question', 'answer']" in p.fix
    assert listing(tmp_path) == ["src"]


def test_missing_image_names_the_row(tmp_path):
    table = csv_source(tmp_path / "src", n=4)
    (tmp_path / "src" / "images" / "2.png").unlink()
    with pytest.raises(DataContractError) as e:
        init_dataset(tmp_path / "ds", table)
    (p,) = e.value.problems
    assert (p.file, p.line, p.field) == (str(table), 4, "image") and "'images/2.png'" in p.why and "not found" in p.why
    assert listing(tmp_path) == ["src"]


def test_row_problems_name_table_lines_and_are_grouped(tmp_path):
    rows = [f"images/{i}.png,What color?,unknown" for i in range(5)] + ["images/0.png,,red", "images/1.png,What, really?,red"]
    for i in range(5):
        png(tmp_path / "src" / "images" / f"{i}.png", (i, 0, 0))
    table = csv_source(tmp_path / "src", rows=rows)
    with pytest.raises(DataContractError) as e:
        init_dataset(tmp_path / "ds", table)
    got = [(p.line, p.field) for p in e.value.problems]
    assert got == [(None, "answer"), (7, "question"), (8, None)], e.value.problems
    assert "in 5 rows" in e.value.problems[0].why and "abstention" in e.value.problems[0].why
    assert "unquoted comma" in e.value.problems[2].why
    assert listing(tmp_path) == ["src"]


def test_two_files_for_one_name_are_refused(tmp_path):
    png(tmp_path / "src" / "a.png", (1, 1, 1))
    png(tmp_path / "src" / "images" / "a.png", (2, 2, 2))  # both would be images/a.png
    table = csv_source(tmp_path / "src", rows=["a.png,Q?,red", "images/a.png,Q?,blue"])
    with pytest.raises(DataContractError, match="would both be copied to images/a.png"):
        init_dataset(tmp_path / "ds", table)


def test_out_dir_not_empty_needs_force(tmp_path):
    table = csv_source(tmp_path / "src", n=3)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as e:
        init_dataset(tmp_path / "ds", table)
    assert e.value.problems[0].field == "DIR" and "--force" in e.value.problems[0].fix
    assert listing(tmp_path / "ds") == ["notes.txt"]
    init_dataset(tmp_path / "ds", table, force=True)
    assert "notes.txt" not in listing(tmp_path / "ds") and listing(tmp_path) == ["ds", "src"]


def test_unwritable_out_dir_is_a_refusal(tmp_path):
    table = csv_source(tmp_path / "src", n=3)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError) as e:
        init_dataset(tmp_path / "afile" / "ds", table)
    (p,) = e.value.problems
    assert p.field == "DIR" and "is a file, not a folder" in p.why
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="cannot be written"):
            init_dataset(locked / "ds", table)
    assert sorted(listing(tmp_path)) == sorted(["afile", "src"] + (["locked"] if os.geteuid() != 0 else []))


def test_bad_sources_are_refusals(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        init_dataset(tmp_path / "ds", tmp_path / "nothere.csv")
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.csv").write_text("question,answer\nQ?,a\n")
    (tmp_path / "two" / "b.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"holds 2 tables \(a.csv, b.jsonl\)"):
        init_dataset(tmp_path / "ds", tmp_path / "two")
    with pytest.raises(ConfigError, match="--test-fraction"):
        init_dataset(tmp_path / "ds", tmp_path / "two" / "a.csv", test_fraction=1.0)
    with pytest.raises(ConfigError, match="replace it"):
        init_dataset(tmp_path / "two", tmp_path / "two" / "a.csv", force=True)  # DIR is the source's folder
    assert listing(tmp_path) == ["two"] and listing(tmp_path / "two") == ["a.csv", "b.jsonl"]


# --- the command


def test_init_cli_prints_what_it_wrote(tmp_path):
    csv_source(tmp_path / "src", n=10)
    res = cli("-X", "importtime", "-m", "harness.data", "init", str(tmp_path / "ds"), "--from", str(tmp_path / "src"), cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0] == f"wrote {tmp_path / 'ds'} from {tmp_path / 'src' / 'table.csv'} (csv): 10 rows, 10 images"
    assert out[1] == "  splits: train 8, test 2 (seeded by row: --test-fraction 0.2, --seed 0)"
    sha = read_manifest(tmp_path / "ds")[0]["sha256"]
    assert out[2] == f"  data sha256 {sha[:12]}"
    assert out[3].startswith(f"next: python -m harness data=jsonl data.path={tmp_path / 'ds'}")
    mods = {line.split("|")[-1].strip().split(".")[0] for line in res.stderr.splitlines() if "|" in line}
    assert not mods & {"torch", "transformers", "trl", "datasets"}
    res = cli("-m", "harness.data", "validate", str(tmp_path / "ds"), cache=tmp_path / "c")
    assert res.returncode == 0 and res.stdout.startswith("ok: 10 rows") and "(memoized)" in res.stdout


def test_init_cli_refusal_and_answer_types(tmp_path):
    table = csv_source(tmp_path / "src", n=3)
    res = cli("-m", "harness.data", "init", str(tmp_path / "ds"), "--from", str(table), "--question-column", "prompt", cache=tmp_path / "c")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--question-column = 'prompt'" in res.stderr
    if "text" not in ANSWER_TYPES:
        pytest.skip("the text answer type is not in harness.rewards.answers yet")
    res = cli("-m", "harness.data", "init", str(tmp_path / "ds"), "--from", str(table), "--answer-type", "text", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert {r["answer_type"] for r in load_split(tmp_path / "ds", "train")} == {"text"}

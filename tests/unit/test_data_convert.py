"""`python -m harness.data convert-hf`: a datasets save_to_disk folder into the harness schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import datasets  # noqa: E402  (a broken install must fail, not skip)

from harness.data.convert import convert_hf  # noqa: E402
from harness.data.records import load_split  # noqa: E402
from harness.data.validate import validate_dataset  # noqa: E402
from harness.errors import ConfigError, DataContractError  # noqa: E402


def img(color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (32, 32), color)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """Six rows, a split column, a relation column with one MISSING view, a choices column."""
    path = tmp_path_factory.mktemp("hf") / "src"
    datasets.Dataset.from_dict(
        {
            "image": [img((255, 0, 0)), img((0, 0, 255)), img((0, 255, 0)), img((200, 200, 200)), img((0, 0, 0)), img((255, 255, 0))],
            "question": ["What color?", "What color?", "Which is it?", "What color?", "How many?", "Which is it?"],
            "answer": ["Red", "blue", "B", "", "3", "yellow"],
            "split": ["train", "train", "test", "train", "test", "val"],
            "relation": ["FULL", "SUBSTITUTE", "FULL", "MISSING", "FULL", "FULL"],
            "qid": ["q0", "q0", "q1", "q0", "q2", "q3"],
            "item": ["i0", "i0", "i1", "i0", "i2", "i3"],
        }
    ).save_to_disk(str(path))
    return path


def test_convert_word_dataset(src, tmp_path):
    out = convert_hf(src, tmp_path / "out", question_column="question", answer_column="answer", split_column="split", relation_column="relation", base_column="item", group_column="qid")
    report = validate_dataset(out, memoize=False)
    assert report.rows == 6 and report.images == 6
    assert set(report.splits) == {"train", "test", "val"}
    train = load_split(out, "train")
    assert [r["relation"] for r in train] == ["FULL", "SUBSTITUTE", "MISSING"]
    assert [r["target"] for r in train] == ["Red", "blue", ""]
    assert {r["group_id"] for r in train} == {"q0"} and train[0]["view_id"] == "full"
    with Image.open(out / train[0]["images"][0]["path"]) as im:
        assert im.getpixel((0, 0)) == (255, 0, 0)


def test_every_row_is_full_without_relation_column(tmp_path):
    src = tmp_path / "plain"
    datasets.Dataset.from_dict({"image": [img((1, 2, 3)), img((4, 5, 6))], "question": ["A?", "B?"], "answer": [3, 4.0]}).save_to_disk(str(src))
    out = convert_hf(src, tmp_path / "out", answer_type="number")
    rows = load_split(out, "train")
    assert [(r["relation"], r["target"], r["evidence"]) for r in rows] == [("FULL", "3", []), ("FULL", "4", [])]


def test_choices_and_dataset_dict(tmp_path):
    src = tmp_path / "mc"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"image": [img((9, 9, 9))], "question": ["Pet?"], "answer": [1], "options": [["cat", "dog"]]}),
            "test": datasets.Dataset.from_dict({"image": [img((8, 8, 8))], "question": ["Pet?"], "answer": ["cat"], "options": [["cat", "dog"]]}),
        }
    ).save_to_disk(str(src))
    out = convert_hf(src, tmp_path / "out", answer_type="choice", choices_column="options")
    train, test = load_split(out, "train"), load_split(out, "test")
    assert train[0]["choices"] == [{"key": "A", "text": "cat"}, {"key": "B", "text": "dog"}]
    assert (train[0]["target"], test[0]["target"]) == ("B", "A")


def test_unrepresentable_rows_name_the_source_and_leave_nothing(tmp_path):
    src = tmp_path / "bad"
    datasets.Dataset.from_dict({"image": [img((1, 1, 1)), img((2, 2, 2))], "question": ["Q?", "Q?"], "answer": ["unknown", "<b>"]}).save_to_disk(str(src))
    with pytest.raises(DataContractError) as e:
        convert_hf(src, tmp_path / "out")
    text = str(e.value)
    assert "row 0" in text and "abstention" in text and "row 1" in text
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["bad"]


def test_unreadable_image_names_the_source_row(tmp_path):
    src = tmp_path / "broken"
    datasets.Dataset.from_dict({"image": [b"not an image", b"\x89PNG broken"], "question": ["Q?", "Q?"], "answer": ["red", "blue"]}).save_to_disk(str(src))
    with pytest.raises(DataContractError) as e:
        convert_hf(src, tmp_path / "out")
    assert [(p.file, p.field) for p in e.value.problems] == [(f"{src} split - row 0", "image"), (f"{src} split - row 1", "image")]
    assert "cannot be read" in str(e.value)
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["broken"]


def test_seeded_split_of_a_plain_dataset(tmp_path):
    src = tmp_path / "plain"
    datasets.Dataset.from_dict({"image": [img((i, 0, 0)) for i in range(10)], "question": ["Q?"] * 10, "answer": ["red"] * 10}).save_to_disk(str(src))
    tests = []
    for name in ("a", "b"):
        out = convert_hf(src, tmp_path / name, test_fraction=0.3, seed=7)
        tests.append([r["base_id"] for r in load_split(out, "test")])
        assert len(load_split(out, "train")) == 7
    assert tests[0] == tests[1] and len(tests[0]) == 3


def test_unknown_column_lists_the_columns(src, tmp_path):
    with pytest.raises(ConfigError, match="no such column") as e:
        convert_hf(src, tmp_path / "out", question_column="prompt")
    assert "qid" in str(e.value)


def test_convert_cli(src, tmp_path):
    args = ["--out", str(tmp_path / "out"), "--split-column", "split", "--relation-column", "relation", "--base-column", "item", "--group-column", "qid"]
    res = subprocess.run([sys.executable, "-m", "harness.data", "convert-hf", str(src), *args], capture_output=True, text=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert res.returncode == 0, res.stderr
    assert "ok: 6 rows" in res.stdout
    res = subprocess.run([sys.executable, "-m", "harness.data", "convert-hf", str(src), *args], capture_output=True, text=True)
    assert res.returncode == 2 and "--force" in res.stderr and "Traceback" not in res.stderr

"""Split overlap by content (issue 46): a held-out view with evidence whose image is a byte copy of a training image
is refused by a run and by `python -m harness.data validate` unless accepted knowingly (then said as a warning);
MISSING views' shared blank image and copies inside one split are fine; the memo never hides it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from harness.data import validate as V
from harness.data.manifest import seal_dataset
from harness.data.synth import write_synthetic
from harness.data.validate import validate_dataset
from harness.errors import DataContractError

STRICT = {"allow_split_overlap": False}  # what a run and `validate` pass unless the user accepts the overlap


def png(root: Path, name: str, colour: tuple[int, int, int]) -> str:
    Image.new("RGB", (8, 8), colour).save(root / "images" / name)
    return f"images/{name}"


def row(base: str, split: str, path: str, *, relation: str = "FULL", view: str = "full", **extra) -> dict:
    return {"base_id": base, "group_id": base, "view_id": view, "split": split, "relation": relation,
            "question": "What colour is it?", "images": [{"path": path}], "answer_type": "word",
            "target": "" if relation == "MISSING" else "red", "evidence": [], **extra}


def dataset(root: Path, rows: dict[str, list[dict]]) -> Path:
    """records/<split>.jsonl from `rows`, sealed (`python -m harness.data manifest` fills the digests)."""
    (root / "records").mkdir(parents=True, exist_ok=True)
    for split, rs in rows.items():
        (root / "records" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    seal_dataset(root)
    return root


def images_dir(root: Path) -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture
def leaky(tmp_path) -> Path:
    """6 distinct training images; test rows 1, 2 and 4 are byte copies of training images under their own names
    and base_ids (the counting set of issue 46), test row 3 is its own image."""
    root = images_dir(tmp_path / "leaky")
    train = [row(f"b{i}", "train", png(root, f"{i}.png", (40 * i, 0, 0))) for i in range(6)]
    test = []
    for j, src in enumerate((2, None, 5, 0)):
        name = f"t{j}.png"
        if src is None:
            png(root, name, (0, 0, 250))
        else:
            shutil.copyfile(root / "images" / f"{src}.png", root / "images" / name)
        test.append(row(f"t{j}", "test", f"images/{name}"))
    return dataset(root, {"train": train, "test": test})


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness.data", *args], capture_output=True, text=True, env=env)


def test_a_held_out_copy_of_a_training_image_is_refused_with_count_and_examples(leaky, tmp_path):
    with pytest.raises(DataContractError) as e:
        validate_dataset(leaky, memoize=False, **STRICT)
    (p,) = e.value.problems
    assert (p.file, p.line, p.field) == ("records/test.jsonl", 1, "images[0]")
    assert p.why.startswith("3 held-out rows with evidence (test 3) have an image byte-equal to an image of split 'train'")
    assert p.why.endswith("records/test.jsonl:1 images[0] images/t0.png = records/train.jsonl:3 images/2.png, "
                          "records/test.jsonl:3 images[0] images/t2.png = records/train.jsonl:6 images/5.png, "
                          "records/test.jsonl:4 images[0] images/t3.png = records/train.jsonl:1 images/0.png")
    assert "data.allow_split_overlap=true" in p.fix and "--allow-split-overlap" in p.fix
    res = cli("validate", str(leaky), cache=tmp_path / "c")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "split overlap" in res.stderr, res.stderr


def test_accepted_knowingly_it_validates_and_still_says_it(leaky, tmp_path):
    report = validate_dataset(leaky, memoize=False, allow_split_overlap=True)
    assert report.overlap["rows"] == 3 and report.overlap["splits"] == {"test": 3}
    assert "WARNING: split overlap: 3 held-out rows" in report.summary()
    (line,) = report.warnings()
    assert "records/test.jsonl:1 images[0] images/t0.png = records/train.jsonl:3 images/2.png" in line
    res = cli("validate", str(leaky), "--allow-split-overlap", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 1 and "WARNING: split overlap: 3 held-out rows" in res.stdout
    assert res.stderr.startswith("warning: split overlap: 3 held-out rows") and "(accepted: --allow-split-overlap)" in res.stderr


def test_a_builder_builds_it_and_says_what_a_run_will_do(leaky, tmp_path):
    """init, convert-hf, manifest and synth build a dataset with an overlap (a refused build would leave nothing to
    fix or accept) and say so, with the fix."""
    res = cli("manifest", str(leaky), cache=tmp_path / "c")
    assert res.returncode == 0 and "WARNING: split overlap: 3 held-out rows" in res.stdout, res.stderr
    assert res.stderr.startswith("warning: split overlap: 3 held-out rows") and "a run and `validate` refuse" in res.stderr
    assert "data.allow_split_overlap=true" in res.stderr


def test_every_image_of_a_held_out_row_is_compared(tmp_path):
    """Not only the first image: a copy in images[1] or in a FULL row's control_images leaks too."""
    root = images_dir(tmp_path / "ds")
    train = [row("b0", "train", png(root, "0.png", (1, 0, 0))), row("b1", "train", png(root, "1.png", (2, 0, 0)))]
    shutil.copyfile(root / "images" / "1.png", root / "images" / "copy.png")
    own = png(root, "own.png", (0, 9, 0))
    test = [row("t0", "test", own, images=[{"path": own}, {"path": "images/copy.png"}])]
    dataset(root, {"train": train, "test": test})
    with pytest.raises(DataContractError, match=r"records/test.jsonl:1 images\[1\] images/copy.png = records/train.jsonl:2"):
        validate_dataset(root, memoize=False, **STRICT)


def test_missing_views_share_one_blank_image_across_splits(tmp_path):
    """MISSING views (and a FULL row's missing_images link to them) show the blank image by design: many share one."""
    root = images_dir(tmp_path / "ds")
    blank = png(root, "blank.png", (128, 128, 128))
    shutil.copyfile(root / "images" / "blank.png", root / "images" / "blank2.png")  # a byte copy, another name
    rows: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for i, (split, path) in enumerate((("train", blank), ("val", "images/blank2.png"), ("test", blank))):
        rows[split] += [row(f"b{i}", split, png(root, f"{i}.png", (9 * i, 50, 0)), missing_images=[{"path": path}]),
                        row(f"b{i}", split, path, relation="MISSING", view="missing")]
    dataset(root, rows)
    report = validate_dataset(root, memoize=False, **STRICT)
    assert report.overlap is None and report.rows == 6 and "WARNING" not in report.summary()


def test_copies_inside_one_split_are_fine(tmp_path):
    root = images_dir(tmp_path / "ds")
    a, b = png(root, "a.png", (1, 2, 3)), png(root, "b.png", (3, 2, 1))
    shutil.copyfile(root / "images" / "b.png", root / "images" / "b2.png")
    rows = {"train": [row("b0", "train", a), row("b1", "train", a)],  # one file twice
            "test": [row("t0", "test", b), row("t1", "test", "images/b2.png")]}  # byte copies under two names
    dataset(root, rows)
    assert validate_dataset(root, memoize=False, **STRICT).overlap is None


def test_the_synthetic_set_has_no_overlap_though_its_blanks_are_shared(tmp_path):
    root = write_synthetic(tmp_path / "syn", n_base=24)
    m = json.loads((root / "manifest.json").read_text())
    by_split: dict[str, set[str]] = {}
    for split in ("train", "val", "test"):
        for r in map(json.loads, (root / "records" / f"{split}.jsonl").read_text().splitlines()):
            if r["relation"] == "MISSING":
                by_split.setdefault(split, set()).add(m["images"][r["images"][0]["path"]])
    assert by_split["train"] & (by_split["val"] | by_split["test"])  # what a naive digest comparison would refuse
    for train_split in ("train", "val", "test"):
        assert validate_dataset(root, memoize=False, train_split=train_split, **STRICT).overlap is None


@pytest.mark.parametrize("order", [(True, False), (False, True)])
def test_the_memo_never_hides_it(leaky, tmp_path, monkeypatch, order):
    """A memo written with the flag (or by a refusal) keeps the overlap as data: each call applies its own flag,
    and the second call is a memo hit (no image read again)."""
    checked = []
    check_image = V._check_image
    monkeypatch.setattr(V, "_check_image", lambda *a: checked.append(a[2]) or check_image(*a))
    for allow in (*order, order[0]):
        n = len(checked)
        if allow:
            report = validate_dataset(leaky, cache_dir=tmp_path / "c", allow_split_overlap=True)
            assert report.overlap["rows"] == 3 and report.memoized == (n > 0)
        else:
            with pytest.raises(DataContractError, match="3 held-out rows"):
                validate_dataset(leaky, cache_dir=tmp_path / "c", **STRICT)
        assert len(checked) == (10 if n == 0 else n)  # the first call checks the 10 images, the others none


def test_a_memo_that_cannot_say_is_not_a_hit(leaky, tmp_path):
    """A memo without the overlap (as written before this check existed) is no proof of its absence."""
    validate_dataset(leaky, cache_dir=tmp_path / "c")
    (memo,) = (tmp_path / "c").glob("*.json")
    memo.write_text(json.dumps({k: v for k, v in json.loads(memo.read_text()).items() if k != "overlap"}))
    with pytest.raises(DataContractError, match="split overlap"):
        validate_dataset(leaky, cache_dir=tmp_path / "c", **STRICT)


def test_the_training_split_is_the_runs(leaky, tmp_path):
    """Compared with data.train_split: trained on `test`, the copies sit in the held-out `train` (and the memo of a
    validation against `train` is not this one's)."""
    validate_dataset(leaky, cache_dir=tmp_path / "c", allow_split_overlap=True)
    with pytest.raises(DataContractError) as e:
        validate_dataset(leaky, cache_dir=tmp_path / "c", train_split="test", **STRICT)
    assert "3 held-out rows with evidence (train 3) have an image byte-equal to an image of split 'test'" in str(e.value)


def test_a_run_refuses_it_unless_data_allow_split_overlap(plan_of, leaky, tmp_path, caplog):
    """The data stage of a run (and of `python -m harness.eval`) passes the plan's flag; the flag is not semantic, so
    it moves neither the semantic hash nor the run name."""
    from harness.run.stages.data import prepare

    plan = plan_of("data=jsonl", f"data.path={leaky}", "debug=tiny")
    with pytest.raises(DataContractError, match="data.allow_split_overlap=true"):
        prepare(plan.cfg, {}, run_dir=str(tmp_path / "run"), fix="-")
    accepted = plan_of("data=jsonl", f"data.path={leaky}", "debug=tiny", "data.allow_split_overlap=true")
    with caplog.at_level(logging.WARNING, logger="harness"):
        data = prepare(accepted.cfg, {}, run_dir=str(tmp_path / "run"), fix="-")
    assert "WARNING: split overlap: 3 held-out rows" in data.summary
    assert any("split overlap: 3 held-out rows" in r.getMessage() and "accepted" in r.getMessage() for r in caplog.records)
    assert (accepted.run_name, accepted.identity["semantic_sha256"]) == (plan.run_name, plan.identity["semantic_sha256"])
    assert "data.allow_split_overlap" in plan.identity["non_semantic_fields"]

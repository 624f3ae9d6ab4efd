"""`python -m harness.data validate`: refusals with file/line/field/fix, torch-free, memoized."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.data import validate as V
from harness.data.manifest import data_identity, manifest_bytes, manifest_digest, seal_dataset, sha256_bytes
from harness.data.records import check_row, load_split
from harness.data.synth import encode_png, write_synthetic
from harness.data.validate import validate_dataset
from harness.errors import DataContractError


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("val") / "ds", n_base=24)


@pytest.fixture
def ds(base, tmp_path) -> Path:
    """A private copy to tamper with."""
    return Path(shutil.copytree(base, tmp_path / "ds", symlinks=True))


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)


# --- tampering helpers: edit rows, then re-seal the records digests so only the edit is wrong


def lines_of(root: Path, split: str) -> list[bytes]:
    return (root / "records" / f"{split}.jsonl").read_bytes().split(b"\n")[:-1]


def reseal_records(root: Path) -> None:
    m = json.loads((root / "manifest.json").read_text())
    for rel in m["records"]:
        data = (root / rel).read_bytes()
        m["records"][rel] = {"sha256": sha256_bytes(data), "rows": data.count(b"\n"), "bytes": len(data)}
    m["sha256"] = manifest_digest(m)
    (root / "manifest.json").write_bytes(manifest_bytes(m))


def edit_line(root: Path, split: str, i: int, fn) -> None:
    lines = lines_of(root, split)
    lines[i] = fn(lines[i])
    (root / "records" / f"{split}.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))
    reseal_records(root)


def edit_row(root: Path, split: str, i: int, fn) -> None:
    def apply(raw: bytes) -> bytes:
        row = json.loads(raw)
        fn(row)
        return json.dumps(row).encode()

    edit_line(root, split, i, apply)


def first(root: Path, split: str = "train") -> dict:
    return json.loads(lines_of(root, split)[0])


def tamper_image(root):
    (root / first(root)["images"][0]["path"]).write_bytes(encode_png(__import__("numpy").zeros((56, 56, 3), "uint8")))


def delete_image(root):
    (root / first(root)["images"][0]["path"]).unlink()


def symlink_out(root):
    p = root / first(root)["images"][0]["path"]
    outside = root.parent / "outside.png"
    shutil.move(p, outside)
    p.symlink_to(outside)  # same bytes, same digest: only the escape is wrong


def leak(root):
    other = first(root)["base_id"]
    edit_row(root, "val", 0, lambda r: r.update(base_id=other))


def duplicate(root):
    lines = lines_of(root, "train")
    (root / "records" / "train.jsonl").write_bytes(b"".join(x + b"\n" for x in lines + lines[:1]))
    reseal_records(root)


def unlisted(root):
    shutil.copy(root / "records" / "val.jsonl", root / "records" / "extra.jsonl")


def edit_summary(root):
    m = json.loads((root / "manifest.json").read_text())
    m["summary"]["rows"] += 1  # not part of the digest: validate compares it with the rows
    (root / "manifest.json").write_bytes(manifest_bytes(m))


REFUSALS = [
    # id, tamper, what stderr must say
    ("tampered-image", tamper_image, ["-full.png", "differs from the sha256"]),
    ("path-traversal", lambda r: edit_row(r, "train", 0, lambda x: x["images"][0].update(path="../outside.png")), ["train.jsonl:1", "images[0].path", "'..'"]),
    ("absolute-path", lambda r: edit_row(r, "train", 0, lambda x: x["images"][0].update(path="/etc/hostname")), ["train.jsonl:1", "absolute path"]),
    ("missing-image", delete_image, ["-full.png", "missing or unreadable"]),
    ("symlink-escape", symlink_out, ["outside the dataset root"]),
    ("split-leakage", leak, ["val.jsonl:1", "split leakage"]),
    ("malformed-line", lambda r: edit_line(r, "train", 1, lambda b: b'{"base_id": "x",'), ["train.jsonl:2", "malformed JSON"]),
    ("unknown-relation", lambda r: edit_row(r, "train", 0, lambda x: x.update(relation="PARTIAL")), ["train.jsonl:1", "[relation]", "unknown relation 'PARTIAL'"]),
    ("non-utf8", lambda r: edit_line(r, "test", 2, lambda b: b.replace(b"What", b"Wh\xffat")), ["test.jsonl:3", "not UTF-8"]),
    ("duplicate-view", duplicate, ["duplicate view", "first at records/train.jsonl:1"]),
    ("unlisted-records", unlisted, ["records/extra.jsonl", "not listed in manifest"]),
    ("missing-manifest", lambda r: (r / "manifest.json").unlink(), ["manifest.json is missing"]),
    ("missing-answers", lambda r: edit_row(r, "train", 2, lambda x: x.update(target="red")), ["train.jsonl:3", "[target]", "MISSING view"]),
    ("bad-index", lambda r: edit_row(r, "train", 0, lambda x: x["images"][0].update(index=1)), ["images[0].index", "0..0"]),
    ("summary-edited", edit_summary, ["manifest.json [summary]", "says 97 rows"]),
    ("box-outside", lambda r: edit_row(r, "train", 0, lambda x: x.update(evidence=[[0, 0, 57, 10]])), ["evidence[0]", "beyond the 56x56"]),
]


@pytest.mark.parametrize("tamper, says", [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_validate_refuses(ds, tmp_path, tamper, says):
    tamper(ds)
    res = cli("-m", "harness.data", "validate", str(ds), cache=tmp_path / "cache")
    assert res.returncode == 2, res.stdout
    assert "Traceback" not in res.stderr
    assert "DataContractError" in res.stderr and "fix:" in res.stderr
    for s in says:
        assert s in res.stderr, res.stderr


def test_every_problem_is_reported(ds):
    tamper_image(ds)
    edit_row(ds, "train", 1, lambda x: x.update(relation="PARTIAL"))
    edit_line(ds, "val", 0, lambda b: b"not json")
    with pytest.raises(DataContractError) as e:
        validate_dataset(ds, memoize=False)
    where = {(p.file, p.line) for p in e.value.problems}
    assert {("records/train.jsonl", 2), ("records/val.jsonl", 1)} <= where
    assert any(p.file.endswith("-full.png") and p.field == "sha256" for p in e.value.problems)


def test_validate_ok_is_torch_free(base, tmp_path):
    res = cli("-X", "importtime", "-m", "harness.data", "validate", str(base), cache=tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok: 96 rows") and len(res.stdout.strip().splitlines()) == 1
    mods = {line.split("|")[-1].strip().split(".")[0] for line in res.stderr.splitlines() if "|" in line}
    assert not mods & {"torch", "transformers", "trl", "datasets"}


# --- row rules (table-driven, no disk)

GOOD = {
    "base_id": "b", "group_id": "g", "view_id": "full", "split": "train", "relation": "FULL", "question": "Which?",
    "answer_type": "word", "target": "red", "images": [{"path": "images/a.png", "sha256": "0" * 64}], "evidence": [[0, 0, 4, 4]],
}


@pytest.mark.parametrize(
    "change, field, why",
    [
        ({}, None, None),
        ({"answer_type": "choice", "target": "C", "choices": [{"key": "A", "text": "x"}, {"key": "B", "text": "y"}]}, "target", "choice keys"),
        ({"answer_type": "choice", "target": "A", "choices": [{"key": "A", "text": "x"}, {"key": "a", "text": "y"}]}, "choices[1].key", "duplicate key"),
        ({"answer_type": "choice", "target": "A"}, "choices", "needs choices"),
        ({"answer_type": "number", "target": "many"}, "target", "one number"),
        ({"answer_type": "word", "target": "<answer>red</answer>"}, "target", "well-formed"),
        ({"target": "unknown"}, "target", "abstention"),
        ({"target": ""}, "target", "abstaining is correct only on MISSING"),
        ({"answer_type": "sentence"}, "answer_type", "unknown answer_type"),
        ({"relation": "MISSING", "evidence": [[0, 0, 1, 1]], "target": ""}, "evidence", "evidence was removed"),
        ({"evidence": [[4, 0, 2, 4]]}, "evidence[0]", "0 <= x0 < x1"),
        ({"images": [{"path": "images\\a.png", "sha256": "0" * 64}]}, "images[0].path", "backslash"),
        ({"images": [{"path": "./images/a.png", "sha256": "0" * 64}]}, "images[0].path", "not normalized"),
        ({"images": [{"path": "images/a.png", "sha256": "XYZ"}]}, "images[0].sha256", "sha256"),
        ({"split": "val"}, "split", "file of split 'train'"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"question": ""}, "question", "non-empty"),
        ({"candidates": ["red", "blue"]}, "candidates", "abstention"),
        ({"candidates": ["blue", ""]}, "candidates", "not among the candidates"),
        ({"candidates": ["red", "Red", ""]}, "candidates", "repeat"),
        ({"relation": "CONTROL", "missing_images": []}, "missing_images", "belongs on the FULL view"),
    ],
)
def test_check_row(change, field, why):
    row = {**GOOD, **change}
    problems = check_row(row, file="records/train.jsonl", line=1, split="train")
    if why is None:
        assert problems == []
    else:
        assert any(p.field == field and why in p.why for p in problems), problems


def test_missing_field():
    row = {k: v for k, v in GOOD.items() if k != "target"}
    assert [p.field for p in check_row(row, file="f", line=1, split="train")] == ["target"]


# --- memoization


def test_second_validation_is_memoized(ds, tmp_path, monkeypatch):
    """What was done, not how long it took (a timing on milliseconds flakes): the first validation decodes and
    hashes every image, the memoized second none."""
    checked = []
    check_image = V._check_image
    monkeypatch.setattr(V, "_check_image", lambda guard, base, rel, expected: checked.append(rel)
                        or check_image(guard, base, rel, expected))
    first_ = validate_dataset(ds, cache_dir=tmp_path / "c")
    n_first = len(checked)
    second = validate_dataset(ds, cache_dir=tmp_path / "c")
    assert not first_.memoized and second.memoized
    assert n_first == first_.images > 0 and len(checked) == n_first
    assert (second.sha256, second.rows, second.splits) == (first_.sha256, first_.rows, first_.splits)


@pytest.mark.parametrize("racy_window_ns", [V.RACY_WINDOW_NS, 0])  # re-hash path, and the pure fingerprint path
def test_tamper_after_memoized_success_is_caught(ds, tmp_path, monkeypatch, racy_window_ns):
    monkeypatch.setattr(V, "RACY_WINDOW_NS", racy_window_ns)
    validate_dataset(ds, cache_dir=tmp_path / "c")
    path = ds / first(ds)["images"][0]["path"]
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # same size; then put the old mtime back: only ctime / racy re-hash can tell
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(DataContractError, match="sha256"):
        validate_dataset(ds, cache_dir=tmp_path / "c")


def test_added_records_file_invalidates_the_memo(ds, tmp_path):
    validate_dataset(ds, cache_dir=tmp_path / "c")
    unlisted(ds)
    with pytest.raises(DataContractError, match="not listed"):
        validate_dataset(ds, cache_dir=tmp_path / "c")


def test_unwritable_cache_costs_only_the_memo(ds, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert not validate_dataset(ds, cache_dir=blocker / "sub").memoized
    assert not validate_dataset(ds, cache_dir=blocker / "sub").memoized


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert V.default_cache_dir() == tmp_path / "harness" / "validate"


def test_workers_give_the_same_verdict(ds, tmp_path, monkeypatch):
    monkeypatch.setattr(V, "POOL_MIN_IMAGES", 0)  # use the process pool even for 96 images
    assert validate_dataset(ds, workers=2, memoize=False).rows == 96
    tamper_image(ds)
    with pytest.raises(DataContractError) as e:
        validate_dataset(ds, workers=2, memoize=False)
    assert len(e.value.problems) == 1


# --- identity, loading, sealing


def test_data_identity_reads_the_manifest(base):
    ident = data_identity(base)
    m = json.loads((base / "manifest.json").read_text())
    assert ident["sha256"] == m["sha256"] == manifest_digest(m)
    assert ident["spec_sha256"] == m["spec_sha256"] and ident["rows"] == 96 and ident["kind"] == "synthetic"


def test_data_identity_refuses_an_edited_manifest(ds):
    m = json.loads((ds / "manifest.json").read_text())
    m["images"][next(iter(m["images"]))] = "0" * 64
    (ds / "manifest.json").write_bytes(manifest_bytes(m))
    with pytest.raises(DataContractError, match="edited by hand"):
        data_identity(ds)


def test_load_split_yields_only_that_split(base, ds):
    train = load_split(base, "train")
    assert train and all(r["split"] == "train" for r in train)
    edit_row(ds, "train", 0, lambda r: r.update(split="test"))
    with pytest.raises(DataContractError, match="split 'test' in the file of split 'train'"):
        load_split(ds, "train")
    with pytest.raises(DataContractError, match="no split 'dev'"):
        load_split(base, "dev")


def test_seal_a_hand_made_dataset(ds, tmp_path):
    (ds / "manifest.json").unlink()
    edit = lines_of(ds, "train")
    row = json.loads(edit[0])
    row["images"][0]["sha256"] = "0" * 64  # a digest the user did not compute
    edit[0] = json.dumps(row).encode()
    (ds / "records" / "train.jsonl").write_bytes(b"".join(x + b"\n" for x in edit))
    before = (ds / "records" / "train.jsonl").read_bytes()
    with pytest.raises(DataContractError) as e:  # a wrong digest is refused, not sealed into the manifest
        seal_dataset(ds)
    assert [(p.file, p.line, p.field) for p in e.value.problems] == [("records/train.jsonl", 1, "images[0].sha256")]
    assert "--fill-digests" in e.value.problems[0].fix
    assert not (ds / "manifest.json").exists() and (ds / "records" / "train.jsonl").read_bytes() == before
    seal_dataset(ds, fill_digests=True)
    assert validate_dataset(ds, memoize=False).rows == 96
    res = cli("-m", "harness.data", "identity", str(ds), cache=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["kind"] == "custom"


# --- a dataset made by hand (docs/data.md "Your own dataset in three commands"): one cause, once


def hand_made(root: Path, n: int = 12) -> Path:
    """n rows (train and test) written by hand: 8x8 PNGs, image references without sha256, no manifest."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    (root / "records").mkdir()
    rows: dict[str, list[str]] = {"train": [], "test": []}
    for i in range(n):
        Image.new("RGB", (8, 8), (20 * i % 256, 0, 0)).save(root / "images" / f"{i}.png")
        split = "test" if i % 4 == 0 else "train"
        row = {"base_id": f"b{i}", "group_id": f"b{i}", "view_id": "full", "split": split, "relation": "FULL", "question": "What is it?",
               "images": [{"path": f"images/{i}.png"}], "answer_type": "word", "target": "red", "evidence": []}
        rows[split].append(json.dumps(row))
    for split, lines in rows.items():
        (root / "records" / f"{split}.jsonl").write_text("".join(x + "\n" for x in lines))
    return root


def edit_rows(root: Path, split: str, fn) -> None:
    path = root / "records" / f"{split}.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        fn(i, row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_validate_before_the_manifest_is_one_problem(tmp_path):
    root = hand_made(tmp_path / "ds", n=40)
    with pytest.raises(DataContractError) as e:
        validate_dataset(root, memoize=False)
    (p,) = e.value.problems  # not 40 "tampered" images and 40 rows without sha256
    assert p.file == "manifest.json" and "missing" in p.why and "python -m harness.data manifest" in p.fix
    res = cli("-m", "harness.data", "validate", str(root), cache=tmp_path / "c")
    assert res.returncode == 2 and res.stderr.count("\n  - ") == 1 and "Traceback" not in res.stderr, res.stderr


def test_an_unreadable_manifest_is_one_problem_too(tmp_path):
    root = hand_made(tmp_path / "ds")
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(DataContractError) as e:
        validate_dataset(root, memoize=False)
    assert [(p.file, "does not parse" in p.why) for p in e.value.problems] == [("manifest.json", True)]


def test_without_a_manifest_genuine_problems_are_still_reported(tmp_path):
    root = hand_made(tmp_path / "ds")
    edit_rows(root, "train", lambda i, r: i == 0 and r.update(colour="red"))
    edit_rows(root, "train", lambda i, r: i == 1 and r["images"][0].update(path="images/gone.png"))
    edit_rows(root, "train", lambda i, r: i == 2 and r["images"][0].update(sha256="a" * 64))
    (root / "images" / "5.png").write_bytes(b"not a png")  # used by train.jsonl:4 (rows 1, 2, 3, 5 are train)
    with pytest.raises(DataContractError) as e:
        validate_dataset(root, memoize=False)
    got = {(p.file, p.line, p.field) for p in e.value.problems}
    assert got == {
        ("manifest.json", None, None),
        ("records/train.jsonl", 1, "colour"),
        ("records/train.jsonl", 2, "images[0].path"),  # the missing image, named by its row
        ("records/train.jsonl", 3, "images[0].sha256"),  # a digest that differs from the file
        ("records/train.jsonl", 4, "images[0].path"),  # images/5.png does not decode
    }, e.value.problems
    text = str(e.value)
    assert "images/gone.png: image is missing" in text and "does not decode" in text and "tampered" not in text


def test_identical_problems_are_grouped(tmp_path):
    root = hand_made(tmp_path / "ds", n=40)
    seal_dataset(root)
    for split in ("train", "test"):
        edit_rows(root, split, lambda i, r: r.pop("target"))
    seal_dataset(root)  # digests right, every row without a target
    with pytest.raises(DataContractError) as e:
        validate_dataset(root, memoize=False)
    (p,) = e.value.problems
    assert p.field == "target" and p.why.startswith("required field is missing (in 40 rows: records/test.jsonl:1, records/test.jsonl:2,")
    assert p.why.endswith("and 35 more)") and p.why.count("records/") == V.GROUP_SHOW and p.fix.startswith("add target")
    assert len(str(e.value).splitlines()) == 3  # the header, the problem, its fix


def test_group_problems_keeps_rare_problems_and_order():
    from harness.errors import DataProblem

    ps = [DataProblem("f", n, "x", "same", "fix") for n in (1, 2)] + [DataProblem("g", 1, "y", "other", "fix")]
    assert V.group_problems(ps) == ps  # two alike are listed as they are
    ps = [DataProblem("g", 1, "y", "other", "fix")] + [DataProblem("f", n, "x", "same", "fix") for n in (1, 2, 3)]
    grouped = V.group_problems(ps)
    assert [p.why for p in grouped] == ["other", "same (in 3 rows: f:1, f:2, f:3)"] and grouped[1].line is None
    files = [DataProblem(f"images/{n}.png", None, "sha256", "tampered", "restore") for n in range(7)]
    assert V.group_problems(files)[0].why == "tampered (in 7 files: images/0.png, images/1.png, images/2.png, images/3.png, images/4.png and 2 more)"


def test_manifest_fills_missing_digests_and_the_dataset_validates(tmp_path):
    root = hand_made(tmp_path / "ds")
    edit_rows(root, "train", lambda i, r: i == 0 and r["images"][0].update(sha256=None))
    edit_rows(root, "train", lambda i, r: i == 1 and r["images"][0].update(sha256=""))
    digest = sha256_bytes((root / "images" / "3.png").read_bytes())
    edit_rows(root, "train", lambda i, r: i == 2 and r["images"][0].update(sha256=digest))  # right already: kept
    kept = lines_of(root, "train")[2]
    res = cli("-m", "harness.data", "manifest", str(root), cache=tmp_path / "c")
    assert res.returncode == 0 and res.stdout.startswith("ok: 12 rows"), res.stderr
    assert lines_of(root, "train")[2] == kept  # an unchanged line keeps its bytes
    for split in ("train", "test"):
        for row in map(json.loads, lines_of(root, split)):
            assert row["images"][0]["sha256"] == sha256_bytes((root / row["images"][0]["path"]).read_bytes())


def test_manifest_refuses_a_wrong_digest_with_the_fill_digests_fix(tmp_path):
    root = hand_made(tmp_path / "ds")
    edit_rows(root, "test", lambda i, r: i == 1 and r["images"][0].update(sha256="0" * 64))
    before = lines_of(root, "test")
    res = cli("-m", "harness.data", "manifest", str(root), cache=tmp_path / "c")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "records/test.jsonl:2 [images[0].sha256]" in res.stderr and "--fill-digests" in res.stderr, res.stderr
    assert not (root / "manifest.json").exists() and lines_of(root, "test") == before
    res = cli("-m", "harness.data", "manifest", str(root), "--fill-digests", cache=tmp_path / "c")
    assert res.returncode == 0 and res.stdout.startswith("ok: 12 rows"), res.stderr

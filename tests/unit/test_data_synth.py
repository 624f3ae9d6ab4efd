"""The synthetic four-relation evidence set: views, evidence boxes, splits, determinism, caching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.rewards.answers import normalize_word
from harness.data import synth
from harness.data.records import MANIFEST, load_split
from harness.data.spec import split_sizes, synthetic_dir, synthetic_spec, synthetic_spec_sha256
from harness.data.synth import PALETTE, SHAPES, assign_splits, draw_item, encode_png, ensure_synthetic, write_synthetic
from harness.errors import ConfigError

N_BASE = 24


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    """`python -m harness.data synth --n-base 24`, through the CLI."""
    out = tmp_path_factory.mktemp("synth") / "ds"
    env = {**os.environ, "XDG_CACHE_HOME": str(out.parent / "cache")}
    res = subprocess.run([sys.executable, "-m", "harness.data", "synth", "--out", str(out), "--n-base", str(N_BASE)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert "ok: 96 rows" in res.stdout
    return out


def rows(root: Path) -> list[dict]:
    return [r for split in ("train", "val", "test") for r in load_split(root, split)]


def pixels(root: Path, ref: dict) -> np.ndarray:
    return np.asarray(Image.open(root / ref["path"]).convert("RGB"))


# --- what the rows say


def test_four_relations_one_full_per_base(ds):
    all_rows = rows(ds)
    by_base = defaultdict(Counter)
    for r in all_rows:
        by_base[r["base_id"]][r["relation"]] += 1
    assert len(by_base) == N_BASE
    assert all(c == {"FULL": 1, "CONTROL": 1, "MISSING": 1, "SUBSTITUTE": 1} for c in by_base.values())


def test_no_base_in_two_splits_and_split_sizes(ds):
    splits = defaultdict(set)
    for r in rows(ds):
        splits[r["base_id"]].add(r["split"])
    assert all(len(s) == 1 for s in splits.values())
    count = Counter(next(iter(s)) for s in splits.values())
    assert (count["train"], count["val"], count["test"]) == split_sizes(N_BASE, 0.1, 0.15)


def test_targets_candidates_and_links(ds):
    groups = defaultdict(dict)
    for r in rows(ds):
        groups[r["group_id"]][r["relation"]] = r
    for g in groups.values():
        full, ctrl, miss, sub = g["FULL"], g["CONTROL"], g["MISSING"], g["SUBSTITUTE"]
        assert full["target"] == ctrl["target"] in PALETTE
        assert miss["target"] == ""
        assert sub["target"] in PALETTE and sub["target"] != full["target"]
        assert full["candidates"] == [full["target"], "", sub["target"]] == miss["candidates"]
        assert full["missing_images"] == miss["images"] and full["control_images"] == ctrl["images"]
        assert full["question"] == f"What color is the {full['meta']['shape']}?"
        assert full["evidence"] and miss["evidence"] == [] and full["evidence"] == ctrl["evidence"] == sub["evidence"]


def test_images_match_their_relation(ds):
    """Exact boxes; CONTROL changes only non-evidence pixels, never with colour; MISSING is blank."""
    for r in rows(ds):
        if r["relation"] != "FULL":
            continue
        group = {x["relation"]: x for x in load_split(ds, r["split"]) if x["group_id"] == r["group_id"]}
        full = pixels(ds, r["images"][0])
        bg = full[0, 0] if not (full[0, 0] != full[0, 0, 0]).any() else full[-1, -1]
        colored = (full.max(axis=2) - full.min(axis=2)) > 0  # palette colours are saturated, backgrounds grey
        ys, xs = np.nonzero(colored)
        assert r["evidence"] == [[int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]]
        assert (full[colored] == PALETTE[r["target"]]).all()
        ctrl = pixels(ds, group["CONTROL"]["images"][0])
        assert (ctrl[colored] == full[colored]).all()  # evidence untouched
        assert (ctrl[~colored] != full[~colored]).any()  # something else changed
        assert ((ctrl.max(axis=2) - ctrl.min(axis=2)) > 0).sum() == colored.sum()  # no second coloured object
        miss = pixels(ds, group["MISSING"]["images"][0])
        assert (miss == miss[0, 0]).all() and (miss[0, 0] == bg).all()
        sub = pixels(ds, group["SUBSTITUTE"]["images"][0])
        assert (sub[colored] == PALETTE[group["SUBSTITUTE"]["target"]]).all() and (sub[~colored] == full[~colored]).all()


def test_shapes_are_big_and_every_kind_and_control_occurs():
    items = [draw_item(0, i, 56) for i in range(300)]
    assert {i.shape for i in items} == set(SHAPES)
    assert {i.control for i in items} == set(synth.CONTROLS)
    for item in items[:60]:
        _, box, kind = synth.render_views(item, 56)
        side = max(box[2] - box[0], box[3] - box[1])
        assert 0.35 * 56 <= side <= 0.7 * 56
        assert 0 <= box[0] and box[2] <= 56 and 0 <= box[1] and box[3] <= 56
        assert kind in synth.CONTROLS


def test_colors_are_single_words_and_well_separated():
    cols = np.array(list(PALETTE.values()), dtype=float)
    d = np.linalg.norm(cols[:, None] - cols[None], axis=2)
    assert d[~np.eye(len(cols), dtype=bool)].min() > 80
    assert all(normalize_word(c) == c and " " not in c for c in PALETTE)


@pytest.mark.parametrize("size", [56, 64])
def test_image_sizes(tmp_path, size):
    out = write_synthetic(tmp_path / "d", n_base=4, image_size=size)
    r = load_split(out, "train")[0]
    assert Image.open(out / r["images"][0]["path"]).size == (size, size)


def test_png_encoder_round_trips():
    rgb = np.random.default_rng(0).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    img = Image.open(__import__("io").BytesIO(encode_png(rgb)))
    assert img.mode == "RGB" and (np.asarray(img) == rgb).all()


def test_default_split_has_300_test_views():
    assert split_sizes(600, 0.1, 0.15)[2] * 4 >= 300
    splits = assign_splits(600, 0, 0.1, 0.15)
    assert Counter(splits) == {"train": 450, "val": 60, "test": 90}


# --- determinism and identity


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_args_byte_identical(ds, tmp_path):
    again = write_synthetic(tmp_path / "again", n_base=N_BASE)
    assert _tree(again) == _tree(ds)
    other = write_synthetic(tmp_path / "other", n_base=N_BASE, data_seed=1)
    assert json.loads((other / MANIFEST).read_text())["sha256"] != json.loads((ds / MANIFEST).read_text())["sha256"]


def test_spec_identity_without_generating(ds):
    m = json.loads((ds / MANIFEST).read_text())
    assert m["spec_sha256"] == synthetic_spec_sha256(N_BASE, 0, 56, 0.1, 0.15)
    assert m["generator"] == synthetic_spec(N_BASE, 0, 56)
    base = synthetic_spec_sha256(600, 0, 56, 0.1, 0.15)
    variants = [(601, 0, 56, 0.1, 0.15), (600, 1, 56, 0.1, 0.15), (600, 0, 64, 0.1, 0.15), (600, 0, 56, 0.2, 0.15), (600, 0, 56, 0.1, 0.2)]
    assert len({base, *(synthetic_spec_sha256(*v) for v in variants)}) == 6
    assert synthetic_spec_sha256(600, 0, 56, 0, 0.15) == synthetic_spec_sha256(600, 0, 56, 0.0, 0.15)


def test_spec_is_torch_free_and_light():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "from harness.data import synthetic_spec_sha256 as f; f(600, 0, 56)"], capture_output=True, text=True, check=True)
    mods = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert not mods & {"torch", "transformers", "trl", "numpy", "PIL", "datasets"}


@pytest.mark.parametrize(
    "kwargs, fields",
    [
        ({"n_base": 2}, ["data.n_base"]),
        ({"image_size": 14}, ["data.image_size"]),
        ({"data_seed": -1}, ["data.data_seed"]),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, ["data.val_fraction + data.test_fraction"]),
        ({"n_base": 4, "val_fraction": 0.4, "test_fraction": 0.4}, ["data.n_base"]),
        ({"n_base": 1, "image_size": 8}, ["data.n_base", "data.image_size"]),  # every problem, not the first
    ],
)
def test_bad_parameters_are_refused(kwargs, fields):
    args = {"n_base": 600, "data_seed": 0, "image_size": 56, "val_fraction": 0.1, "test_fraction": 0.15} | kwargs
    with pytest.raises(ConfigError) as e:
        synthetic_spec(**args)
    assert [p.field for p in e.value.problems] == fields
    assert "fix:" in str(e.value)


def test_synth_refuses_a_non_empty_out(ds, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    res = subprocess.run([sys.executable, "-m", "harness.data", "synth", "--out", str(tmp_path / "x"), "--n-base", "4"], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--force" in res.stderr
    assert (tmp_path / "x" / "keep.txt").exists()


# --- the cache


def test_ensure_synthetic_generates_once(tmp_path):
    kw = dict(n_base=8, data_seed=3, image_size=56, cache_dir=tmp_path)
    path = ensure_synthetic(**kw)
    assert path == synthetic_dir(tmp_path, 8, 3, 56) and (path / MANIFEST).is_file()
    stamp = (path / MANIFEST).stat().st_mtime_ns
    assert ensure_synthetic(**kw) == path and (path / MANIFEST).stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp folders left


def test_stale_temp_folders_are_swept(tmp_path):
    target = synthetic_dir(tmp_path, 8, 0, 56)
    old, fresh = tmp_path / f".{target.name}.tmp-old", tmp_path / f".{target.name}.tmp-live"
    old.mkdir()
    fresh.mkdir()
    os.utime(old, (0, 0))
    ensure_synthetic(n_base=8, data_seed=0, image_size=56, cache_dir=tmp_path)
    assert not old.exists() and fresh.exists()  # a live generator's folder is left alone


def test_crashed_generation_leaves_nothing_complete(tmp_path, monkeypatch):
    def crash(writer, *a, **k):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(synth, "_write_base", crash)
    with pytest.raises(RuntimeError):
        ensure_synthetic(n_base=8, data_seed=0, image_size=56, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_half_written_folder_is_replaced(tmp_path):
    target = synthetic_dir(tmp_path, 8, 0, 56)
    (target / "images").mkdir(parents=True)
    (target / "images" / "partial.png").write_bytes(b"\x89PNG")  # a crashed writer's leftovers, no manifest
    path = ensure_synthetic(n_base=8, data_seed=0, image_size=56, cache_dir=tmp_path)
    assert (path / MANIFEST).is_file() and not (path / "images" / "partial.png").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_concurrent_generators_agree(tmp_path):
    results, errors = [], []

    def run():
        try:
            results.append(ensure_synthetic(n_base=16, data_seed=5, image_size=56, cache_dir=tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]
    from harness.data.validate import validate_dataset

    assert validate_dataset(results[0], cache_dir=tmp_path.parent / "vcache").rows == 64

"""The synthetic four-relation evidence set (docs/data.md; the embedded default data).

Task: one shape on a neutral grey background, "What color is the <shape>?", a one-word colour
answer. A tiny random VLM sees 4 image tokens (docs/platform.md: it learns this task, but not to
tell two coloured objects apart), so the shape is the only coloured thing in every image and
fills a good part of it (about 40-65 % of the side).

For every base item four views, one group:

    FULL        the shape in colour a*                      target a*     evidence [box]
    CONTROL     FULL with the background altered (darker/   target a*     evidence [box]
                lighter shade, a grey checker texture, or a
                small grey mark in the corner farthest from
                the shape); shape pixels are identical to FULL
    MISSING     the background alone (evidence removed)     target ""     evidence []
    SUBSTITUTE  the same shape in another colour a_sub      target a_sub  evidence [box]

Every row carries the group's candidates [a*, "", a_sub] (evi_po's C_q in target space) and the
FULL row the image references of its MISSING and CONTROL views. Evidence boxes are exact:
the pixel bounding box [x0, y0, x1, y1] (x1, y1 exclusive) of the rasterized shape.

Determinism: each base item draws from its own stream, random.Random seeded with a sha256 of
(generator version, data_seed, index), using only Random.random(), whose sequence Python
guarantees across versions. Shapes are rasterized with numpy at pixel centres and written by a
minimal PNG encoder (no ancillary chunks, fixed zlib level), so the same arguments give
byte-identical files (given the same zlib). Splits are drawn per base item: no base item
appears in two splits.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import struct
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.data.manifest import DatasetWriter, check_out_dir, new_temp_dir, publish_dir, read_manifest
from harness.data.records import IMAGES_DIR, MANIFEST
from harness.data.spec import GENERATOR_VERSION, spec_sha256, split_sizes, synthetic_dir, synthetic_spec
from harness.errors import DataContractError, DataProblem

# --- vocabulary: well-separated saturated colours against neutral greys

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (210, 30, 40),
    "green": (34, 160, 60),
    "blue": (37, 84, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 190),
    "orange": (245, 120, 10),
}
COLORS = tuple(PALETTE)
SHAPES = ("circle", "square", "triangle", "diamond")
CONTROLS = ("shade", "texture", "mark")
VIEWS = (("full", "FULL"), ("control", "CONTROL"), ("missing", "MISSING"), ("substitute", "SUBSTITUTE"))


class _Rng:
    """A per-item stream built on Random.random() only (its sequence is stable across Pythons)."""

    def __init__(self, *key: object):
        seed = hashlib.sha256(repr(("harness-synth", GENERATOR_VERSION) + key).encode()).digest()
        self._r = random.Random(int.from_bytes(seed[:8], "big"))

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self._r.random()

    def below(self, n: int) -> int:
        return min(int(self._r.random() * n), n - 1)

    def pick(self, seq):
        return seq[self.below(len(seq))]


# --- drawing one base item


@dataclass(frozen=True)
class Item:
    index: int
    shape: str
    color: str
    sub_color: str
    cx: float
    cy: float
    r: float  # shape scale in pixels (circle radius)
    background: int  # grey level of the FULL background
    control: str  # which non-evidence edit the CONTROL view makes
    control_level: int  # shade level / texture delta / mark grey level
    mark_side: int

    @property
    def base_id(self) -> str:
        return f"s{self.index:06d}"


def draw_item(data_seed: int, index: int, size: int) -> Item:
    rng = _Rng(data_seed, index)
    shape = rng.pick(SHAPES)
    ci = rng.below(len(COLORS))
    sub = (ci + 1 + rng.below(len(COLORS) - 1)) % len(COLORS)  # any other colour, uniformly
    r = rng.uniform(0.20, 0.26) * size
    reach = 1.25 * r + 2  # the widest shape (diamond) reaches 1.25 r from its centre; 2 px margin
    cx, cy = rng.uniform(reach, size - reach), rng.uniform(reach, size - reach)
    background = 200 + rng.below(46)  # 200..245
    control = rng.pick(CONTROLS)
    if control == "shade":  # a clearly different grey, staying light
        delta = 25 + rng.below(21)
        level = background + delta if rng.below(2) and background + delta <= 250 else background - delta
    elif control == "texture":
        level = 15 + rng.below(16)  # checker cells this much darker
    else:
        level = 90 + rng.below(51)  # a mid grey mark, clearly not one of the palette colours
    return Item(index, shape, COLORS[ci], COLORS[sub], cx, cy, r, background, control, level, max(4, round(0.12 * size)))


@lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    c = np.arange(size, dtype=np.float64) + 0.5  # pixel centres
    return np.meshgrid(c, c, indexing="xy")  # (S, S) x and y


def shape_mask(item: Item, size: int) -> np.ndarray:
    """(S, S) bool: the pixels whose centre lies inside the shape."""
    xx, yy = _grid(size)
    dx, dy, r = xx - item.cx, yy - item.cy, item.r
    if item.shape == "circle":
        return dx * dx + dy * dy <= r * r
    if item.shape == "square":
        return np.maximum(np.abs(dx), np.abs(dy)) <= 0.9 * r
    if item.shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= 1.25 * r
    # triangle, apex up: half-width grows linearly from 0 at the apex to 1.15 r at the base
    return (dy >= -r) & (dy <= r) & (np.abs(dx) <= 1.15 * r * (dy + r) / (2 * r))


def box_of(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def _mark_box(item: Item, box: list[int], size: int) -> list[int] | None:
    """The corner square farthest from the evidence box, if it keeps a gap of >= 2 px."""
    m, best, best_gap = item.mark_side, None, 1
    for x0 in (2, size - 2 - m):
        for y0 in (2, size - 2 - m):
            gap = max(box[0] - (x0 + m), x0 - box[2], box[1] - (y0 + m), y0 - box[3])
            if gap > best_gap:
                best, best_gap = [x0, y0, x0 + m, y0 + m], gap
    return best


def render_views(item: Item, size: int) -> tuple[dict[str, np.ndarray], list[int], str]:
    """The four (S, S, 3) uint8 images, the evidence box, and the control edit actually made."""
    mask = shape_mask(item, size)
    box = box_of(mask)
    bg = np.full((size, size, 3), item.background, dtype=np.uint8)

    full = bg.copy()
    full[mask] = PALETTE[item.color]
    sub = bg.copy()
    sub[mask] = PALETTE[item.sub_color]

    control, kind = bg.copy(), item.control
    mark = _mark_box(item, box, size) if kind == "mark" else None
    if kind == "mark" and mark is None:
        kind = "shade"  # no corner far enough from a large shape: fall back to a shade change
    if kind == "shade":
        level = item.control_level if item.control != "mark" else max(150, item.background - 35)
        control[:] = level
    elif kind == "texture":
        xx, yy = _grid(size)
        checker = ((xx.astype(int) // 2 + yy.astype(int) // 2) % 2 == 0) & ~mask
        control[checker] = item.background - item.control_level
    else:
        x0, y0, x1, y1 = mark
        control[y0:y1, x0:x1] = item.control_level
    control[mask] = PALETTE[item.color]  # evidence pixels identical to FULL
    return {"full": full, "control": control, "missing": bg, "substitute": sub}, box, kind


# --- PNG


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray) -> bytes:
    """8-bit RGB PNG, filter 'none', zlib level 9, no ancillary chunks (no timestamps)."""
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


# --- the dataset


def assign_splits(n_base: int, data_seed: int, val_fraction: float, test_fraction: float) -> list[str]:
    """split of each base index: a seeded permutation, first test, then val, the rest train."""
    _, n_val, n_test = split_sizes(n_base, val_fraction, test_fraction)
    order = list(range(n_base))
    rng = _Rng(data_seed, "split")
    for i in range(n_base - 1, 0, -1):  # Fisher-Yates on Random.random() only
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    split = ["train"] * n_base
    for k, idx in enumerate(order):
        if k < n_test:
            split[idx] = "test"
        elif k < n_test + n_val:
            split[idx] = "val"
    return split


def _render_base(args: tuple[int, int, int]) -> tuple[Item, dict[str, bytes], list[int], str]:
    data_seed, index, size = args
    item = draw_item(data_seed, index, size)
    images, box, kind = render_views(item, size)
    return item, {v: encode_png(img) for v, img in images.items()}, box, kind


def generate(out: str | Path, spec: dict, *, workers: int = 0) -> dict:
    """Write the dataset of `spec` into the folder `out` (manifest last); returns the manifest."""
    n, seed, size = spec["n_base"], spec["data_seed"], spec["image_size"]
    splits = assign_splits(n, seed, spec["val_fraction"], spec["test_fraction"])
    writer = DatasetWriter(out)
    jobs = [(seed, i, size) for i in range(n)]
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            results = list(pool.imap(_render_base, jobs, chunksize=64))
    else:
        results = map(_render_base, jobs)
    for item, pngs, box, kind in results:
        _write_base(writer, item, pngs, box, kind, splits[item.index])
    return writer.finish(kind="synthetic", generator=spec, spec_sha256=spec_sha256(spec))


def _write_base(writer: DatasetWriter, item: Item, pngs: dict[str, bytes], box: list[int], kind: str, split: str) -> None:
    bid = item.base_id
    refs = {v: writer.add_image(f"{IMAGES_DIR}/{bid}-{v}.png", pngs[v]) for v, _ in VIEWS}
    targets = {"full": item.color, "control": item.color, "missing": "", "substitute": item.sub_color}
    meta = {"shape": item.shape, "color": item.color, "substitute_color": item.sub_color, "control": kind, "background": item.background}
    for view, relation in VIEWS:
        row = {
            "base_id": bid,
            "group_id": bid,  # one question per base item here; other datasets may have several groups per base
            "view_id": view,
            "split": split,
            "relation": relation,
            "question": f"What color is the {item.shape}?",
            "answer_type": "word",
            "target": targets[view],
            "images": [refs[view]],
            "evidence": [] if view == "missing" else [box],
            "candidates": [item.color, "", item.sub_color],
        }
        if view == "full":
            row["missing_images"] = [refs["missing"]]
            row["control_images"] = [refs["control"]]
        row["meta"] = meta
        writer.add_row(row)


# --- publishing atomically


def _build(target: Path, spec: dict, *, workers: int, replace: bool) -> Path:
    tmp = new_temp_dir(target)
    try:
        generate(tmp, spec, workers=workers)
        publish_dir(tmp, target, replace=replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


STALE_TMP_S = 24 * 3600  # a temp folder this old belongs to a killed generator, not a slow one


def _sweep_stale(target: Path) -> None:
    """Delete temp folders of killed generators of this dataset (never a live one: see STALE_TMP_S)."""
    now = time.time()
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


def write_synthetic(out: str | Path, *, n_base: int = 600, data_seed: int = 0, image_size: int = 56, val_fraction: float = 0.1, test_fraction: float = 0.15, workers: int = 0, force: bool = False) -> Path:
    """`python -m harness.data synth`: generate into `out` (refused when it holds anything, unless force)."""
    spec = synthetic_spec(n_base, data_seed, image_size, val_fraction, test_fraction)
    out = Path(out)
    check_out_dir(out, force=force)
    return _build(out, spec, workers=workers, replace=True)


def ensure_synthetic(*, n_base: int, data_seed: int, image_size: int, val_fraction: float = 0.1, test_fraction: float = 0.15, cache_dir: str | Path, workers: int = 0) -> Path:
    """The cached dataset for these parameters, generating it first when absent.

    <cache_dir>/synthetic-<spec sha[:12]>/ appears only complete (built in a temp folder next to
    it and renamed); a concurrent generator that loses the race discards its copy.
    """
    spec = synthetic_spec(n_base, data_seed, image_size, val_fraction, test_fraction)
    target = synthetic_dir(cache_dir, n_base, data_seed, image_size, val_fraction, test_fraction)
    if not (target / MANIFEST).is_file():
        _sweep_stale(target)
        _build(target, spec, workers=workers, replace=False)
    manifest, _ = read_manifest(target)
    if manifest.get("spec_sha256") != spec_sha256(spec):
        raise DataContractError(str(target), [DataProblem(MANIFEST, None, "spec_sha256", f"{manifest.get('spec_sha256')!r} but these parameters give {spec_sha256(spec)!r}", "delete the folder; it will be regenerated")])
    return target

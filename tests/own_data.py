"""A small dataset of one's own, as a new user makes it: images drawn with PIL and hand-written records (no manifest:
the caller seals it, e.g. with `python -m harness.data manifest DIR`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 220, 30)}


def write_colour_set(root: Path, n: int = 40, n_test: int = 8, seed: int = 0, size: int = 56,
                     question: str = "What color is the square?") -> Path:
    """`n` one-view items (a coloured square on grey; the answer is its colour word), the last `n_test` in split
    test, the rest in train: records/<split>.jsonl and images/<i>.png, without sha256 and without a manifest."""
    from PIL import Image, ImageDraw

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "records").mkdir(exist_ok=True)
    rng = random.Random(seed)
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    trained = set()
    for i in range(n):
        name = list(COLOURS)[i % len(COLOURS)]
        img = Image.new("RGB", (size, size), (128, 128, 128))
        x, y = rng.randint(2, size // 3), rng.randint(2, size // 3)
        while i >= n - n_test and (name, x, y) in trained:  # a test image must not copy a training one
            x, y = (x + 1, y) if x < size // 3 else (2, 2 + (y - 1) % (size // 3 - 1))  # no rng draw
        if i < n - n_test:
            trained.add((name, x, y))
        ImageDraw.Draw(img).rectangle([x, y, x + size // 2, y + size // 2], fill=COLOURS[name])
        img.save(root / "images" / f"{i}.png")
        split = "test" if i >= n - n_test else "train"
        rows[split].append({"base_id": f"b{i}", "group_id": f"b{i}", "view_id": "full", "split": split,
                            "relation": "FULL", "question": question, "images": [{"path": f"images/{i}.png"}],
                            "answer_type": "word", "target": name, "evidence": []})
    for split, rs in rows.items():
        (root / "records" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    return root

"""Write a small counting task as a researcher holds one: a folder of images and a CSV of question/answer rows.

    python examples/count_dots/make_data.py OUT [--n 60] [--seed 0]

OUT/images/<i>.png shows 1 to 5 black dots on white; OUT/table.csv has the columns image, question, answer
(the count, a number). Then `python -m harness.data init DATA --from OUT/table.csv --answer-type number`
turns it into a dataset (records, digests, manifest), see README.md next to this file.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path


def write(out: Path, n: int = 60, seed: int = 0, size: int = 56) -> Path:
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows, drawn = [], set()
    for i in range(n):
        count = 1 + i % 5
        img = Image.new("RGB", (size, size), (255, 255, 255))
        draw = ImageDraw.Draw(img)
        for _ in range(100):  # a 4 x 4 grid: dots never overlap; no two images alike, so no test image copies a
            cells = rng.sample(range(16), count)  # training one (validation refuses split overlap by content)
            if frozenset(cells) not in drawn:
                break
        drawn.add(frozenset(cells))
        for c in cells:
            x, y = (c % 4) * size // 4 + 3, (c // 4) * size // 4 + 3
            draw.ellipse([x, y, x + size // 4 - 6, y + size // 4 - 6], fill=(0, 0, 0))
        img.save(out / "images" / f"{i}.png")
        rows.append({"image": f"images/{i}.png", "question": "How many dots are there?", "answer": str(count)})
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["image", "question", "answer"])
        w.writeheader()
        w.writerows(rows)
    return out / "table.csv"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"wrote {write(args.out, args.n, args.seed)}")

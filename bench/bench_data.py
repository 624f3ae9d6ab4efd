"""Benchmark: generate the synthetic set, validate it, validate it again (memoized).

    .venv/bin/python bench/bench_data.py [--n-base 10000] [--workers 0] [--image-size 56]

Prints wall times of generation, the first (full) validation and the second (memoized) one,
and the ratio second / first; the data contract asks for <= 5 %. Works in a temp folder that
is deleted afterwards (validation memo included), so runs do not interfere.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness.data.synth import write_synthetic
from harness.data.validate import validate_dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-base", type=int, default=10_000)
    ap.add_argument("--image-size", type=int, default=56)
    ap.add_argument("--workers", type=int, default=0, help="generation processes and validation threads")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root, cache = Path(tmp) / "ds", Path(tmp) / "cache"
        t0 = time.perf_counter()
        write_synthetic(root, n_base=args.n_base, image_size=args.image_size, workers=args.workers)
        t_gen = time.perf_counter() - t0
        first = validate_dataset(root, cache_dir=cache, workers=args.workers)
        second = validate_dataset(root, cache_dir=cache, workers=args.workers)
        assert not first.memoized and second.memoized
        size_mb = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6
        print(f"n_base {args.n_base}: {first.rows} rows, {first.images} images, {size_mb:.1f} MB, workers {args.workers}")
        print(f"generate            {t_gen:8.2f} s   ({t_gen / args.n_base * 1e3:.2f} ms per base item)")
        print(f"validate (full)     {first.seconds:8.2f} s")
        print(f"validate (memoized) {second.seconds:8.3f} s")
        print(f"ratio memoized/full {second.seconds / first.seconds:8.3%}   (contract: <= 5 %)")


if __name__ == "__main__":
    main()

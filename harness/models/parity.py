"""Does the image-only processor (harness.models.pretrained.image_only) give exactly what the checkpoint's stock
processor gives? Measured where torchvision imports, since only there can the stock one be built.

    python -m harness.models.parity DIR [DIR ...] [--min-pixels N] [--max-pixels N] [--json]
    report = compare(path, max_pixels=50176)   # {"ok": bool, "calls": {"images": {...}, "text": {...}}, ...}

Why: without torchvision (CPU machines) the harness runs the image-only processor, with it (GPU nodes) the stock
one; a policy sees the same prompts on both only if the two agree token for token and pixel for pixel. Both are
built by load_processor (stock=True / stock=False) and run on one batch built as the harness builds it (the chat
template, six deterministic RGB images from 56x56 to 1500x1200, left padding) and on a text-only batch; every
output key must be torch.equal (`ok`). Reported beside that verdict:
- each side's image backend. With torchvision both pick torchvision; if they ever differ, the image-only class is
  rebuilt on the stock side's backend and that like-for-like comparison decides `ok`.
- `pil_vs_torchvision`: the image-only processor on the PIL backend (what a machine without torchvision runs) vs
  on torchvision. Their resizes and float math differ a little, so pixel_values may too: a platform fact, not a
  failure of the image-only class (grids and input_ids come from integer math and should be in equal_keys).
Exit status: 0 all equal, 1 a mismatch, 2 no torchvision here or a checkpoint that cannot be compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from PIL import Image

#: (width, height): tiny, square, a wide strip, a large square, portrait, one over a small max_pixels.
SIZES = ((56, 56), (64, 64), (100, 37), (448, 448), (333, 500), (1500, 1200))
QUESTIONS = ("What color is the circle?", "What is in the picture?", "Left or right?",
             "Look at the image and answer the question with <answer>...</answer>.", "Top?", "Count the shapes.")
NO_TORCHVISION = ("torchvision does not import here, so transformers cannot build the stock Qwen-VL processor to "
                  "compare with; run this where it does (a GPU node, or a venv with "
                  "`pip install torch==2.14.1 torchvision==0.29.1`)")


def images() -> list:
    """Deterministic RGB images: a smooth gradient plus seeded noise (noise stresses the resize filters)."""
    out = []
    for i, (w, h) in enumerate(SIZES):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(w + h - 2, 1)], -1)
        noise = np.random.default_rng(i).normal(0, 40, (h, w, 3))
        out.append(Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB"))
    return out


def backend(image_processor) -> str:
    """'torchvision' or 'pil': which transformers image-processing backend the image processor is built on."""
    names = {c.__name__ for c in type(image_processor).__mro__}
    return "torchvision" if "TorchvisionBackend" in names else "pil" if "PilBackend" in names else "unknown"


def run(proc, imgs) -> tuple[dict, dict, float]:
    """(image batch outputs, text-only outputs, best-of-3 seconds of the image batch call)."""
    texts = [proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}],
                                      add_generation_prompt=True, tokenize=False) for q in QUESTIONS[:len(imgs)]]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        batch = proc(text=texts, images=[[im] for im in imgs], padding=True, return_tensors="pt")
        best = min(best, time.perf_counter() - start)
    text = proc(text=["Answer with <answer>red</answer>.", "What color?"], padding=True, return_tensors="pt")
    return dict(batch), dict(text), best


def diff(a: dict, b: dict) -> dict:
    """Per key of both `a` (stock) and `b`: equal (same shape and torch.equal); max_abs_diff for float tensors."""
    import torch

    keys = {}
    for k in sorted(set(a) & set(b)):
        x, y, same = a[k], b[k], a[k].shape == b[k].shape
        keys[k] = {"equal": bool(same and torch.equal(x, y)),
                   "shape": list(x.shape) if same else [list(x.shape), list(y.shape)]}
        if x.is_floating_point():
            keys[k]["max_abs_diff"] = float((x - y).abs().max()) if same and x.numel() else None
    return {"keys": keys, "only_stock": sorted(set(a) - set(b)), "only_image_only": sorted(set(b) - set(a)),
            "equal": all(v["equal"] for v in keys.values()) and set(a) == set(b)}


def rebuilt(proc, path: str, backend_name: str, pixels: dict):
    """`proc`'s class, tokenizer and template with the checkpoint's image processor on `backend_name`."""
    from transformers import AutoImageProcessor

    ip = AutoImageProcessor.from_pretrained(path, backend=backend_name, **pixels)
    return type(proc)(image_processor=ip, tokenizer=proc.tokenizer, chat_template=proc.chat_template)


def compare(path, *, min_pixels: int | None = None, max_pixels: int | None = None) -> dict:
    """Stock vs image-only processor of the checkpoint at `path` (the module docstring says what is reported)."""
    import torch

    from harness.models.pretrained import load_processor, pixel_kwargs, read_checkpoint, video_backend

    if not video_backend():
        raise RuntimeError(NO_TORCHVISION)
    path, pixels, imgs = str(path), pixel_kwargs(min_pixels, max_pixels), images()
    info, problems = read_checkpoint(path)
    if problems or not info.is_vlm:
        why = "; ".join(f"{w} ({f})" for w, f in problems) or f"{info.model_type} is not a vision-language model"
        raise ValueError(f"{path} cannot be compared: {why}")
    procs, outs, seconds = {}, {}, {}
    for side, stock in (("stock", True), ("image_only", False)):
        start = time.perf_counter()
        procs[side] = load_processor(path, min_pixels=min_pixels, max_pixels=max_pixels, stock=stock)
        load = time.perf_counter() - start
        *outs[side], call = run(procs[side], imgs)
        seconds[side] = {"load": round(load, 4), "call": round(call, 4)}
    backends = {side: backend(p.image_processor) for side, p in procs.items()}
    pair = lambda other: {c: diff(outs["stock"][i], other[i]) for i, c in enumerate(("images", "text"))}  # noqa: E731
    calls, like = pair(outs["image_only"]), None
    if backends["stock"] != backends["image_only"]:
        like = pair(run(rebuilt(procs["image_only"], path, backends["stock"], pixels), imgs))
    on = {b: run(rebuilt(procs["image_only"], path, b, pixels), imgs) for b in ("pil", "torchvision")}
    pil, tv = on["pil"][0]["pixel_values"], on["torchvision"][0]["pixel_values"]
    px = (pil - tv).abs() if pil.shape == tv.shape else None  # None: the grids differ (see equal_keys)
    stat = lambda f: None if px is None else float(f(px))  # noqa: E731
    return {"path": path, "family": info.family, "pixels": pixels, "backends": backends,
            "classes": {s: f"{type(p).__module__}.{type(p).__name__}" for s, p in procs.items()},
            "image_processors": {s: type(p.image_processor).__name__ for s, p in procs.items()},
            "grids": outs["stock"][0]["image_grid_thw"].tolist(), "calls": calls, "like_for_like": like,
            "pil_vs_torchvision": {
                "equal_keys": [k for k, v in diff(on["torchvision"][0], on["pil"][0])["keys"].items() if v["equal"]],
                "pixel_values_max_abs_diff": stat(torch.max), "pixel_values_mean_abs_diff": stat(torch.mean),
                # past float32 rounding: 1e-4 is far under one uint8 level once normalized
                "pixel_values_frac_over_1e-4": stat(lambda d: (d > 1e-4).double().mean()),
                "seconds": {b: round(v[2], 4) for b, v in on.items()}},
            "seconds": seconds, "ok": all(c["equal"] for c in (like or calls).values())}


def line(r: dict) -> str:
    """One line per checkpoint: the verdict, the mismatching keys, the backends and the PIL-vs-torchvision gap."""
    g = lambda x: "n/a" if x is None else f"{x:.3g}"  # noqa: E731
    bad = [f"{c}:{k}" + (f" (max |diff| {g(v['max_abs_diff'])})" if "max_abs_diff" in v else "")
           for c, d in (r["like_for_like"] or r["calls"]).items() for k, v in d["keys"].items() if not v["equal"]]
    bad += [f"{c}: only {s[5:]} has {d[s]}" for c, d in r["calls"].items() for s in ("only_stock", "only_image_only")
            if d[s]]
    pvt, s, b = r["pil_vs_torchvision"], r["seconds"], r["backends"]
    return (f"{r['family']} {r['path']} {r['pixels'] or 'default pixels'}: "
            f"{'EQUAL' if r['ok'] else 'MISMATCH ' + ', '.join(bad)} [{' '.join(r['calls']['images']['keys'])}; "
            f"text-only {'equal' if r['calls']['text']['equal'] else 'DIFFERS'}] backends stock={b['stock']} "
            f"image-only={b['image_only']}{' (compared like for like)' if r['like_for_like'] else ''}; "
            f"grids {r['grids']}; PIL vs torchvision: pixel_values max |diff| {g(pvt['pixel_values_max_abs_diff'])}, "
            f"mean {g(pvt['pixel_values_mean_abs_diff'])}, {g(pvt['pixel_values_frac_over_1e-4'])} of them over 1e-4, "
            f"equal {pvt['equal_keys']}, {pvt['seconds']['pil']:.3f} s vs {pvt['seconds']['torchvision']:.3f} s; "
            f"image batch stock {s['stock']['call']:.3f} s, image-only {s['image_only']['call']:.3f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.models.parity", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", metavar="DIR", help="Qwen-VL checkpoint directories")
    p.add_argument("--min-pixels", type=int, default=None, help="as model.min_pixels (default: the checkpoint's)")
    p.add_argument("--max-pixels", type=int, default=None, help="as model.max_pixels (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print each full report as JSON instead of one line")
    args = p.parse_args(argv)
    from harness.models.pretrained import video_backend

    if not video_backend():
        print(f"harness.models.parity: {NO_TORCHVISION}", file=sys.stderr)
        return 2
    status = 0
    for path in args.paths:
        try:
            report = compare(path, min_pixels=args.min_pixels, max_pixels=args.max_pixels)
        except (ValueError, OSError) as err:
            print(f"harness.models.parity: {err}", file=sys.stderr)
            return 2
        print(json.dumps(report) if args.json else line(report), flush=True)
        status = status or (0 if report["ok"] else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Real checkpoints (`model.source=pretrained`): what a checkpoint directory holds, checked before any run dir is
claimed, and its processor, built from its own files with or without torchvision.

    problems = checkpoint_problems(path, family="qwen2_5_vl", is_vlm=True, patch_size=14)   # torch-free
    processor = load_processor(path, min_pixels=None, max_pixels=None)                        # imports transformers

Torch-free at import: the plan reads config.json, the processor and tokenizer files with the stdlib only.

The processor: transformers 5.x builds every Qwen-VL processor (Qwen2VLProcessor, Qwen2_5_VLProcessor,
Qwen3VLProcessor) with a video processor, and every video processor needs torchvision (not installable next to the
CPU torch wheel; real GPU nodes have it). Where torchvision imports, the checkpoint's stock processor is used as
`AutoProcessor` builds it. Where it does not, the harness builds the same class minus its video processor
(`image_only`): the checkpoint's own tokenizer and image processor (AutoTokenizer / AutoImageProcessor, which picks
the PIL backend without torchvision), its chat template, and the stock class's own `__init__` and `__call__`, so
`input_ids`, `pixel_values` and `image_grid_thw` are the stock processor's (harness.models.parity compares the
two; tests/unit/test_processor_parity.py holds them equal wherever torchvision imports, and scripts/gpu_check.sh
runs it on a GPU node). Videos are refused.

model.min_pixels / model.max_pixels (null: the checkpoint's own) bound the pixels of a resized image, as the
Qwen-VL processors' `min_pixels` / `max_pixels` arguments do; they decide how many image tokens an image becomes.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

#: model_type -> (family, is_vlm) the harness trains; other architectures are refused at plan time.
SUPPORTED = {
    "qwen2_vl": ("qwen2_vl", True),
    "qwen2_5_vl": ("qwen2_5_vl", True),
    "qwen3_vl": ("qwen3_vl", True),
    "qwen2": ("qwen2", False),
}
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TEMPLATE_FILES = ("chat_template.json", "chat_template.jinja")


@dataclass
class CheckpointInfo:
    """What the plan reads of a checkpoint directory (stdlib only)."""

    path: str
    model_type: str | None = None
    architectures: list = field(default_factory=list)
    family: str | None = None
    is_vlm: bool | None = None
    patch_size: int | None = None
    merge_size: int = 2
    max_positions: int | None = None
    vocab_size: int | None = None
    min_pixels: int | None = None  # the image processor's own bounds (preprocessor_config.json)
    max_pixels: int | None = None
    processor_class: str | None = None
    torch_dtype: str | None = None


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def read_checkpoint(path: str | Path) -> tuple[CheckpointInfo, list[tuple[str, str]]]:
    """(what the directory says, [(why, fix), ...] for what makes it unloadable). Reads JSON files only."""
    root = Path(path)
    info = CheckpointInfo(path=str(root))
    if not root.exists():
        return info, [("does not exist", "give the directory of a Hugging Face checkpoint (config.json, weights, "
                                         "tokenizer), or a model.hub_id in the local HF cache")]
    if not root.is_dir():
        return info, [("is a file, not a checkpoint directory", "give the directory that holds config.json")]
    if not (root / "config.json").is_file():
        return info, [("has no config.json: it is not a Hugging Face checkpoint directory",
                       "point model.path at the folder that holds config.json, the weights and the tokenizer "
                       "(a hub snapshot: .../models--ORG--NAME/snapshots/<rev>)")]
    try:
        cfg = _json(root / "config.json")
    except (OSError, ValueError) as err:
        return info, [(f"has an unreadable config.json ({err})", "restore the checkpoint's config.json")]
    info.model_type, info.architectures = cfg.get("model_type"), list(cfg.get("architectures") or [])
    text = cfg.get("text_config") or cfg
    info.max_positions = _context(cfg)
    info.vocab_size = text.get("vocab_size") or cfg.get("vocab_size")
    info.torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype") or text.get("dtype")
    problems = []
    if info.model_type not in SUPPORTED:
        known = ", ".join(f"{k} ({'VLM' if v[1] else 'text-only'})" for k, v in SUPPORTED.items())
        problems.append((f"holds an architecture the harness does not train: model_type={info.model_type!r}, "
                         f"architectures={info.architectures}", f"use a checkpoint of {known}"))
        return info, problems
    info.family, info.is_vlm = SUPPORTED[info.model_type]
    if info.is_vlm:
        info.patch_size = (cfg.get("vision_config") or {}).get("patch_size") or (cfg.get("vision_config") or {}).get(
            "spatial_patch_size")
        info.merge_size = (cfg.get("vision_config") or {}).get("spatial_merge_size", 2)
    if not _has_weights(root):
        problems.append(("has no weights (*.safetensors, *.bin, or an index whose shards are all there)",
                         "download or copy the checkpoint completely"))
    problems += _tokenizer_problems(root)
    if info.is_vlm:
        problems += _image_processor_problems(root, info)
    if not _has_chat_template(root):
        problems.append(("has no chat template (chat_template.json, chat_template.jinja or tokenizer_config.json's "
                         "chat_template): the harness formats every prompt with it",
                         "use an instruct checkpoint, or add the template of its instruct variant"))
    return info, problems


def _context(cfg: dict) -> int | None:
    return (cfg.get("text_config") or cfg).get("max_position_embeddings") or cfg.get("max_position_embeddings")


def context_length(path: str | Path) -> int | None:
    """The positions a model dir's language model was built for (max_position_embeddings), from its config.json
    alone: known before the weights are loaded."""
    try:
        return _context(_json(Path(path) / "config.json"))
    except (OSError, ValueError):
        return None


def _has_weights(root: Path) -> bool:
    for index in root.glob("*.index.json"):
        try:
            shards = set(_json(index).get("weight_map", {}).values())
        except (OSError, ValueError):
            return False
        return bool(shards) and all((root / s).is_file() for s in shards)
    return any(p.suffix in WEIGHT_SUFFIXES and not p.name.startswith(("optimizer", "training_args", "rng_state"))
               for p in root.iterdir() if p.is_file())


def _tokenizer_problems(root: Path) -> list[tuple[str, str]]:
    if not ((root / "tokenizer.json").is_file() or ((root / "vocab.json").is_file() and (root / "merges.txt").is_file())):
        return [("has no tokenizer (tokenizer.json, or vocab.json + merges.txt)",
                 "copy the checkpoint's tokenizer files into it")]
    if (root / "tokenizer_config.json").is_file():
        try:
            _json(root / "tokenizer_config.json")
        except (OSError, ValueError) as err:
            return [(f"has an unreadable tokenizer_config.json ({err})", "restore the checkpoint's tokenizer files")]
    return []


def _image_processor_problems(root: Path, info: CheckpointInfo) -> list[tuple[str, str]]:
    pre = root / "preprocessor_config.json"
    if not pre.is_file():
        return [("is a vision-language checkpoint without preprocessor_config.json (its image processor)",
                 "copy the checkpoint's preprocessor_config.json into it")]
    try:
        p = _json(pre)
    except (OSError, ValueError) as err:
        return [(f"has an unreadable preprocessor_config.json ({err})", "restore the checkpoint's processor files")]
    size = p.get("size") or {}
    info.min_pixels = p.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
    info.max_pixels = p.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
    info.merge_size = p.get("merge_size", info.merge_size)
    info.processor_class = p.get("processor_class")
    if (root / "processor_config.json").is_file():
        try:
            info.processor_class = _json(root / "processor_config.json").get("processor_class") or info.processor_class
        except (OSError, ValueError) as err:
            return [(f"has an unreadable processor_config.json ({err})", "restore the checkpoint's processor files")]
    out = []
    if p.get("patch_size") and info.patch_size and p["patch_size"] != info.patch_size:
        out.append((f"disagrees with itself: the image processor's patch_size {p['patch_size']} vs the vision "
                    f"tower's {info.patch_size}", "restore the checkpoint's preprocessor_config.json"))
    return out


def _has_chat_template(root: Path) -> bool:
    if any((root / name).is_file() for name in TEMPLATE_FILES):
        return True
    for name in ("tokenizer_config.json", "processor_config.json"):
        try:
            if (root / name).is_file() and _json(root / name).get("chat_template"):
                return True
        except (OSError, ValueError):
            return False
    return False


def checkpoint_problems(path: str | Path, *, family: str, is_vlm: bool, patch_size: int) -> tuple[
        CheckpointInfo, list[tuple[str, str, str]]]:
    """(info, [(field, why, fix), ...]): the checkpoint's own problems plus its disagreements with the config."""
    info, own = read_checkpoint(path)
    out = [("model.path", why, fix) for why, fix in own]
    if info.family is None:
        return info, out
    if info.is_vlm != bool(is_vlm):
        kind = "a vision-language" if info.is_vlm else "a text-only"
        fix = (f"set model.is_vlm=true model.family={info.family}" if info.is_vlm else
               f"set model.is_vlm=false model.family={info.family}, or point model.path at a Qwen-VL checkpoint")
        out.append(("model.is_vlm", f"is {bool(is_vlm)} but the checkpoint at {path} is {kind} model "
                                    f"({info.model_type})", fix))
    elif info.family != family:
        extra = f" model.patch_size={info.patch_size}" if info.is_vlm and info.patch_size != patch_size else ""
        out.append(("model.family", f"is {family} but the checkpoint at {path} is {info.model_type}",
                    f"set model.family={info.family}{extra}"))
    elif info.is_vlm and info.patch_size and info.patch_size != patch_size:
        out.append(("model.patch_size", f"is {patch_size} but the checkpoint's vision tower uses "
                                        f"{info.patch_size}-pixel patches (it sizes the synthetic images)",
                    f"set model.patch_size={info.patch_size}"))
    return info, out


# --- image tokens (the Qwen-VL resize rule; torch-free, held equal to transformers' smart_resize by a test)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) a Qwen-VL image processor resizes an image to: both multiples of `factor` (patch x
    merge), the aspect ratio kept, the area within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image of {width}x{height} has an aspect ratio over 200, which Qwen-VL refuses")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(height: int, width: int, *, patch_size: int, merge_size: int, min_pixels: int,
                 max_pixels: int) -> int:
    """<|image_pad|> tokens an image of this size becomes (one per merge x merge block of patches)."""
    factor = patch_size * merge_size
    h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
    return (h // patch_size) * (w // patch_size) // (merge_size * merge_size)


# --- the processor (imports transformers)


def video_backend() -> bool:
    """Can transformers build a Qwen-VL video processor here (torchvision importable)?"""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA build next to CPU torch: "operator torchvision::nms does not exist"
        return False
    return True


_IMAGE_ONLY: dict[type, type] = {}


def image_only(stock: type) -> type:
    """`stock` (a Qwen-VL ProcessorMixin class) without its video processor: the same class name, `__init__`
    and `__call__`; ProcessorMixin reads the sub-processors off `__init__`'s signature, so one without
    `video_processor` never builds, saves or loads one."""
    if stock in _IMAGE_ONLY:
        return _IMAGE_ONLY[stock]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The stock __init__ does the token bookkeeping, then ProcessorMixin.__init__(image_processor, tokenizer,
        # video_processor, ...), which pairs positional sub-processors with get_attributes() (image_processor,
        # tokenizer here): the video processor's slot (None) is left over and dropped.
        stock.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, audio=None, **kwargs):
        if videos is not None:
            raise ValueError(f"this {stock.__name__} is image-only (torchvision is missing, so no video processor); "
                             "pass images, or run where torchvision imports")
        dedupe = self.__dict__.get("_harness_row_dedupe")  # model.dedupe_rows (harness.models.fastvision)
        if dedupe is not None:
            return dedupe(super(cls, self).__call__, images=images, text=text, audio=audio, **kwargs)
        return super(cls, self).__call__(images=images, text=text, audio=audio, **kwargs)

    cls = type(stock.__name__, (stock,), {"__init__": __init__, "__call__": __call__, "__module__": __name__,
                                          "__doc__": f"{stock.__name__} without a video processor (harness)",
                                          "harness_image_only": True})
    _IMAGE_ONLY[stock] = cls
    return cls


def stock_processor_class(path: str | Path):
    """The checkpoint's processor class (processor_class in processor_config.json or preprocessor_config.json)."""
    import transformers

    name = processor_class_of(Path(path))
    if name is None:  # a folder without processor_class (an adapter dir has no config.json: it names its class)
        model_type = _json(Path(path) / "config.json").get("model_type") or ""
        name = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                "qwen3_vl": "Qwen3VLProcessor"}.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise ValueError(f"its processor class {name!r} is not one transformers {transformers.__version__} has")
    return cls


def pixel_kwargs(min_pixels: int | None, max_pixels: int | None) -> dict:
    return {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}


def load_processor(path: str | Path, *, min_pixels: int | None = None, max_pixels: int | None = None,
                   stock: bool | None = None):
    """A Qwen-VL checkpoint's processor, left-padding for generation (a text-only checkpoint's tokenizer is
    AutoTokenizer's: harness.policy.load_processing).

    `stock`: None = the stock AutoProcessor where torchvision imports, else the image-only one; True / False force
    one (tests compare the two)."""
    if importlib.util.find_spec("torchvision") is not None and not video_backend():
        # transformers takes torchvision for present when it is installed at all, and then cannot even import its
        # image processors: say so instead of its "Could not import module 'AutoImageProcessor'"
        raise ImportError("torchvision is installed but does not import next to this torch (a CUDA build of "
                          "torchvision with the CPU torch wheel?): pip uninstall torchvision, or install a matching "
                          "torch / torchvision pair")
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    path = str(path)
    if stock is None:
        stock = video_backend()
    if stock:
        proc = AutoProcessor.from_pretrained(path)
    else:
        cls = image_only(stock_processor_class(path))
        tok = AutoTokenizer.from_pretrained(path)
        proc = cls(image_processor=AutoImageProcessor.from_pretrained(path), tokenizer=tok,
                   chat_template=_chat_template(Path(path), tok))
    # On the image processor only: passed to from_pretrained they also land in the tokenizer's init kwargs, which
    # re-sends them with every call (a deprecation warning per call) and saves them into tokenizer_config.json.
    set_pixels(proc.image_processor, min_pixels, max_pixels)
    proc.tokenizer.padding_side = "left"  # generation pads prompts on the left; TRL's collators pad explicitly
    return proc


def set_pixels(image_processor, min_pixels: int | None = None, max_pixels: int | None = None) -> None:
    """model.min_pixels / max_pixels on a loaded Qwen-VL image processor (the `size` bounds its resize reads)."""
    if min_pixels is None and max_pixels is None:
        return
    size = dict(image_processor.size)
    if min_pixels is not None:
        size["shortest_edge"] = min_pixels
    if max_pixels is not None:
        size["longest_edge"] = max_pixels
    image_processor.size = size if isinstance(image_processor.size, dict) else type(image_processor.size)(**size)


def _chat_template(root: Path, tok) -> str | None:
    """The processor's chat template as ProcessorMixin.from_pretrained finds it: chat_template.jinja, then
    chat_template.json, then the tokenizer's."""
    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text(encoding="utf-8")
    if (root / "chat_template.json").is_file():
        return _json(root / "chat_template.json").get("chat_template")
    return getattr(tok, "chat_template", None)


def processor_class_of(root: Path) -> str | None:
    """processor_class from processor_config.json, else preprocessor_config.json (None when neither says)."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        try:
            if (root / name).is_file() and (found := _json(root / name).get("processor_class")):
                return found
        except (OSError, ValueError):
            continue
    return None


def is_harness_processor(path: str | Path) -> bool:
    """Does `path` hold the tiny models' HarnessVLProcessor (processor_config.json names it)?"""
    cfg = Path(path) / "processor_config.json"
    try:
        return cfg.is_file() and _json(cfg).get("processor_class") == "HarnessVLProcessor"
    except (OSError, ValueError):
        return False


# --- identity (torch-free): what a run records of its checkpoint, and what a resume compares

HASH_CHUNK = 1 << 22
MEMO_MIN_BYTES = 1 << 24  # files of 16 MB and more are memoized


def _digest_memo() -> Path | None:
    from harness.usercache import user_cache_dir

    root = user_cache_dir()
    return root / "digests" if root is not None else None


def file_sha256(path: Path) -> tuple[str, str]:
    """(sha256 of the file, how it was found): a hub cache blob is named by its sha256 (a snapshot's weights are
    symlinks to blobs/<sha256>); otherwise hashed once and memoized by (real path, size, mtime) under the user's
    harness cache (0.65 s per GiB from the page cache, measured on the 2-core dev machine)."""
    import hashlib
    import os
    import re

    real = Path(os.path.realpath(path))
    if real.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", real.name):
        return real.name, "hub blob name"
    st = real.stat()
    memo_dir = _digest_memo() if st.st_size >= MEMO_MIN_BYTES else None  # small files: hashing is cheaper
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode()).hexdigest()
    memo = memo_dir / f"{key}.sha256" if memo_dir else None
    if memo is not None and memo.is_file():
        return memo.read_text().strip(), "memoized"
    h = hashlib.sha256()
    with open(real, "rb") as fh:
        while block := fh.read(HASH_CHUNK):
            h.update(block)
    digest = h.hexdigest()
    if memo is not None:
        try:
            memo_dir.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(digest)
            os.replace(tmp, memo)
        except OSError:
            pass  # an unwritable cache only costs the next plan the hash
    return digest, "hashed"


def checkpoint_identity(path: str | Path) -> dict:
    """{"files": {name: {"sha256", "size"}}, "files_sha256"}: every file of the checkpoint directory (weights,
    config, tokenizer, processor files; not *.md or hidden files), one digest over the sorted
    list (the same form as a tiny model's identity)."""
    import hashlib

    root = Path(path)
    files = {}
    for p in sorted(root.iterdir()):
        if not p.is_file() or p.name.startswith(".") or p.suffix.lower() == ".md":
            continue
        digest, _ = file_sha256(p)
        files[p.name] = {"sha256": digest, "size": p.stat().st_size}
    listing = json.dumps([[k, files[k]["sha256"], files[k]["size"]] for k in sorted(files)], separators=(",", ":"))
    return {"files": files, "files_sha256": hashlib.sha256(listing.encode()).hexdigest()}

"""A final policy that loads without the harness (issue 16): what save_final_policy adds to the folder the
Trainer wrote, before its manifest. Torch-free (files and JSON only).

    AutoProcessor.from_pretrained(dir, trust_remote_code=True)   # an image-only processor: no torchvision needed
    AutoModelForImageTextToText.from_pretrained(dir)             # full weights, or a LoRA adapter + its base

- The processor: the tiny VLMs save HarnessVLProcessor, a class transformers does not know (harness/models/
  processor.py says why it exists). Its module ships in the folder as `processing_harness_vl.py` with
  `auto_map` in processor_config.json, the Hugging Face way for custom code, so a process that never imports the
  harness builds the same class with trust_remote_code=True. Inside the harness the registered class wins
  (transformers prefers a known local class over remote code), so nothing changes there.
- A real Qwen-VL checkpoint's processor: the folder keeps the checkpoint's own processor files (its stock
  processor_class included) and ships the same module, with an auto_map in processor_config.json naming the image-only
  form of that stock class (IMAGE_ONLY; harness/models/processor.py). transformers picks remote code over a stock
  class only when asked: `trust_remote_code=True` builds the image-only class (no torchvision needed, the stock
  class's outputs: harness.models.parity), without it the stock class is built where torchvision imports, as from
  the checkpoint itself. processor_class stays the stock name for that reason, and because the harness's own
  load_policy reads it (harness.models.pretrained.stock_processor_class): it loads the folder as before.
- The base of a LoRA adapter (peft records the local path it loaded, a cache path on this machine):
  a real checkpoint's adapter names model.hub_id when the weights came from the HF cache under it, else model.path
  (the card names the same base: harness.card.trained_base); a tiny base, which is on no hub, is copied into the folder
  (config.json, generation_config.json, model.safetensors: ~4 MB). transformers loads a folder that holds a
  model and an adapter as that base plus the adapter, from any working directory; base_model_name_or_path
  is "." (this folder), or train.hub_model_id when the folder is pushed (the repo then holds the base too).
  A relative path to the model cache would resolve against the reader's working directory, not the folder.
  peft 0.21 has no AutoPeftModelForImageTextToText, and AutoPeftModelForCausalLM refuses VL configs, so
  AutoModelForImageTextToText (transformers' PEFT integration) and PeftModel.from_pretrained(base, dir) are
  the VLM routes; both are tested (tests/integration/test_portable_policy.py).
- The copied base files are listed under `base_files` in harness_policy.json: verified with the rest, left out
  of weights_digest (the policy's own weights; the base has identity.model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.rundir import atomic_write_bytes, atomic_write_json, read_json

if TYPE_CHECKING:
    from harness.config.schema import ModelConfig, TrainConfig

PROCESSOR_CLASS = "HarnessVLProcessor"
PROCESSOR_CODE = "processing_harness_vl.py"
PROCESSOR_SOURCE = Path(__file__).resolve().parent / "models" / "processor.py"
#: a real checkpoint's stock processor_class -> its image-only form in PROCESSOR_SOURCE (spelled out here: this module
#: is torch-free and cannot import that one; tests/unit/test_portable_qwen.py keeps the two in step)
IMAGE_ONLY = {"Qwen2VLProcessor": "Qwen2VLImageOnlyProcessor", "Qwen2_5_VLProcessor": "Qwen2_5_VLImageOnlyProcessor",
              "Qwen3VLProcessor": "Qwen3VLImageOnlyProcessor"}
#: model_type -> stock processor class, for a checkpoint whose processor files do not name one
STOCK_PROCESSOR = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors")


def ship_processor_code(folder: Path) -> str | None:
    """The custom processor's module and auto_map into `folder`; its file name, or None (a stock processor or a
    tokenizer: nothing to ship)."""
    cfg_path = folder / "processor_config.json"
    if not cfg_path.is_file():
        return None
    cfg = read_json(cfg_path)
    if cfg.get("processor_class") != PROCESSOR_CLASS:
        return None
    return _ship(folder, cfg, PROCESSOR_CLASS)


def _ship(folder: Path, cfg: dict, cls: str) -> str:
    """The module into `folder` and processor_config.json = `cfg` with an auto_map naming `cls` in it."""
    atomic_write_bytes(folder / PROCESSOR_CODE, PROCESSOR_SOURCE.read_bytes())
    cfg["auto_map"] = {"AutoProcessor": f"{PROCESSOR_CODE.removesuffix('.py')}.{cls}"}
    atomic_write_json(folder / "processor_config.json", cfg)
    return PROCESSOR_CODE


def ship_image_only_code(folder: Path, base_path: str) -> str | None:
    """A real Qwen-VL checkpoint's final policy (its own processor files already copied in): the module and an
    auto_map naming the image-only form of the checkpoint's processor class; None for a text-only checkpoint.
    processor_config.json is the checkpoint's own when it has one, else {processor_class, auto_map}: with no nested
    sub-processor configs in it transformers reads the image processor from preprocessor_config.json as before."""
    cfg_path = folder / "processor_config.json"
    cfg = read_json(cfg_path) if cfg_path.is_file() else {}
    stock = cfg.get("processor_class")
    if not stock and (folder / "preprocessor_config.json").is_file():
        stock = read_json(folder / "preprocessor_config.json").get("processor_class")
    if not stock and (Path(base_path) / "config.json").is_file():  # an adapter folder has no config.json
        stock = STOCK_PROCESSOR.get(read_json(Path(base_path) / "config.json").get("model_type"))
    if stock not in IMAGE_ONLY:
        return None
    # the stock name stays: AutoProcessor without trust_remote_code builds it (where torchvision imports)
    return _ship(folder, {"processor_class": stock, **cfg}, IMAGE_ONLY[stock])


def adapter_base(model_cfg: ModelConfig, train_cfg: TrainConfig, base_path: str) -> dict:
    """Where a LoRA adapter's base comes from: {"base_model_name_or_path", "embed", "portable", "note"}."""
    if model_cfg.source == "tiny":
        pushed = train_cfg.push_to_hub and train_cfg.hub_model_id
        return {"base_model_name_or_path": train_cfg.hub_model_id if pushed else ".", "embed": True,
                "portable": True, "note": "the tiny base is stored in this folder (config.json, model.safetensors)"}
    if model_cfg.hub_id and not model_cfg.path:  # found in the HF cache under that id
        return {"base_model_name_or_path": model_cfg.hub_id, "embed": False, "portable": True,
                "note": f"the base is the Hugging Face model {model_cfg.hub_id}"}
    return {"base_model_name_or_path": base_path, "embed": False, "portable": False,
            "note": f"the base is the local checkpoint {base_path} (model.path): copy it along, or set model.hub_id "
                    "to name a hub model"}


#: A real checkpoint's processor and tokenizer files: a final policy carries the checkpoint's own, so it loads
#: wherever the checkpoint loads (with torchvision, AutoProcessor builds the stock Qwen-VL processor from them).
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "preprocessor_config.json", "video_preprocessor_config.json",
                   "processor_config.json", "chat_template.json", "chat_template.jinja")


def copy_checkpoint_processor(folder: Path, base_path: str, model_cfg: ModelConfig) -> list[str]:
    """Replace the processor files the Trainer saved in `folder` by the checkpoint's own (a pretrained model):
    the image-only processor the harness builds without torchvision saves transformers 5's form without a video
    processor, which the stock AutoProcessor cannot rebuild. model.min_pixels / max_pixels, when set, go into
    preprocessor_config.json (what the policy was trained with). Returns the files copied."""
    base = Path(base_path)
    for name in PROCESSOR_FILES:
        if (folder / name).is_file():
            (folder / name).unlink()
    copied = []
    for name in PROCESSOR_FILES:
        if (base / name).is_file():
            atomic_write_bytes(folder / name, (base / name).read_bytes())
            copied.append(name)
    pre = folder / "preprocessor_config.json"
    pixels = {k: getattr(model_cfg, k) for k in ("min_pixels", "max_pixels") if getattr(model_cfg, k) is not None}
    if pixels and pre.is_file():
        cfg = read_json(pre)
        if isinstance(cfg.get("size"), dict):
            cfg["size"].update({{"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}[k]: v
                                for k, v in pixels.items()})
        for k, v in pixels.items():
            if k in cfg or not isinstance(cfg.get("size"), dict):
                cfg[k] = v
        atomic_write_json(pre, cfg)
    return copied


def make_portable(folder: Path, *, model_cfg: ModelConfig, train_cfg: TrainConfig, base_path: str) -> dict:
    """Ship the processor code (with a real checkpoint's own processor files) and, for an adapter, name (or embed)
    its base; what harness_policy.json records under `portable` (and `base_files`)."""
    if model_cfg.source == "pretrained":
        files = copy_checkpoint_processor(folder, base_path, model_cfg)
        out = {"processor_code": ship_image_only_code(folder, base_path), "base_files": [], "processor_files": files}
    else:
        out = {"processor_code": ship_processor_code(folder), "base_files": []}
    adapter_cfg = folder / "adapter_config.json"
    if not adapter_cfg.is_file():
        return out
    base = adapter_base(model_cfg, train_cfg, base_path)
    if base.pop("embed"):
        for name in BASE_FILES:
            src = Path(base_path) / name
            if src.is_file():
                atomic_write_bytes(folder / name, src.read_bytes())
                out["base_files"].append(name)
    cfg = json.loads(adapter_cfg.read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = base["base_model_name_or_path"]
    atomic_write_json(adapter_cfg, cfg)
    return {**out, "adapter_base": base}

"""The policy a run trains: base model, init (sft warm start, scratch, or a path), tuning, device, final save.

    build_policy(plan, ...)  -> Policy: the base model (built and cached, or found), the init, tuning (LoRA or
                                full) and the device, bound to the run's recorded model digest; the preflight
                                runs with the processor, before the weights load

    init=sft      the final policy of the plan's parent: the SFT run of the same command line
                  (harness.plan.sft_parent), which the lifecycle runs first
    init=scratch  the base model as built (tiny: seeded random weights) or loaded
    init=<path>   a saved policy: a PEFT adapter (adapter_config.json) or full weights

final_policy/ holds what was trained: the PEFT adapter for tuning=lora, the full model's
safetensors for tuning=full, plus the processor; both load back with `load_policy(path)`, and without the
harness with plain transformers (harness.portable: the tiny processor's code, an adapter's base) and a model
card, README.md (harness.card: provisional at the save, final after the final eval).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness import dist
from harness.accounting.weights import (  # noqa: F401  (their documented import path: harness.policy)
    NOT_WEIGHTS, POLICY_FILES, POLICY_MANIFEST, WEIGHT_SUFFIXES, final_policy_identity, is_policy_dir, is_weight_file,
    weights_digest, weights_digest_of_files)
from harness.card import CARD, provisional_card
from harness.errors import FieldDiff, ResumeMismatchError
from harness.faults import point
from harness.identity import sha256_file
from harness.portable import make_portable
from harness.rundir import atomic_write_bytes, atomic_write_json, fsync_dir, read_json

if TYPE_CHECKING:
    from harness.config.schema import ModelConfig

log = logging.getLogger("harness")


@dataclass(frozen=True)
class Policy:
    model: object
    processor: object
    base_path: str  # the built or loaded base model directory
    base_identity: dict
    init: dict  # {"kind": sft|scratch|path, "path": ..., "parent_run": ...}
    device: str  # where it trains (placement.device resolved for this process: device_of)
    suppress_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: list[int] = field(default_factory=list)


def eos_token_ids(processor, model=None) -> list[int]:
    """The ids that end a completion: Qwen's <|im_end|> when the vocabulary has it, else the EOS token; then every
    EOS id the model's generation config declares (a released Qwen-VL: [<|im_end|>, <|endoftext|>]), as TRL
    stops on them too."""
    tok = getattr(processor, "tokenizer", processor)
    out = [tok.convert_tokens_to_ids("<|im_end|>")] if "<|im_end|>" in tok.get_vocab() else [tok.eos_token_id]
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for i in [declared] if isinstance(declared, int) else (declared or []):
        if i not in out:
            out.append(i)
    return out


def device_of(plan) -> str:
    """The device the plan's process trains on (placement.device resolved: device_for)."""
    return device_for(plan.cfg.placement.device)


def device_for(want: str) -> str:
    """A placement.device value (auto | cpu | cuda) resolved for this process."""
    import torch

    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and "LOCAL_RANK" in os.environ:  # a rank of a multi-process launch: its own GPU
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return want


def build_base(plan, corpus: list[str]) -> tuple[str, dict]:
    """The base model directory and its identity (tiny: built and cached; pretrained: as found)."""
    m = plan.cfg.model
    if m.source == "tiny":
        from harness.models import build_tiny, model_identity

        path = build_tiny(family=m.family, is_vlm=m.is_vlm, patch_size=m.patch_size, tiny=m.tiny,
                          corpus=corpus, cache_dir=m.cache_dir)
        return str(path), model_identity(path)
    path = plan.checkpoint_dir
    return path, dict(plan.identity["model"])


def load_policy(path: str | Path, *, base_path: str | None = None, trainable: bool = True,
                model_cfg: ModelConfig | None = None):
    """(model, processor) from a saved policy: a full model dir, or a PEFT adapter over `base_path`.

    `model_cfg` (the plan's typed `cfg.model`; a run manifest's config["model"] is read back through the schema
    first, `harness.config.typed.from_json(ModelConfig, ...)`): the weights' dtype and attention backend, and the
    processor's model.min_pixels / model.max_pixels; without it, the checkpoint's own (`dtype="auto"`)."""
    return (load_policy_model(path, base_path=base_path, trainable=trainable, model_cfg=model_cfg),
            load_policy_processor(path, base_path=base_path, model_cfg=model_cfg))


def policy_base(path: Path, base_path: str | None) -> str | None:
    """The base model dir of a saved policy: an adapter's base (`base_path`, else its manifest's), else base_path."""
    if (path / "adapter_config.json").is_file():
        return base_path or read_json(path / POLICY_MANIFEST)["base_path"]
    return base_path


def load_policy_model(path: str | Path, *, base_path: str | None = None, trainable: bool = True,
                      model_cfg: ModelConfig | None = None):
    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        return _auto_model(str(path), model_cfg)
    from peft import PeftModel

    return PeftModel.from_pretrained(_auto_model(policy_base(path, base_path), model_cfg), str(path),
                                     is_trainable=trainable)


def load_policy_processor(path: str | Path, *, base_path: str | None = None,
                          model_cfg: ModelConfig | None = None):
    """The processor a saved policy runs with. A run on a real checkpoint takes that checkpoint's own processor files,
    whatever the policy dir holds: a Trainer checkpoint holds what the image-only processor saves (no video
    processor), which the stock AutoProcessor cannot rebuild."""
    path, base = Path(path), policy_base(Path(path), base_path)
    if model_cfg is not None and model_cfg.source == "pretrained" and base:
        return load_processing(Path(base), model_cfg)
    return load_processing(path if (path / "tokenizer_config.json").exists() else Path(base), model_cfg)


def load_processing(path: Path, m: ModelConfig | None):
    """The processor (a tokenizer for text-only models) saved in `path`: the tiny models' HarnessVLProcessor
    through AutoProcessor, a real checkpoint's through harness.models.pretrained (image-only without torchvision)."""
    import harness.models  # noqa: F401  (registers the image-only processor with AutoProcessor)
    from harness.models.pretrained import is_harness_processor, load_processor, set_pixels

    lo, hi = (m.min_pixels, m.max_pixels) if m is not None else (None, None)
    if is_harness_processor(path) or not _is_vlm_dir(path):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(path))
        if hasattr(processor, "image_processor"):
            set_pixels(processor.image_processor, lo, hi)
        else:
            processor.padding_side = "left"  # a tokenizer: generation pads prompts on the left
        return processor
    return load_processor(path, min_pixels=lo, max_pixels=hi)


def _is_vlm_dir(path: Path) -> bool:
    return (path / "preprocessor_config.json").is_file() or (path / "processor_config.json").is_file()


def _auto_model(path: str, m: ModelConfig | None = None):
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = json.loads((Path(path) / "config.json").read_text())
    is_vlm = "vision_config" in cfg
    cls = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
    kw = {"attn_implementation": m.attn_implementation} if m is not None and m.attn_implementation else {}
    return cls.from_pretrained(path, dtype=m.dtype.value if m is not None else "auto", **kw)


def apply_tuning(model, plan):
    m = plan.cfg.model
    if m.tuning != "lora" or hasattr(model, "peft_config"):
        return model
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                     target_modules=list(m.lora_target_modules), task_type="CAUSAL_LM")
    # ZeRO-3 gathers parameters into buffers of the first persistent parameter's dtype: PEFT's default fp32
    # upcast of the adapter next to a bf16 base fails at the first optimizer step (TRL applies the same fix
    # when it wraps the model itself; the harness wraps it here). NOTE(trl-1.16) grpo_trainer.py.
    kw = {"autocast_adapter_dtype": False} if plan.cfg.placement.zero_stage == 3 else {}
    return get_peft_model(model, cfg, **kw)


def init_of(plan, base_path: str) -> dict:
    """Where the trained policy starts: {"kind": sft | scratch | path, "path": ...} (sft: the parent's)."""
    init = plan.kind.policy_init(plan.cfg)
    if init in (None, "scratch"):
        return {"kind": "scratch", "path": base_path}
    if init == "sft":
        parent_dir = Path(plan.parent.run_dir)
        return {"kind": "sft", "path": str(parent_dir / "final_policy"), "parent_run": plan.parent.run_name,
                "parent_run_dir": str(parent_dir)}
    return {"kind": "path", "path": init}


def fast_vision(model, processor, m: ModelConfig) -> None:
    """model.dedupe_rows (the tiny models' processor), model.share_vision_features and model.rope_cache (a loaded
    Qwen2-VL / Qwen2.5-VL) from harness.models.fastvision; other models and processors as they are."""
    if not m.is_vlm:
        return
    from harness.models import fastvision

    fastvision.install(model, share_vision_features=m.share_vision_features, rope_cache=m.rope_cache)
    fastvision.dedupe_rows(processor, m.dedupe_rows)


def build_policy(plan, recorded: dict, corpus: list[str], run_dir: str, preflight=None) -> Policy:
    """The policy to train; `recorded` is the run's identity.model (a changed model refuses, exit 4). `preflight`
    (processor, context length) runs with the processor before the weights are loaded: a prompt that does not fit
    is refused without waiting for a large model to load."""
    from harness.models import imagecache
    from harness.models.pretrained import context_length

    base_path, base_ident = dist.main_first(build_base, plan, corpus)  # rank 0 builds the cached model
    files = recorded.get("files_sha256")
    if files and base_ident.get("files_sha256") and files != base_ident["files_sha256"]:
        raise ResumeMismatchError(run_dir, [FieldDiff("identity.model.files_sha256", files,
                                                      base_ident["files_sha256"])],
                                  "the model files changed since this run started; restore them, or start a new "
                                  "run (another output_root)")
    init = init_of(plan, base_path)
    m = plan.cfg.model
    processor = load_policy_processor(init["path"], base_path=base_path, model_cfg=m)
    if preflight is not None:
        preflight(processor, context_length(base_path))
    model = load_policy_model(init["path"], base_path=base_path, model_cfg=m)
    imagecache.install(processor, m.image_cache_mb)
    fast_vision(model, processor, m)
    model = apply_tuning(model, plan)
    device = device_of(plan)
    model.to(device)
    return Policy(model, processor, base_path, base_ident, init, device, never_sampled(model, processor),
                  eos_token_ids(processor, model))


def never_sampled(model, processor) -> list[int]:
    """Token ids generation must never produce: the vision and chat specials, and the rows past the tokenizer."""
    from harness.models import special_token_ids_to_suppress

    return special_token_ids_to_suppress(processor) + rows_past_the_tokenizer(model, processor)


def rows_past_the_tokenizer(model, processor) -> list[int]:
    """Output rows no token of the tokenizer has: a released Qwen checkpoint pads its 151,665 tokens to 151,936
    rows. They are never sampled (a trained model gives them ~no mass; a random one would sample ids that decode
    to nothing)."""
    tok = getattr(processor, "tokenizer", processor)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rows = getattr(cfg, "vocab_size", None) or 0
    return list(range(len(tok), rows))


def save_final_policy(trainer, run_dir: Path, *, base_path: str, plan) -> dict:
    """Save the trained policy atomically (temp dir, rename) with a digest manifest written last."""
    final = run_dir / "final_policy"
    tmp = run_dir / ".final_policy.partial"  # one path for every rank: sharded saves (FSDP) need them all
    if dist.is_main():
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    trainer.save_model(str(tmp))  # writes on the main process only (Trainer.args.should_save)
    dist.barrier()
    if not dist.is_main():
        return None
    proc = trainer.processing_class
    proc.save_pretrained(str(tmp))
    portable = make_portable(tmp, model_cfg=plan.cfg.model, train_cfg=plan.cfg.train, base_path=base_path)
    atomic_write_bytes(tmp / CARD, provisional_card(plan).encode("utf-8"))  # replaced after the final eval
    files = {str(p.relative_to(tmp)): {"sha256": sha256_file(p), "size": p.stat().st_size}
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"tuning": plan.cfg.model.tuning.value, "base_path": base_path, "run_name": plan.run_name,
                "identity": {k: plan.identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model")},
                "files": files, "base_files": portable.pop("base_files"), "portable": portable,
                "card": "provisional",  # harness.card.publish_card: "final", after the final eval
                "load": "harness.policy.load_policy(path); without the harness: docs/training.md, section "
                        "Training, accounting and the policy"}
    atomic_write_json(tmp / POLICY_MANIFEST, manifest)
    point(f"{plan.kind}.final_policy")  # tests only (harness.faults): a crash before the rename
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    fsync_dir(run_dir)
    return manifest

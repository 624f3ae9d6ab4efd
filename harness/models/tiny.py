"""Tiny local models: build (or find in the cache) a seeded random Qwen-VL / Qwen2 model with a
locally trained tokenizer and an image-only processor; load it; state its identity.

Sizes (docs/platform.md "Tiny local VLMs"): text hidden 128, 4 layers, 4 heads / 2 KV heads, head_dim
32, M-RoPE sections summing to head_dim/2; vision width 64, depth 2, spatial merge 2; about
1.1-1.3 M parameters, 4-5 MB on disk. Full fine-tuning only (LoRA on a random base gives GRPO no
reward signal, measured).

Cache: `<cache_dir>/tiny-<family>-<key12>/`, where key = sha256 of the canonical JSON of every
build parameter, the digest of the tokenizer corpus and BUILDER_VERSION. A build writes into a
temp dir next to the target, fsyncs, writes `harness_model.json` LAST (build parameters, corpus
digest, every file's sha256 and size, `files_sha256` over the sorted file list), then renames.
A dir without a valid manifest never counts. Two concurrent builders both build; the loser of the
rename race discards its copy and uses the winner's (same key, and builds are deterministic).

Determinism: torch is seeded with init_seed right before the model is constructed, weights are
float32 safetensors, the BPE is trained on the sorted unique corpus lines; same parameters ->
byte-identical files (tests compare two builds in separate processes).

Weights are saved under the in-memory key names (`save_original_format=False`): the stock
Qwen-VL on-disk names (`visual.*`, `model.layers.*`) are what makes Trainer's strict=False resume
load 0 tensors (docs/platform.md "Resume pitfalls"); AutoModelForImageTextToText reloads the
in-memory names bitwise (tested).

Torch-free at import: `tiny_key`, `tiny_model_dir` and `model_identity` use only the stdlib, so
planning can name and verify a model without torch; building and loading import it inside.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.errors import HarnessError
from harness.identity import canonical_json
from harness.models.tokenizer import corpus_lines

#: Bump when a change here changes the built files for the same parameters (it keys the cache).
BUILDER_VERSION = "2"  # 2: BPE merges with min_frequency=1 (whole-word answers)
MANIFEST = "harness_model.json"
VLM_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEXT_FAMILIES = ("qwen2",)
TINY_FIELDS = (
    "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
    "vision_width", "vision_depth", "vocab_size", "init_seed",
)  # fmt: skip
VISION_HEAD_DIM = 16  # vision heads = vision_width / 16 (4 heads at width 64)


class ModelCacheError(HarnessError):
    """A cached or given model dir is not what its manifest says (files changed, missing, corrupt)."""


# --- keys and names (torch-free)


def _canonical(obj: Any) -> bytes:
    return canonical_json(obj).encode("utf-8")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _family_name(family: Any) -> str:
    return str(getattr(family, "value", family))  # accepts the schema's Family enum or a string


def normalize_tiny(tiny: Any) -> dict[str, int]:
    """TinySpec (dataclass, DictConfig or mapping) -> plain dict of exactly TINY_FIELDS."""
    if dataclasses.is_dataclass(tiny) and not isinstance(tiny, type):
        tiny = dataclasses.asdict(tiny)
    elif not isinstance(tiny, Mapping):
        tiny = dict(tiny)  # an OmegaConf DictConfig
    got = set(tiny)
    missing, unknown = sorted(set(TINY_FIELDS) - got), sorted(got - set(TINY_FIELDS))
    if missing or unknown:
        raise ValueError(
            f"model.tiny has missing fields {missing} and unknown fields {unknown}; expected exactly "
            f"{list(TINY_FIELDS)} (harness.config.schema.TinySpec)."
        )
    return {k: int(tiny[k]) for k in TINY_FIELDS}


def build_params(*, family: Any, is_vlm: bool, patch_size: int, tiny: Any) -> dict:
    """Everything that determines the built files, except the corpus; validated."""
    family = _family_name(family)
    spec = normalize_tiny(tiny)
    errors = []
    if family not in VLM_FAMILIES + TEXT_FAMILIES:
        errors.append(f"model.family ({family!r}) must be one of {list(VLM_FAMILIES + TEXT_FAMILIES)}")
    elif bool(is_vlm) != (family in VLM_FAMILIES):
        errors.append(f"model.is_vlm ({is_vlm}) contradicts model.family ({family}); "
                      f"{family} is {'a VLM' if family in VLM_FAMILIES else 'text-only'}")
    if spec["num_heads"] % spec["num_kv_heads"]:
        errors.append(f"tiny.num_kv_heads ({spec['num_kv_heads']}) must divide tiny.num_heads ({spec['num_heads']})")
    if spec["head_dim"] % 4:
        errors.append(f"tiny.head_dim ({spec['head_dim']}) must be a multiple of 4 (three M-RoPE sections of head_dim/2)")
    if family in ("qwen2", "qwen2_vl", "qwen2_5_vl") and spec["hidden_size"] != spec["num_heads"] * spec["head_dim"]:
        errors.append(
            f"tiny.head_dim ({spec['head_dim']}) must equal hidden_size/num_heads "
            f"({spec['hidden_size']}/{spec['num_heads']}) for {family}: its attention derives head_dim from them"
        )
    if family in VLM_FAMILIES and spec["vision_width"] % VISION_HEAD_DIM:
        errors.append(f"tiny.vision_width ({spec['vision_width']}) must be a multiple of {VISION_HEAD_DIM} (vision head size)")
    if errors:
        raise ValueError("; ".join(errors) + ".")
    if family in TEXT_FAMILIES:
        # The vision fields and the patch size do not reach a text-only model: keep them out of the
        # key so tiny_lm has one cache entry whatever they say.
        spec = {k: v for k, v in spec.items() if k not in ("vision_width", "vision_depth")}
        patch_size = None
    return {"family": family, "is_vlm": bool(is_vlm), "patch_size": patch_size, "tiny": spec}


def tiny_key(*, family: Any, is_vlm: bool, patch_size: int, tiny: Any, corpus: Iterable[str]) -> dict:
    """{"key", "params", "corpus_sha256", "corpus_lines"}: the cache key of a tiny model (torch-free)."""
    lines = corpus_lines(corpus)
    corpus_sha = hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()
    params = build_params(family=family, is_vlm=is_vlm, patch_size=patch_size, tiny=tiny)
    key = hashlib.sha256(
        _canonical({"builder_version": BUILDER_VERSION, "params": params, "corpus_sha256": corpus_sha})
    ).hexdigest()
    return {"key": key, "params": params, "corpus_sha256": corpus_sha, "corpus_lines": len(lines)}


def tiny_model_dir(cache_dir: str | os.PathLike, *, family: Any, key: str) -> Path:
    return Path(cache_dir) / f"tiny-{_family_name(family)}-{key[:12]}"


# --- manifest and identity (torch-free)


def _file_table(root: Path) -> dict[str, dict]:
    """{relative path: {"sha256", "size"}} of every file under root except the manifest."""
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != MANIFEST:
            table[rel] = {"sha256": _sha256_file(path), "size": path.stat().st_size}
    return table


def files_digest(table: Mapping[str, Mapping]) -> str:
    """One digest over the sorted (path, sha256, size) list: the model's identity."""
    return hashlib.sha256(_canonical([[k, table[k]["sha256"], table[k]["size"]] for k in sorted(table)])).hexdigest()


def read_manifest(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelCacheError(
            f"{path} has no {MANIFEST}: it is not a complete tiny-model build (a build publishes the manifest "
            f"last). Delete the dir and build again (harness.models.build_tiny)."
        ) from None
    except json.JSONDecodeError as err:
        raise ModelCacheError(f"{path / MANIFEST} is not valid JSON ({err}); delete {path} and build again.") from None


def verify_files(path: str | os.PathLike, manifest: Mapping) -> list[str]:
    """Differences between the dir's files and its manifest (empty when they match)."""
    have, want = _file_table(Path(path)), manifest.get("files", {})
    problems = [f"{k}: missing" for k in sorted(set(want) - set(have))]
    problems += [f"{k}: not in the manifest" for k in sorted(set(have) - set(want))]
    problems += [
        f"{k}: sha256 {have[k]['sha256'][:12]}... size {have[k]['size']}, manifest says "
        f"{want[k]['sha256'][:12]}... size {want[k]['size']}"
        for k in sorted(set(have) & set(want)) if have[k] != dict(want[k])
    ]  # fmt: skip
    if not problems and files_digest(want) != manifest.get("files_sha256"):
        problems.append("files_sha256 does not match the manifest's own file table")
    return problems


def model_identity(path: str | os.PathLike, *, verify: bool = False) -> dict:
    """The identity of a built tiny model, read from its manifest; `verify=True` re-hashes every
    file and raises ModelCacheError on any difference."""
    manifest = read_manifest(path)
    if verify and (problems := verify_files(path, manifest)):
        raise ModelCacheError(f"{path} does not match its {MANIFEST}: " + "; ".join(problems) +
                              ". Delete the dir and build again.")  # fmt: skip
    keep = ("key", "builder_version", "params", "corpus_sha256", "files_sha256", "architecture",
            "num_parameters", "vocab_size")  # fmt: skip
    return {"source": "tiny", "name": Path(path).name, **{k: manifest.get(k) for k in keep}, "verified": verify}


# --- building


def _mrope_section(family: str, head_dim: int) -> list[int]:
    """Three M-RoPE sections (t, h, w) summing to head_dim/2, in the released models' proportions:
    Qwen2/2.5-VL [16, 24, 24] and Qwen3-VL [24, 20, 20] at head_dim 128."""
    half = head_dim // 2
    if family == "qwen3_vl":
        hw = half * 5 // 16
        return [half - 2 * hw, hw, hw]
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def make_config(params: dict, vocab_size: int, ids: Mapping[str, int]):
    """The transformers config of a tiny model (`ids`: token ids of pad, eos and the vision specials)."""
    family, spec, patch = params["family"], params["tiny"], params["patch_size"]
    text = dict(
        vocab_size=vocab_size, hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_layers"], num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"], max_position_embeddings=4096, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=ids["eos"], pad_token_id=ids["pad"], tie_word_embeddings=False,
    )  # fmt: skip
    if family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**text, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    width, depth = spec["vision_width"], spec["vision_depth"]
    rope = {"rope_type": "default", "mrope_section": _mrope_section(family, spec["head_dim"])}
    vision = dict(depth=depth, num_heads=width // VISION_HEAD_DIM, patch_size=patch, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)  # fmt: skip
    mm = dict(image_token_id=ids["image"], video_token_id=ids["video"], vision_start_token_id=ids["vision_start"],
              vision_end_token_id=ids["vision_end"], tie_word_embeddings=False)  # fmt: skip
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig

        vision.update(embed_dim=width, hidden_size=spec["hidden_size"], mlp_ratio=4)
        return Qwen2VLConfig(text_config={**text, "rope_parameters": {**rope, "rope_theta": 1e6}},
                             vision_config=vision, **mm)  # fmt: skip
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision.update(hidden_size=width, intermediate_size=4 * width, out_hidden_size=spec["hidden_size"],
                      window_size=4 * patch * 2, fullatt_block_indexes=[depth - 1])  # fmt: skip
        return Qwen2_5_VLConfig(text_config={**text, "rope_parameters": {**rope, "rope_theta": 1e6}},
                                vision_config=vision, **mm)  # fmt: skip
    from transformers import Qwen3VLConfig

    # num_position_embeddings: a 16x16 grid of learned positions, interpolated to the image's grid
    # (the released 48x48 table would be 150 k parameters, more than the rest of the vision tower).
    vision.update(hidden_size=width, intermediate_size=4 * width, out_hidden_size=spec["hidden_size"],
                  num_position_embeddings=256, deepstack_visual_indexes=[0] if depth >= 2 else [])  # fmt: skip
    text.update(head_dim=spec["head_dim"], rope_parameters={**rope, "rope_theta": 5e6})
    return Qwen3VLConfig(text_config=text, vision_config=vision, **mm)


def _model_class(family: str):
    import transformers

    return {
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
    }[family]


def _write_build(tmp: Path, params: dict, lines: list[str]) -> dict:
    """Write tokenizer/processor, config and seeded weights into tmp; return manifest fields."""
    import torch
    from transformers import GenerationConfig

    from harness.models.tokenizer import (EOS_TOKEN, IMAGE_PAD, PAD_TOKEN, VIDEO_PAD, VISION_END, VISION_START,
                                          build_tokenizer, never_sampled_ids)  # fmt: skip

    family, spec = params["family"], params["tiny"]
    tokenizer = build_tokenizer(lines, spec["vocab_size"])
    tid = tokenizer.convert_tokens_to_ids
    ids = {"pad": tid(PAD_TOKEN), "eos": tid(EOS_TOKEN), "image": tid(IMAGE_PAD), "video": tid(VIDEO_PAD),
           "vision_start": tid(VISION_START), "vision_end": tid(VISION_END)}  # fmt: skip
    config = make_config(params, len(tokenizer), ids)
    torch.manual_seed(spec["init_seed"])  # the only randomness of a build: the initial weights
    with torch.device("cpu"):
        model = _model_class(family)(config).float().eval()
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=ids["eos"], pad_token_id=ids["pad"],
        suppress_tokens=never_sampled_ids(tokenizer),  # model.generate (eval); TRL needs them passed, see suppress helper
    )  # fmt: skip
    model.save_pretrained(tmp, safe_serialization=True, save_original_format=False)
    if params["is_vlm"]:
        from harness.models.processor import HarnessVLProcessor, image_processor_for

        processor = HarnessVLProcessor(
            image_processor=image_processor_for(family, params["patch_size"]), tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
        )  # fmt: skip
        processor.save_pretrained(tmp)
    else:
        tokenizer.save_pretrained(tmp)
    return {
        "architecture": type(model).__name__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "token_ids": ids,
    }


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in [p for p in root.rglob("*") if p.is_file()] + [root]:
        _fsync_path(path)  # os.fsync on a read-only descriptor works for files and dirs alike


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _valid_cached(target: Path, key: str) -> bool:
    """True when target holds a complete build of `key`; ModelCacheError when it is corrupt."""
    if not (target / MANIFEST).exists():
        return False
    manifest = read_manifest(target)
    if manifest.get("key") != key:
        raise ModelCacheError(f"{target} holds a build with key {manifest.get('key')!r}, not {key!r}; "
                              f"delete it and build again.")  # fmt: skip
    if problems := verify_files(target, manifest):
        raise ModelCacheError(f"{target} does not match its {MANIFEST}: " + "; ".join(problems) +
                              ". Delete the dir and build again.")  # fmt: skip
    return True


def build_tiny(*, family: Any, is_vlm: bool, patch_size: int, tiny: Any, corpus: Iterable[str],
               cache_dir: str | os.PathLike) -> Path:  # fmt: skip
    """Build (or find in the cache) a tiny model dir; return its path.

    The dir holds config.json, generation_config.json, model.safetensors, the tokenizer files,
    for VLMs processor_config.json, chat_template.jinja, and harness_model.json.
    """
    lines = corpus_lines(corpus)  # once: `corpus` may be a one-shot iterator
    info = tiny_key(family=family, is_vlm=is_vlm, patch_size=patch_size, tiny=tiny, corpus=lines)
    params, key = info["params"], info["key"]
    target = tiny_model_dir(cache_dir, family=params["family"], key=key)
    if _valid_cached(target, key):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        t0 = time.perf_counter()
        fields = _write_build(tmp, params, lines)
        table = _file_table(tmp)
        manifest = {
            "key": key, "builder_version": BUILDER_VERSION, "params": params,
            "corpus_sha256": info["corpus_sha256"], "corpus_lines": info["corpus_lines"], **fields,
            "files": table, "files_sha256": files_digest(table),
            "build_seconds": round(time.perf_counter() - t0, 3), "versions": _versions(),
        }  # fmt: skip
        _fsync_tree(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache is shared by the user's tools
        # The manifest is written last: a dir without it is never taken for a build.
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_path(tmp)
        try:
            os.rename(tmp, target)  # atomic; fails if another builder published first
        except OSError as err:
            # Lost the race to a concurrent builder of the same key: use its copy.
            if not _valid_cached(target, key):
                raise ModelCacheError(
                    f"cannot publish the build at {target} ({err.strerror}): the path exists without a "
                    f"{MANIFEST}, so it is not a complete build. Delete it and build again."
                ) from err
        else:
            _fsync_path(target.parent)  # make the rename itself durable
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --- loading


def load_tiny(path: str | os.PathLike, *, dtype: str = "float32", attn_implementation: str = "sdpa",
              verify: bool = False):  # fmt: skip
    """(model, processor) for a VLM dir, (model, tokenizer) for a text-only one; on CPU in eval mode
    (the Trainer switches to train mode itself). Registers HarnessVLProcessor before AutoProcessor."""
    import torch

    path = Path(path)
    manifest = read_manifest(path)
    if verify and (problems := verify_files(path, manifest)):
        raise ModelCacheError(f"{path} does not match its {MANIFEST}: " + "; ".join(problems) + ".")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if manifest["params"]["is_vlm"]:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from harness.models.processor import register_auto_classes

        register_auto_classes()
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype,
                                                            attn_implementation=attn_implementation)  # fmt: skip
        processing = AutoProcessor.from_pretrained(path)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
        processing = AutoTokenizer.from_pretrained(path)
    return model, processing


def special_token_ids_to_suppress(processing: Any) -> list[int]:
    """Token ids generation must never sample: <|image_pad|>, <|video_pad|>, <|vision_start|>,
    <|vision_end|>, <|im_start|> (those the vocabulary has).

    Pass them as GRPOConfig(generation_kwargs={"suppress_tokens": ids}): TRL's generation_kwargs
    REPLACE its default suppress_tokens (only the image token) instead of merging (docs/platform.md).
    Works for a processor or a tokenizer, tiny or real Qwen.
    """
    from harness.models.tokenizer import never_sampled_ids

    return never_sampled_ids(processing)

"""final_policy/ outside the harness (issue 16): a fresh `python -I` process that cannot import the harness (a
meta-path finder refuses it, tests/integration/portable_load.py), run outside the repo on a copy of the folder
moved elsewhere, with the run's model cache hidden, loads it with plain transformers (and peft), and the image
reaches the vision tower; its logits equal the harness's own load_policy's. And the model card says what the
run was, from the files the run wrote.

A short SFT run (4 steps) in the default suite; the LoRA run (its base stored in the folder) is slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.rundir import read_json
from harness.verify import verify
from tests.conftest import run_harness

SCRIPT = Path(__file__).with_name("portable_load.py")
SHORT = ["arm=sft", "debug=tiny", "budget.max_loss_tokens=400"]  # 4 optimizer steps


def _train(out: Path, *extra: str) -> Path:
    proc = run_harness(*SHORT, *extra, f"output_root={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (out / "runs").iterdir() if p.name.startswith("sft-")]
    return run


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("full"))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("lora"), "model.tuning=lora", "arm.learning_rate=0.01")


def _image(run: Path) -> Path:
    root = Path(read_json(run / "run_manifest.json")["identity"]["data"]["root"])
    return sorted((root / "images").glob("*-full.png"))[0]


@contextmanager
def _hidden(path: Path):
    """`path` renamed away meanwhile: the folder must not lean on the run's model cache."""
    away = path.with_name(path.name + ".hidden")
    path.rename(away)
    try:
        yield
    finally:
        away.rename(path)


def load_elsewhere(run: Path, tmp: Path, route: str = "auto") -> dict:
    """portable_load.py on a copy of final_policy/ in `tmp` (outside the repo), cwd `tmp`, the cache hidden."""
    import shutil

    moved = tmp / "elsewhere" / "final_policy"
    if not moved.exists():
        shutil.copytree(run / "final_policy", moved)
    image = tmp / "image.png"
    shutil.copy(_image(run), image)  # the data cache is hidden too
    out = tmp / f"loaded-{len(list(tmp.glob('loaded-*')))}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HOME=str(tmp / "hf"), HF_HUB_OFFLINE="1")  # the dynamic-module cache in tmp; no network
    with _hidden(run.parents[1] / "cache"):
        proc = subprocess.run([sys.executable, "-I", str(SCRIPT), str(moved), str(image), route, str(out)],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def harness_logits(run: Path, image: Path, base_only: Path | None = None) -> list[float]:
    """The last-position logits of the same prompt through the harness's own load_policy (or, `base_only`, the
    bare base model in that dir)."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from harness.policy import load_policy

    model, processor = load_policy(run / "final_policy", trainable=False)
    if base_only is not None:
        model = AutoModelForImageTextToText.from_pretrained(base_only)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is the red square left of "
                                                                                         "the blue circle?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=[Image.open(image).convert("RGB")], text=[prompt], return_tensors="pt")
    with torch.no_grad():
        return model(**inputs).logits[0, -1].tolist()


def assert_image_reached_the_model(got: dict) -> None:
    assert got["harness_modules"] == []
    assert got["without_trust_remote_code"].startswith("ValueError"), got["without_trust_remote_code"]
    assert got["processor_class"] == "HarnessVLProcessor"
    assert got["processor_module"].startswith("transformers_modules.") and got["processor_module"].endswith(
        ".processing_harness_vl")  # the code shipped in the folder, not harness.models.processor
    assert "pixel_values" in got["input_keys"] and "image_grid_thw" in got["input_keys"]
    assert got["vision_tower_inputs"] and got["vision_tower_inputs"][0] == got["pixel_values_shape"]
    assert got["input_ids"].count(5) == got["pixel_values_shape"][0] // 4  # <|image_pad|> x (patches / 2x2 merge)
    assert got["generated"], "nothing generated"


def _close(a: list[float], b: list[float]) -> bool:
    return max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_full_policy_loads_and_sees_the_image_without_the_harness(full_run, tmp_path):
    got = load_elsewhere(full_run, tmp_path)
    assert_image_reached_the_model(got)
    assert got["model_class"] == "Qwen2VLForConditionalGeneration" and got["lora_modules"] == 0
    assert _close(got["logits"], harness_logits(full_run, _image(full_run)))


def test_model_card_says_what_the_run_was(full_run):
    from harness.accounting.weights import weights_digest

    fp = full_run / "final_policy"
    card = (fp / "README.md").read_text()
    manifest, comp = read_json(full_run / "run_manifest.json"), read_json(full_run / "completion.json")
    after = read_json(full_run / "eval" / "test.json")
    ident = manifest["identity"]
    for text in (f"# {full_run.name}", "**SFT** (`arm=sft`", ident["semantic_sha256"], ident["config_sha256"],
                 ident["data"]["content_sha256"], ident["model"]["files_sha256"],
                 f"| loss tokens | cap {comp['loss_token_ceiling']} (budget.max_loss_tokens); the prefix of the planned passes that "
                 f"fits: {comp['planned_loss_tokens']} | {comp['realized_loss_tokens']} |",
                 f"| optimizer steps | at most 64 (budget.max_steps) | {comp['optimizer_steps']} |",
                 f"| overall | - | {after['accuracy']:.3f} |",
                 *(f"| {rel} | - | {b['accuracy']:.3f} |" for rel, b in after["per_relation"].items()),
                 "python -m harness " + " ".join(manifest["plan"]["overrides"]),
                 "AutoProcessor.from_pretrained(path, trust_remote_code=True)"):
        assert text in card, text
    assert "[None]" not in card and "incomplete" not in card
    policy = read_json(fp / "harness_policy.json")
    assert policy["card"] == "final" and policy["portable"]["processor_code"] == "processing_harness_vl.py"
    assert weights_digest(fp) == after["policy_sha256"]  # the card and the code are not weights
    assert verify(full_run) == []


def test_verify_names_a_completed_run_whose_card_is_provisional(full_run, tmp_path):
    import shutil

    run = shutil.copytree(full_run, tmp_path / full_run.name)
    p = run / "final_policy" / "harness_policy.json"
    p.write_text(json.dumps({**read_json(p), "card": "provisional"}))
    assert verify(run) == ["final_policy/README.md is the provisional model card of a completed run (harness.card)"]


@pytest.mark.slow
def test_lora_policy_loads_with_its_base_stored_in_the_folder(lora_run, tmp_path):
    """The adapter's base is in final_policy/ (the tiny base is on no hub): AutoModelForImageTextToText loads base +
    adapter from the folder alone, and PeftModel.from_pretrained(base, folder) gives the same model."""
    import shutil

    fp = lora_run / "final_policy"
    adapter = read_json(fp / "adapter_config.json")
    policy = read_json(fp / "harness_policy.json")
    assert adapter["base_model_name_or_path"] == "." and policy["base_files"] == [
        "config.json", "generation_config.json", "model.safetensors"]
    auto = load_elsewhere(lora_run, tmp_path)
    assert_image_reached_the_model(auto)
    assert auto["lora_modules"] > 0
    base = tmp_path / "elsewhere" / "base"  # the base files of the folder, on their own
    base.mkdir()
    for name in policy["base_files"]:
        shutil.copy(tmp_path / "elsewhere" / "final_policy" / name, base / name)
    peft = load_elsewhere(lora_run, tmp_path, route=f"peft={base}")
    assert_image_reached_the_model(peft)
    assert peft["model_class"].startswith("PeftModel")
    reference = harness_logits(lora_run, _image(lora_run))
    assert _close(auto["logits"], reference) and _close(peft["logits"], reference)
    assert not _close(reference, harness_logits(lora_run, _image(lora_run), base_only=base))  # the adapter counts
    assert verify(lora_run) == []


@pytest.mark.slow
def test_a_crash_before_the_card_leaves_nothing_that_looks_complete(tmp_path):
    """Killed after the final eval, before the card is final: the folder's card says the run did not finish, and
    the same command finishes it with the card proper."""
    import signal

    from harness.faults import FAULT_ENV

    args = [*SHORT, f"output_root={tmp_path}"]
    killed = run_harness(*args, env={FAULT_ENV: "sft.model_card:kill"}, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert read_json(run / "run_manifest.json")["status"] != "completed" and not (run / "completion.json").exists()
    assert read_json(run / "final_policy" / "harness_policy.json")["card"] == "provisional"
    assert "(incomplete)" in (run / "final_policy" / "README.md").read_text()
    again = run_harness(*args, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert read_json(run / "final_policy" / "harness_policy.json")["card"] == "final"
    assert "(incomplete)" not in (run / "final_policy" / "README.md").read_text()
    assert verify(run) == []

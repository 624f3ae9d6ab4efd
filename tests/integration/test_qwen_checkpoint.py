"""`model=qwen model.path=<a hub-layout Qwen2.5-VL checkpoint>` through every arm, on CPU, with the real trainers.

One sweep (`-m arm=sft,grpo,papo,evi_po,opd`, LoRA: the option's default) in one output root shares its SFT warm
start and opd's grpo teacher; each test checks one thing of it. A kill -> resume of grpo reuses that warm start
(a copy of the output root) and must equal the sweep's uninterrupted run; the final policy loads in a process that
cannot import the harness; the eval CLI and the report read the sweep. Slow: full fine-tuning of every arm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.rundir import read_json
from harness.faults import KILL_RUN_ENV, KILL_STEP_ENV
from harness.verify import verify
from tests.conftest import logged_values, run_harness

ARMS = ("sft", "grpo", "papo", "evi_po", "opd")
ENV = {"OMP_NUM_THREADS": "1"}  # the same kernels in every run, so a resumed run can match bit for bit


# debug=tiny with short SFT: random weights learn nothing in 60 steps, and the default suite pays every second; the
# warm start's format check is off (these runs test the pipeline on a real checkpoint's layout, not learning)
SHORT_SFT = ("budget.sft_warm_start_steps=6", "budget.max_loss_tokens=1000", "budget.sft_warm_start_min_format=0")


def qwen_args(snapshot: Path, out: Path, *extra: str) -> list[str]:
    return ["model=qwen", f"model.path={snapshot}", "model.dtype=float32", "debug=tiny", *SHORT_SFT,
            f"output_root={out}", *extra]


def run_dir(out: Path, arm: str) -> Path:
    """The run of `arm` (for sft: the arm's own run, not the RL arms' warm start)."""
    found = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-") and p.is_dir()]
    if arm == "sft" and len(found) > 1:
        found = [p for p in found if p != warm_start(out)]
    (d,) = found
    return d


def warm_start(out: Path) -> Path:
    return Path(read_json(run_dir(out, "grpo") / "run_manifest.json")["parent"]["run_dir"])


@pytest.fixture(scope="module")
def sweep(hub_snapshot, tmp_path_factory):
    snap = hub_snapshot()
    out = tmp_path_factory.mktemp("qwen")
    proc = run_harness("-m", f"arm={','.join(ARMS)}", *qwen_args(snap, out), timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return snap, out, proc.stderr


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_completes_verified_and_within_its_budget(sweep, arm):
    snap, out, _ = sweep
    run = run_dir(out, arm)
    assert verify(run) == [], verify(run)
    comp = read_json(run / "completion.json")
    assert comp["status"] == "completed" and comp["optimizer_steps"] >= (4 if arm != "sft" else 2)
    manifest = read_json(run / "run_manifest.json")
    model = manifest["identity"]["model"]
    assert model["kind"] == "pretrained" and model["path"] == str(snap) and model["model_type"] == "qwen2_5_vl"
    assert run.name.startswith(f"{arm}-qwen_{model['files_sha256'][:8]}-lora-synthetic-s0-")
    lengths = manifest["prompt_lengths"]
    assert lengths["train"]["n"] == 3600 and lengths["image_tokens_per_image"] == [4] and lengths["context"] == 128000
    if arm == "sft":
        assert comp["realized_loss_tokens"] <= comp["loss_token_ceiling"]
        return
    ledger = list(read_rows(run / "ledgers/rank-0.jsonl"))
    assert sum(r["tokens"] for r in ledger) == comp["realized_completion_tokens"] <= comp["completion_token_ceiling"]
    assert comp["stopped_by"] == "budget"  # the token budget, not max_steps, ends a comparison
    assert manifest["init"]["kind"] == "sft" and manifest["init"]["parent_run"] == warm_start(out).name


def test_the_arms_own_terms_ran_on_the_checkpoints_images(sweep):
    _, out, _ = sweep
    # steps with loss tokens (a random policy may truncate every completion of a step: masked, no term to log)
    papo = [r for r in logged_values(run_dir(out, "papo")) if r.get("completions/clipped_ratio", 1) < 1]
    assert all("loss/kl_prcp" in r for r in papo) and max(r["loss/kl_prcp"] for r in papo) > 0  # a masked image differs
    evi = [r for r in logged_values(run_dir(out, "evi_po")) if "reward" in r]
    assert papo and evi and all("loss/direction" in r for r in evi)
    assert any("evi/FULL/kl_miss" in r and "loss/evidence" in r for r in evi)  # a step whose batch held a FULL view
    opd = read_json(run_dir(out, "opd") / "run_manifest.json")["identity"]["teacher"]
    assert opd["arm"] == "grpo" and opd["weights_sha256"]


def test_the_run_says_how_long_its_prompts_are(sweep):
    _, _, stderr = sweep
    assert "prompts: 3600 train rows, " in stderr and "4 image tokens per image" in stderr
    assert "longest + arm.max_completion_length = " in stderr and "of the model's 128000 positions" in stderr


def test_the_eval_cli_and_the_report_read_the_runs(sweep):
    """A checkpoint of the grpo run evaluated again by `python -m harness.eval` (the run's dtype and processor), and
    the sweep's report, both without a traceback."""
    _, out, _ = sweep
    run = run_dir(out, "grpo")
    proc = run_harness(str(run), "split=val", "policy=checkpoint-2", "max_items=8", module="harness.eval", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_json(run / "eval" / "val-checkpoint-2.json")["n"] == 8
    proc = run_harness(str(out), module="harness.report", timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (out / "report" / "report.md").is_file()


def test_the_final_policy_carries_the_checkpoints_own_processor_files(sweep):
    snap, out, _ = sweep
    fp = run_dir(out, "grpo") / "final_policy"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "preprocessor_config.json",
                 "chat_template.json"):
        assert (fp / name).read_bytes() == (snap / name).read_bytes(), name
    # not the image-only processor's own saved form (no video processor): the stock class, plus its image-only form
    # as remote code for AutoProcessor(..., trust_remote_code=True) without torchvision
    assert read_json(fp / "processor_config.json") == {"processor_class": "Qwen2_5_VLProcessor", "auto_map": {
        "AutoProcessor": "processing_harness_vl.Qwen2_5_VLImageOnlyProcessor"}}
    adapter = json.loads((fp / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(snap)  # model.path, not the option's Qwen/... hub id
    portable = read_json(fp / "harness_policy.json")["portable"]
    assert portable["processor_files"] and portable["processor_code"] == "processing_harness_vl.py"


def test_the_lora_policy_loads_without_the_harness(sweep, tmp_path):
    """A fresh `python -I` process that cannot import the harness, without torchvision, loads final_policy/ as its
    model card says (AutoProcessor with trust_remote_code=True: the image-only form of the checkpoint's processor
    class, shipped in the folder; AutoModelForImageTextToText: the base model.path names plus the adapter), scores
    an image and generates; its processor's output is the stock one's (by hand without torchvision), its logits the
    harness's own load_policy's."""
    import torch
    from PIL import Image

    from harness.policy import load_policy

    snap, out, _ = sweep
    run = run_dir(out, "grpo")
    root = Path(read_json(run / "run_manifest.json")["identity"]["data"]["root"])
    image = sorted((root / "images").glob("*-full.png"))[0]
    moved = tmp_path / "elsewhere" / "final_policy"
    shutil.copytree(run / "final_policy", moved)
    result = tmp_path / "loaded.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-I", str(Path(__file__).with_name("portable_load.py")), str(moved),
                           str(image), "pretrained", str(result)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(result.read_text())
    assert got["harness_modules"] == [] and got["lora_modules"] > 0 and got["generated"]
    assert got["processor_class"] == "Qwen2_5_VLImageOnlyProcessor"
    assert got["processor_module"].startswith("transformers_modules.") and got["processor_module"].endswith(
        ".processing_harness_vl")  # the code shipped in the folder
    assert got["reference"] in ("pieces", "stock") and got["equal_to_reference"] and all(
        got["equal_to_reference"].values()), got["equal_to_reference"]
    assert got["reference"] == "stock" or "requires the Torchvision library" in got["without_trust_remote_code"]
    card = (run / "final_policy" / "README.md").read_text()
    assert "AutoProcessor.from_pretrained(path, trust_remote_code=True)" in card
    assert "AutoModelForImageTextToText.from_pretrained(path)" in card  # base + adapter (transformers' PEFT integration)
    assert got["model_class"] == "Qwen2_5_VLForConditionalGeneration"
    # the forward pass and generate's prefill each give the vision tower the image's 16 patches (56x56)
    assert got["vision_tower_inputs"] == [got["pixel_values_shape"]] * 2 and got["pixel_values_shape"][0] == 16

    model, processor = load_policy(run / "final_policy", trainable=False)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": got["question"]}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.open(image).convert("RGB")], return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == got["input_ids"]
    with torch.no_grad():
        ours = model(**inputs).logits[0, -1].tolist()
    assert max(abs(a - b) for a, b in zip(ours, got["logits"])) < 1e-4


def test_a_killed_run_resumes_to_the_uninterrupted_one(sweep, tmp_path):
    """grpo, SIGKILLed at the end of step 3 (its samples drawn after checkpoint 2), then the same command:
    resumes from checkpoint 2 and ends with the same adapter, ledger, trace and logged values as the sweep's run."""
    from safetensors.torch import load_file

    snap, out, _ = sweep
    a = run_dir(out, "grpo")
    copy = tmp_path / "out"
    shutil.copytree(warm_start(out), copy / "runs" / warm_start(out).name)
    shutil.copytree(out / "cache", copy / "cache")  # the warm start and the data, not the RL runs
    args = qwen_args(snap, copy, "arm=grpo")
    killed = run_harness(*args, timeout=600, env={**ENV, KILL_RUN_ENV: a.name, KILL_STEP_ENV: "3"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    b = copy / "runs" / a.name
    assert not (b / "completion.json").exists()
    resumed = run_harness(*args, timeout=600, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint-2" in resumed.stderr
    audit = read_json(b / "audits" / "resume-1-rank-0.json")
    assert audit["status"] == "passed" and {"adapters", "optimizer", "scheduler"} <= set(audit["components"])
    wa, wb = (load_file(d / "final_policy" / "adapter_model.safetensors") for d in (a, b))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    ledger = lambda d: [(r["completion_id"], r["tokens"]) for r in read_rows(d / "ledgers/rank-0.jsonl")]  # noqa: E731
    trace = lambda d: [(r["completion_id"], r["reward"]) for r in read_rows(d / "traces/rank-0.jsonl")]  # noqa: E731
    assert ledger(a) == ledger(b) and trace(a) == trace(b)
    assert logged_values(a) == logged_values(b)
    assert verify(b) == []


def test_a_processor_that_cannot_be_built_is_refused_before_any_run_dir(hub_snapshot, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(hub_snapshot(), d)
    pre = json.loads((d / "preprocessor_config.json").read_text())
    (d / "preprocessor_config.json").write_text(json.dumps({**pre, "processor_class": "NoSuchProcessor"}))
    out = tmp_path / "out"
    proc = run_harness(*qwen_args(d, out, "arm=grpo"), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "model.path = " in proc.stderr and "its processor cannot be built" in proc.stderr
    assert "NoSuchProcessor" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "runs").exists()  # nothing claimed, the warm start's dir neither


def test_an_sft_row_longer_than_max_length_is_refused_before_the_first_step(sweep, tmp_path):
    """448x448-pixel images (256 image tokens each) do not fit the warm start's arm.max_length 256: refused with the
    count, the worst record and the knob; budget.sft_warm_start_max_length then makes it fit."""
    snap, out, _ = sweep
    args = qwen_args(snap, tmp_path / "out", "arm=grpo", "model.min_pixels=200704", "budget.max_steps=1",
                     f"data.cache_dir={out}/cache/data")
    proc = run_harness(*args, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "arm.max_length = 256: 3600 of 3600 SFT rows" in proc.stderr
    assert "budget.sft_warm_start_max_length=366" in proc.stderr and "Traceback" not in proc.stderr
    sft = [p for p in (tmp_path / "out" / "runs").iterdir() if p.name.startswith("sft-")]
    assert len(sft) == 1 and not (sft[0] / "checkpoints").exists()  # no step was taken


@pytest.mark.slow  # every arm again with full fine-tuning (its own warm start): ~60 s
def test_every_arm_with_full_fine_tuning(hub_snapshot, tmp_path):
    out = tmp_path / "full"
    proc = run_harness("-m", f"arm={','.join(ARMS)}", *qwen_args(hub_snapshot(), out, "model.tuning=full"),
                       timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for arm in ARMS:
        run = run_dir(out, arm)
        assert verify(run) == [] and "-lora-" not in run.name
        assert (run / "final_policy" / "model.safetensors").exists() or \
            (run / "final_policy" / "model.safetensors.index.json").exists()

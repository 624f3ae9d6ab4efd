"""The model card of a final policy: final_policy/README.md, in place of the one TRL or peft would write
("fine-tuned version of [None]", "trained with GRPO" for every RL arm). Torch-free.

It says which arm trained the policy (its own name: papo is PAPO), the run's identity (run name, semantic and
config sha256, data and model digests), the budget planned and used, the greedy eval before and after
(overall and per relation, from eval/*.json), how to load it without the harness, and the command that
reproduces the run.

Written twice, because the policy is saved before the final eval: `provisional_card` when save_final_policy
writes the folder (a crash between the save and the eval leaves a card that says the run did not finish, never
one that looks final), then `publish_card` after the final eval, just before completion.json, from the very
dict completion.json will hold. harness_policy.json records which (`card`: provisional | final) and the card's
digest with the other files, so harness.verify checks it, and names a completed run whose card is provisional.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.eval import artifact_path
from harness.identity import sha256_file
from harness.rundir import atomic_write_bytes, atomic_write_json, read_json

CARD = "README.md"
POLICY_MANIFEST = "harness_policy.json"  # = harness.policy.POLICY_MANIFEST (that module imports this one)


def arm_title(name: str) -> str:
    """The arm as papers write it: sft -> SFT, papo -> PAPO, evi_po -> EVI-PO."""
    return name.upper().replace("_", "-")


def _arm_line(name: str) -> str:
    from arms import registry

    spec = registry().get(name)
    return f"**{arm_title(name)}** (`arm={name}`" + (f": {spec.summary})" if spec else ")")


def reproduce_command(overrides: list[str]) -> str:
    return shlex.join(["python", "-m", "harness", *overrides])


def provisional_card(plan) -> str:
    return (f"---\ntags:\n- harness\n- {plan.arm}\n- incomplete\n---\n\n# {plan.run_name} (incomplete)\n\n"
            f"Saved at the end of training by the harness with arm {_arm_line(plan.arm)}. The run has NOT finished: "
            "the final eval and completion.json are still to come, and this card is rewritten when they are. "
            "If the run was interrupted, the same command finishes it:\n\n"
            f"```bash\n{reproduce_command(plan.overrides)}\n```\n")


# --- the card proper


def trained_base(plan, identity: dict) -> dict | None:
    """The pretrained base the policy was trained from, {"hub_id", "path", "name"}; None for a tiny model.
    Read from the run's recorded identity (harness.plan.planned_model_identity: hub_id is None when model.path
    was given) rather than the config, whose model.hub_id keeps the option's default next to a model.path."""
    m = plan.cfg.model
    if m.source == "tiny":
        return None
    model = identity.get("model") or plan.identity.get("model") or {}
    hub_id = model["hub_id"] if "hub_id" in model else (None if m.path else m.hub_id)
    path = model.get("path") or m.path
    name = hub_id or (Path(path).name if path else None)
    return {"hub_id": hub_id, "path": path, "name": name}


def _front_matter(plan, identity: dict, policy: dict) -> str:
    m = plan.cfg.model
    lora = policy.get("tuning") == "lora"
    lines = ["---", f"library_name: {'peft' if lora else 'transformers'}",
             f"pipeline_tag: {'image-text-to-text' if m.is_vlm else 'text-generation'}"]
    base = trained_base(plan, identity)
    # base_model only for weights that came from that hub repo (model.hub_id, no model.path): the Hub reads it as a
    # repo id (the model tree, "finetuned from"), so a local path is no valid value, and model.hub_id next to a
    # model.path (the option's default) names a model the weights may not be. The identity table names the path.
    if base and base["hub_id"]:
        lines.append(f"base_model: {base['hub_id']}")
    lines += ["tags:", "- harness", f"- {plan.arm}", f"- {m.tuning.value}", "---"]
    return "\n".join(lines)


def _identity_rows(plan, identity: dict, policy: dict) -> list[tuple[str, str]]:
    data, model, code = identity.get("data") or {}, identity.get("model") or {}, identity.get("code") or {}
    m = plan.cfg.model
    if m.source == "tiny":
        what = (f"tiny {m.family.value} built by the harness with seeded random weights (spec_sha256 "
                f"`{model.get('spec_sha256')}`, files_sha256 `{model.get('files_sha256')}`)")
    else:
        base = trained_base(plan, identity)
        where = (f"from the Hugging Face cache (model.hub_id, revision `{model.get('revision')}`)" if base["hub_id"]
                 else f"the local checkpoint `{base['path']}` (model.path)")
        what = f"`{base['name']}`, {where} (files_sha256 `{model.get('files_sha256')}`)"
    rows = [("run name", f"`{plan.run_name}`"),
            ("arm", _arm_line(plan.arm)),
            ("semantic_sha256", f"`{identity.get('semantic_sha256')}`"),
            ("config_sha256", f"`{identity.get('config_sha256')}`"),
            ("data", f"{data.get('kind')}, content_sha256 `{data.get('content_sha256')}` "
                     f"(spec_sha256 `{data.get('spec_sha256')}`)"),
            ("model", what),
            ("tuning", m.tuning.value),
            ("policy weights digest", f"`{policy.get('weights_sha256')}` (harness.policy.weights_digest)"),
            ("code", f"commit `{code.get('commit')}`" + (" with uncommitted changes" if code.get("dirty") else ""))]
    teacher = identity.get("teacher") or plan.identity.get("teacher")
    if teacher:  # opd: what the student distilled from
        of_run = f", the final policy of run `{teacher['run_name']}` ({teacher.get('arm')})" if teacher.get("run_name") else ""
        rows.append(("teacher", f"`{teacher['spec']}`{of_run}, weights digest `{teacher['weights_sha256']}`"))
    init = plan.kind.policy_init(plan.cfg)
    if init:
        rows.append(("init", f"`{init}`" + (f" (the SFT warm start `{plan.parent.run_name}`)"
                                             if init == "sft" and plan.parent else "")))
    return rows


def _budget_rows(plan, comp: dict) -> list[tuple[str, str, str]]:
    steps = ("optimizer steps", f"at most {plan.cfg.budget.max_steps} (budget.max_steps)", str(comp.get("optimizer_steps")))
    return [*plan.kind.card_budget_rows(comp), steps]


def _fmt(result: dict | None, relation: str | None = None) -> str:
    if not result:
        return "-"
    block = result if relation is None else (result.get("per_relation") or {}).get(relation)
    return "-" if not block else f"{block['accuracy']:.3f}"


def _eval_table(run_dir: Path, split: str) -> str:
    def load(label):
        p = artifact_path(run_dir, split, label)
        return read_json(p) if p.is_file() else None

    before, after = load("before"), load("final")
    if not (before or after):
        return "No eval ran (train.eval_after=false)."
    rels = list(dict.fromkeys([*((after or {}).get("per_relation") or {}), *((before or {}).get("per_relation") or {})]))
    n = (after or before)["n"]
    files = ", ".join(f"eval/{p.name}" for p in (artifact_path(run_dir, split, "before"), artifact_path(run_dir, split,
                                                                                                     "final"))
                      if p.is_file())
    lines = [f"Greedy decoding on the held-out `{split}` split ({n} views; {files}).",
             "", "| accuracy | before | after |", "|---|---|---|", f"| overall | {_fmt(before)} | {_fmt(after)} |"]
    lines += [f"| {r} | {_fmt(before, r)} | {_fmt(after, r)} |" for r in rels]
    return "\n".join(lines)


def _load_snippet(plan, policy: dict, where: str) -> str:
    m = plan.cfg.model
    portable = policy.get("portable") or {}
    trust = ", trust_remote_code=True" if portable.get("processor_code") else ""
    if not m.is_vlm:
        return (f"```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\npath = {where!r}\n"
                "tokenizer = AutoTokenizer.from_pretrained(path)\nmodel = AutoModelForCausalLM.from_pretrained(path)\n```")
    code = (f"```python\nfrom PIL import Image\nfrom transformers import AutoModelForImageTextToText, AutoProcessor\n\n"
            f"path = {where!r}\nprocessor = AutoProcessor.from_pretrained(path{trust})\n"
            "model = AutoModelForImageTextToText.from_pretrained(path)\n"
            'messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "<question>"}]}]\n'
            "prompt = processor.apply_chat_template(messages, add_generation_prompt=True)\n"
            'inputs = processor(images=[Image.open("image.png").convert("RGB")], text=[prompt], return_tensors="pt")\n'
            "out = model.generate(**inputs, max_new_tokens=16, do_sample=False)\n"
            'print(processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n```')
    notes = []
    if trust and m.source == "tiny":
        notes.append(f"The tiny model's image-only processor (no torchvision needed) ships as "
                     f"`{portable['processor_code']}` in this folder, hence `trust_remote_code=True`; read it first.")
    elif trust:
        notes.append(f"The checkpoint's processor files are here, and its processor without the video part ships as "
                     f"`{portable['processor_code']}` (no torchvision needed; the same input_ids, pixel_values and "
                     "image_grid_thw as the stock processor), hence `trust_remote_code=True`; read it first. Without "
                     "it, AutoProcessor builds the stock Qwen-VL processor, which needs torchvision.")
    base = portable.get("adapter_base")
    if base:
        notes.append(f"LoRA: {base['note']}; `AutoModelForImageTextToText.from_pretrained(path)` loads it and "
                     "attaches the adapter (transformers' PEFT integration). For a `PeftModel` (merge, train on): "
                     f"`PeftModel.from_pretrained(base_model, path)`. peft 0.21 has no AutoPeftModelForImageTextToText "
                     "and its AutoPeftModelForCausalLM refuses VL configs.")
        if not base["portable"]:
            notes.append(f"Not portable: adapter_config.json names `{base['base_model_name_or_path']}`.")
    return code + ("\n\n" + "\n\n".join(notes) if notes else "")


def render_card(plan, run_dir: Path, identity: dict, completion: dict, policy: dict) -> str:
    """The card from the plan, the run's identity (run_manifest.json), the completion dict and harness_policy.json."""
    cfg = plan.cfg
    where = cfg.train.hub_model_id if cfg.train.push_to_hub else str(Path(run_dir) / "final_policy")
    budget = _budget_rows(plan, completion)
    cached = Path((identity.get("model") or {}).get("base_path") or "").name
    rebuild = ("The tiny base is rebuilt deterministically by that command, before training (harness.models."
               f"build_tiny: the cache entry `{cached}` under model.cache_dir, named by its build parameters and "
               "tokenizer corpus)." if cfg.model.source == "tiny" else "")
    parts = [
        _front_matter(plan, identity, policy), "", f"# {plan.run_name}", "",
        f"A policy trained by the harness with arm {_arm_line(plan.arm)}, {cfg.model.tuning.value} tuning "
        f"of model `{cfg.model.name}` on data `{cfg.data.name}`, seed {cfg.seed}.",
        "", "## Identity", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in _identity_rows(plan, identity, policy)),
        "", "## Budget", "", "| | planned | used |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in budget),
        "", f"Stopped by: {completion.get('stopped_by')}. Nonfinite steps skipped: {completion.get('nonfinite_steps', 0)}.",
        "", "## Evaluation", "", _eval_table(Path(run_dir), cfg.data.eval_split),
        "", "## Load", "", _load_snippet(plan, policy, where),
        "", "## Reproduce", "", f"From a checkout of the harness at commit `{(identity.get('code') or {}).get('commit')}`:",
        "", f"```bash\n{reproduce_command(plan.overrides)}\n```", "", rebuild,
    ]
    return "\n".join(parts).rstrip() + "\n"


def publish_card(plan, run_dir: Path, identity: dict, completion: dict, weights_sha256: str | None) -> dict:
    """Rewrite final_policy/README.md as the card proper, then harness_policy.json with its digest (`card`:
    final), each atomically: a crash between the two leaves a run that is not complete (completion.json comes
    after) and is redone by the same command. `weights_sha256`: harness.policy.weights_digest of the folder.
    Returns harness_policy.json's new content."""
    fp = Path(run_dir) / "final_policy"
    manifest = read_json(fp / POLICY_MANIFEST)
    text = render_card(plan, run_dir, identity, completion, {**manifest, "weights_sha256": weights_sha256})
    atomic_write_bytes(fp / CARD, text.encode("utf-8"))
    p = fp / CARD
    manifest["files"][CARD] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    manifest["card"] = "final"
    atomic_write_json(fp / POLICY_MANIFEST, manifest)
    return manifest

"""Tests that need the Hugging Face Hub (marker `network`: skipped unless HARNESS_NETWORK=1).

The harness itself never downloads: `model=qwen` resolves `model.hub_id` in the local HF cache with its own
torch- and hub-free reader of the cache layout (harness.config.checks.find_cached_snapshot). What only the network
can show is that this reader agrees with the layout huggingface_hub really writes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONF, run_harness

pytestmark = pytest.mark.network


def test_model_qwen_resolves_the_checkpoint_huggingface_hub_downloaded(tmp_path):
    """huggingface_hub downloads config.json of conf/model/qwen.yaml's hub_id into an empty cache (HF_HUB_OFFLINE
    unset); `python -m harness mode=plan model=qwen` on that cache then names exactly that snapshot: path = the
    snapshot folder hf_hub_download returned, revision = the commit the cache's refs/main points at, config_sha256
    = the digest of the downloaded file. Only config.json is fetched (a few KB; the plan reads nothing else)."""
    hub_id = yaml.safe_load((CONF / "model" / "qwen.yaml").read_text())["hub_id"]
    cache = tmp_path / "hf" / "hub"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(cache))
    fetch = subprocess.run([sys.executable, "-c", "import sys; from huggingface_hub import hf_hub_download; "
                            "print(hf_hub_download(sys.argv[1], 'config.json'))", hub_id],
                           capture_output=True, text=True, timeout=300, env=env)
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    downloaded = Path(fetch.stdout.strip().splitlines()[-1])
    refs_main = (cache / ("models--" + hub_id.replace("/", "--")) / "refs" / "main").read_text().strip()

    proc = run_harness("mode=plan", "model=qwen", f"output_root={tmp_path / 'out'}",
                       env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    model = json.loads(proc.stdout)["identity"]["model"]
    assert model["hub_id"] == hub_id and model["kind"] == "pretrained"
    assert Path(model["path"]) == downloaded.parent
    assert model["revision"] == refs_main == downloaded.parent.name and len(refs_main) == 40
    assert model["config_sha256"] == hashlib.sha256(downloaded.read_bytes()).hexdigest()

"""train.push_to_hub: refused at plan time, before anything is built, when the push could not happen (the real
checks: no repo, no token, an unreachable Hub); accepted with a token and a Hub that answers (the probe replaced);
the push's calls to huggingface_hub (a fake HfApi)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from harness.errors import ConfigError
from tests.conftest import run_harness

PUSH = ["arm=sft", "debug=tiny", "train.push_to_hub=true", "train.hub_model_id=me/tiny-sft"]


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No HF token anywhere get_token looks (environment, the stored token file, CI OIDC)."""
    import huggingface_hub.constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def _problems(plan_of, *overrides) -> dict:
    with pytest.raises(ConfigError) as err:
        plan_of(*overrides)
    return {p.field: p for p in err.value.problems}


def test_no_repo_and_no_token_are_refused(plan_of, no_token):
    got = _problems(plan_of, "arm=sft", "debug=tiny", "train.push_to_hub=true")
    assert set(got) == {"train.hub_model_id", "train.push_to_hub"}
    assert "no Hugging Face token" in got["train.push_to_hub"].why and "HF_TOKEN" in got["train.push_to_hub"].fix


def test_an_unreachable_hub_is_refused(plan_of, no_token, monkeypatch):
    with socket.socket() as s:  # a local port nobody listens on: refused at once, whatever the network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    got = _problems(plan_of, *PUSH)
    assert list(got) == ["train.push_to_hub"] and "unreachable" in got["train.push_to_hub"].why
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in _problems(plan_of, *PUSH)["train.push_to_hub"].why


def test_a_push_with_a_token_and_a_hub_plans_and_its_warm_start_does_not_push(plan_of, no_token, monkeypatch):
    import harness.hub

    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setattr(harness.hub, "hub_reachable", lambda endpoint, timeout=5.0: None)
    plan = plan_of("arm=grpo", "debug=tiny", "train.push_to_hub=true", "train.hub_model_id=me/tiny-grpo")
    assert plan.config["train"]["push_to_hub"] and plan.config["train"]["hub_model_id"] == "me/tiny-grpo"
    assert plan.parent.config["train"]["push_to_hub"] is False and plan.parent.config["train"]["hub_model_id"] is None
    assert "train.push_to_hub" in plan.identity["non_semantic_fields"]  # a push does not change what is trained


def test_the_command_line_refuses_before_training(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": ""}
    proc = run_harness(*PUSH, f"output_root={tmp_path / 'out'}", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "train.push_to_hub = True: no Hugging Face token" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "runs").exists()


class FakeApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, **kw):
        self.calls.append(("create_repo", kw))

    def upload_folder(self, **kw):
        self.calls.append(("upload_folder", kw))
        return type("Commit", (), {"oid": "abc123", "commit_url": "https://huggingface.co/me/tiny-sft/commit/abc123"})


def test_the_push_uploads_the_folder_as_one_commit(tmp_path: Path):
    from harness.hub import push_final_policy

    api = FakeApi()
    got = push_final_policy(tmp_path, "me/tiny-sft", run_name="sft-x", api=api)
    assert api.calls == [
        ("create_repo", {"repo_id": "me/tiny-sft", "repo_type": "model", "exist_ok": True}),
        ("upload_folder", {"folder_path": str(tmp_path), "repo_id": "me/tiny-sft", "repo_type": "model",
                           "commit_message": "harness run sft-x: final_policy", "ignore_patterns": ["training_args.bin"]}),
    ]
    assert got == {"repo_id": "me/tiny-sft", "commit": "abc123",
                   "url": "https://huggingface.co/me/tiny-sft/commit/abc123"}

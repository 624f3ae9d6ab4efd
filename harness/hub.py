"""The push of a final policy to the Hugging Face Hub (train.push_to_hub, off by default). Torch-free.

Plan time (harness.config.checks.check_push): a push that cannot happen is refused before anything is built
or trained (exit 2): no train.hub_model_id, HF_HUB_OFFLINE set, no token (huggingface_hub.get_token: HF_TOKEN
or `hf auth login`), or no answer from the Hub (`hub_reachable`: one HTTPS request, a few seconds at most;
tests replace it to plan an accepted push). A token the Hub would reject is found only by the push itself.

The push (`push_final_policy`) runs after the final eval and the model card, before completion.json
(harness.run.stages.finalize.publish_policy): a failed push leaves the run unfinished, and the same command,
resuming from the final checkpoint, pushes again. training_args.bin (a pickle, flagged by the Hub) stays home.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 5.0
NOT_PUSHED = ["training_args.bin"]


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `endpoint` answers an HTTPS request (any status) within `timeout` seconds, else why not. The
    request runs in a thread so that a stalled name lookup (which ignores socket timeouts) cannot hold the plan."""
    result: list[str | None] = []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/models?limit=1", method="HEAD"),
                                   timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)  # it answered
        except Exception as exc:  # URLError (DNS, refused, TLS), timeout, ...
            result.append(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")

    t = threading.Thread(target=probe, daemon=True, name="hub-probe")
    t.start()
    t.join(timeout + 1.0)
    return result[0] if result else f"no answer in {timeout:.0f} s"


def push_problem() -> tuple[str, str] | None:
    """(why, fix) when a push could not happen from this process now, else None."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set: huggingface_hub makes no request", "unset HF_HUB_OFFLINE"
    try:
        from huggingface_hub import get_token
    except ImportError:
        return "huggingface_hub is not installed", "pip install huggingface_hub"
    if not get_token():
        return ("no Hugging Face token (HF_TOKEN is unset and no token is stored by `hf auth login`)",
                "export HF_TOKEN=<a token with write access>, or run `hf auth login`")
    endpoint = hub_endpoint()
    why = hub_reachable(endpoint)
    if why:
        return (f"the Hub at {endpoint} is unreachable from this machine ({why})",
                "run where the Hub is reachable (check proxies, HF_ENDPOINT)")
    return None


def push_final_policy(folder, repo_id: str, *, run_name: str, api=None) -> dict:
    """Create `repo_id` if needed and upload `folder` as one commit; what completion.json records of it.
    `api`: a huggingface_hub.HfApi (tests pass a fake)."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    api.create_repo(repo_id=repo_id, repo_type="model", exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                             commit_message=f"harness run {run_name}: final_policy", ignore_patterns=NOT_PUSHED)
    return {"repo_id": repo_id, "commit": getattr(info, "oid", None),
            "url": str(getattr(info, "commit_url", "") or f"https://huggingface.co/{repo_id}")}

"""The off-policy buffer's files (harness.offpolicy): published policy versions and sampled rounds, each written
whole (harness.rundir.atomic_write_bytes: a temporary name, fsync, rename) and read back checked. Imports torch."""

from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save

from harness.offpolicy import POLL_S, index_of, round_path, version_path
from harness.rundir import atomic_write_bytes


@dataclass
class Round:
    """One sampled round: everything the trainer needs to train on it and the ledger to account for it."""

    round: int
    version: int  # the policy version (round whose starting weights) that sampled it
    seed: int  # its sampling RNG's seed (harness.offpolicy.round_seed)
    keys: list[str]  # the dataset rows' keys of its completions, in order (a prompt's G completions adjacent)
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logps: list[list[float]]  # per completion token: its log-prob under the sampling weights (behaviour policy)

    @property
    def tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


def trainable(model) -> dict[str, torch.Tensor]:
    """The parameters a version publishes: those the trainer updates (all of them with full tuning, the adapter's
    with LoRA); the frozen rest is the base model both sides load."""
    return {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters() if p.requires_grad}


def publish_version(model, run_dir, version: int) -> Path:
    path = version_path(run_dir, version)
    atomic_write_bytes(path, save(trainable(model), metadata={"version": str(version)}))
    return path


def load_version(model, run_dir, version: int) -> None:
    """The published version's parameters into `model` (bitwise); a version that names other parameters is refused."""
    state = load_file(str(version_path(run_dir, version)))
    params = dict(model.named_parameters())
    want = {n for n, p in params.items() if p.requires_grad}
    if set(state) != want:
        raise RuntimeError(f"policy version {version} names {len(state)} parameters, the sampler's model trains "
                           f"{len(want)} (e.g. {sorted(set(state) ^ want)[:3]}): the two sides built different models")
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)


def write_round(run_dir, rnd: Round) -> Path:
    path, buf = round_path(run_dir, rnd.round), io.BytesIO()
    torch.save(asdict(rnd), buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_round(run_dir, index: int) -> Round:
    return Round(**torch.load(round_path(run_dir, index), weights_only=True))


def wait_for(path: Path, gone: Callable[[], bool]) -> bool:
    """Wait until `path` exists (True), or `gone()` says its writer stopped (False)."""
    while not path.exists():
        if gone():
            return path.exists()
        time.sleep(POLL_S)
    return True


def rollback(run_dir, start_round: int, lag: int | None) -> dict:
    """Before a (re)start of training at round `start_round`, every temporary file is removed, and at a fixed lag
    the rounds sampled by weights the restarted trainer recomputes (version >= start_round, i.e. rounds >=
    start_round + lag) and those versions; rounds sampled by earlier versions stay (they are what the uninterrupted
    run trained on). Free running (`lag` None) every round stays: the restarted trainer trains on the rounds the
    buffer holds, as the interrupted run did (a replay), and the sampler goes on after the last of them."""
    removed = {}
    for kind, folder, first in (("rounds", round_path(run_dir, 0).parent, start_round + (lag or 0)),
                                ("versions", version_path(run_dir, 0).parent, start_round + 1)):
        removed[kind] = 0
        for p in folder.iterdir() if folder.is_dir() else ():
            index = index_of(p.name)
            if p.name.endswith(".tmp") or (lag is not None and index is not None and index >= first):
                p.unlink()
                removed[kind] += not p.name.endswith(".tmp")
    return removed


def prune_versions(run_dir, below: int) -> int:
    """Remove the published versions older than `below` (no round still to be sampled, on any resume, needs them)."""
    folder = version_path(run_dir, 0).parent
    n = 0
    for p in folder.glob("version-*.safetensors") if folder.is_dir() else ():
        index = index_of(p.name)
        if index is not None and index < below:
            p.unlink()
            n += 1
    return n

"""Off-policy rounds (rollout=async): a sampler process samples each round ahead of the trainer, from a published
policy version, into a durable buffer in the run dir; the trainer takes its rounds from the buffer and corrects
them with TRL's importance-sampling ratio between the weights that sampled them and its own (decoupled PPO).

    <run>/offpolicy/policy/version-<v>.safetensors  the trainable parameters at the start of round v (the trainer)
    <run>/offpolicy/rounds/round-<r>.pt             round r as sampled (the sampler): its dataset rows, prompt and
                                                    completion ids, per-token behaviour log-probs, the version that
                                                    sampled it and the seed of its sampling RNG
    <run>/offpolicy/sampler.log                     the sampler process's output (every start appends)

With `rollout.lag=k` round r is sampled by version max(0, r - k): the sampler runs at most k rounds ahead, and a
run is reproducible and resumable bit for bit (each round's sampling RNG is seeded by (seed, round), never by the
position of a shared stream). Free running (`rollout.lag=null`): round r is sampled by the newest version at most r
published when the sampler starts it, and the sampler starts it only once version r - max_policy_age is out, so no
round is sampled older than the cap (none is sampled to be dropped); which version samples which round then depends
on the two processes' speeds, and the round file records it. Every file is written to a temporary name, fsynced and
renamed: a file that is there is whole.

Torch-free at import: the paths and the schedule are read by the control plane; harness.offpolicy.buffer and
harness.offpolicy.sampler import torch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DIR = "offpolicy"
POLL_S = 0.02  # how often one side of the buffer looks for the other's file


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / DIR


def version_path(run_dir: str | Path, version: int) -> Path:
    return root(run_dir) / "policy" / f"version-{version:06d}.safetensors"


def round_path(run_dir: str | Path, rnd: int) -> Path:
    return root(run_dir) / "rounds" / f"round-{rnd:06d}.pt"


def sampled_by(rnd: int, lag: int) -> int:
    """The policy version (round whose starting weights) that samples round `rnd` at a fixed lag."""
    return max(0, rnd - lag)


def index_of(name: str) -> int | None:
    """The round or version number of a buffer file's name (round-000003.pt, version-000002.safetensors), or None."""
    stem = name.split(".", 1)[0]
    head, _, digits = stem.rpartition("-")
    return int(digits) if head in ("round", "version") and digits.isdigit() else None


def newest_version(run_dir: str | Path, at_most: int) -> int | None:
    """The newest published policy version no newer than `at_most` (free running: the one that samples a round),
    or None when none is published."""
    folder = version_path(run_dir, 0).parent
    found = [index_of(p.name) for p in folder.glob("version-*.safetensors")] if folder.is_dir() else []
    found = [v for v in found if v is not None and v <= at_most]
    return max(found) if found else None


def age_allowed(rnd: int, version: int, lag: int | None, cap: int) -> bool:
    """Whether round `rnd` may be trained from a round sampled by `version`: at a fixed lag exactly
    sampled_by(rnd, lag); free running any version from rnd - cap to rnd."""
    if lag is not None:
        return version == sampled_by(rnd, lag)
    return 0 <= rnd - version <= cap


def round_seed(seed: int, rnd: int) -> int:
    """The seed of round `rnd`'s sampling RNG: a function of the run's seed and the round only, so a round sampled
    again (a restarted sampler, a resumed run) draws the same tokens."""
    return int.from_bytes(hashlib.sha256(f"offpolicy:{seed}:{rnd}".encode()).digest()[:4], "big")

"""hydra-submitit-launcher's SLURM launcher, as the harness runs it on a real cluster: the request checked against
`sinfo` before anything is submitted, sbatch's refusals named by field, jobs that die without a result ended within
a poll interval (with or without sacct), each job's record completed with the scheduler's view
(harness.slurm_launcher). Hydra imports every module of hydra_plugins when it starts: this one imports nothing heavy."""

from __future__ import annotations

from typing import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

from harness.slurm import register_resolvers

register_resolvers()  # conf/hydra/launcher/slurm*.yaml size the job from the placement (a job process too)


class SlurmLauncher(BaseSubmititLauncher):
    _EXECUTOR = "slurm"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from harness.slurm_launcher import launch

        return launch(self, job_overrides, initial_job_idx)

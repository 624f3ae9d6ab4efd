"""The harness's Hydra plugin: hydra/launcher=slurm and slurm_cpu (conf/hydra/launcher/) name its SlurmLauncher.
Hydra takes launchers only from the `hydra_plugins` namespace package; the logic is harness.slurm_launcher."""

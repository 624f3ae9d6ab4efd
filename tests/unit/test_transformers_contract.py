"""The private transformers hooks the resume audit relies on (harness/run/audit.py, NOTE(trl-1.16)).

If an upgrade renames or re-signs it, this fails here instead of the audit silently never
observing the RNG restore (which would make every resume audit fail with rng.* missing).
"""

import inspect

from transformers import Trainer


def test_trainer_load_rng_state_signature():
    sig = inspect.signature(Trainer._load_rng_state)
    assert list(sig.parameters) == ["self", "checkpoint"]


def test_the_optimizer_loads_after_the_weights():
    """The audit hashes the loaded weights on a thread from the start of _load_optimizer_and_scheduler on: the
    weights must be loaded by then (Trainer.train: _load_from_checkpoint before _inner_training_loop; FSDP and
    DeepSpeed load them in _prepare_for_training, before the optimizer)."""
    assert list(inspect.signature(Trainer._load_optimizer_and_scheduler).parameters) == ["self", "checkpoint"]
    train = inspect.getsource(Trainer.train)
    assert train.index("self._load_from_checkpoint(resume_from_checkpoint)") < train.index("_inner_training_loop")
    prep = inspect.getsource(Trainer._prepare_for_training)
    assert prep.index("_load_from_checkpoint(resume_from_checkpoint, self.model_wrapped)") \
        < prep.index("_load_optimizer_and_scheduler(resume_from_checkpoint)")


def test_rng_is_restored_inside_the_epoch_loop_after_the_optimizer():
    """The audit compares params/optimizer/scheduler at on_train_begin and RNG after _load_rng_state."""
    src = inspect.getsource(Trainer._run_epoch)
    assert "_load_rng_state(resume_from_checkpoint)" in src
    prep = inspect.getsource(Trainer._prepare_for_training)
    assert "_load_optimizer_and_scheduler(resume_from_checkpoint)" in prep


def test_the_optimizer_state_loads_through_torch_load_onto_the_cpu_in_one_process():
    """The audit hashes each optimizer storage as torch.load reads it (harness/run/audit.py
    _storages_hashed_as_loaded, NOTE(transformers-5.24)): the Trainer calls torch.load through the module attribute,
    with map_location "cpu" unless several processes train on GPUs."""
    src = inspect.getsource(Trainer._load_optimizer_and_scheduler)
    assert "self.args.device if self.args.world_size > 1 and self.args.device.type != \"cpu\" else \"cpu\"" in src
    assert "torch.load(\n                                os.path.join(checkpoint, OPTIMIZER_NAME), map_location=map_location, " \
           "weights_only=True" in src

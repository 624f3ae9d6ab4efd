"""What a run accounts for, bound together: the append-only logs and their frontiers (logs), the ledger
and reward-trace writer handed to TRL (ledger), checkpoint publishing and retention (checkpoint) and the
state digests a resume audit compares (statedigest). Torch-free except statedigest's inputs."""

"""The configuration: schemas (fields, schema; an arm's in arms/<name>/config.py), Hydra's ConfigStore and
`--help` (store, help), composing a command line (compose), the strict override check (overrides) and the
cross-field plan checks (checks). Torch-free; no module here imports harness.plan or the lifecycle."""

#!/usr/bin/env bash
# The default job (tiny local VLM, synthetic evidence data, CPU); extra arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
scripts/ensure_venv.sh
exec .venv/bin/python -m harness "$@"

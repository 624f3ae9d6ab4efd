#!/usr/bin/env bash
# Create and fill the project-local .venv when it is missing or stale; a no-op otherwise.
# torch is installed first and alone as torch==2.13.0 (the CPU wheel on this disk: a bare
# `torch` would pull a multi-GB CUDA build); everything else is pinned by constraints.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.harness-installed"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "harness needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
echo "[setup] installing the project into $venv (first run or changed pins; ~1 min)..." >&2
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip_q() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2); }
pip_q torch==2.13.0
pip_q -c "$root/constraints.txt" -e "$root[all]"
echo "$want" > "$stamp"
echo "[setup] done." >&2

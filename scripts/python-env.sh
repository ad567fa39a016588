#!/usr/bin/env bash
# Create (or reuse) .venv with the Python packages the parity tests need (requirements-parity.txt)
# and the CUDA headers the trainer's `nccl` feature builds against (requirements-cuda.txt).
# Idempotent: a stamp file records the hash of the requirements, so reruns cost nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ORCH_VENV:-$ROOT/.venv}"
REQ=("$ROOT/scripts/requirements-parity.txt" "$ROOT/scripts/requirements-cuda.txt")
STAMP="$VENV/.requirements.sha256"
want="$(cat "${REQ[@]}" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  exit 0
fi
echo "python-env: installing $(cat "${REQ[@]}" | grep -cv '^#') packages into $VENV" >&2
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${REQ[@]/#/-r}"
echo "$want" > "$STAMP"

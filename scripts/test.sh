#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this and nothing else):
# Postgres + migrations, the Python environment (parity fixtures and libtorch for the trainer),
# chromium + playwright-core (dashboard browser tests),
# fmt, clippy, and every workspace test (the trainer's on CPU), then the trainer's NCCL build
# (clippy and trainer/tests/nccl.rs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A one-shot build gains nothing from incremental caches, and they cost disk (see Cargo.toml's
# [profile.dev] note on the CI machine that ran out of space).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== setup (Postgres, migrations)"
ORCH_PROFILE=debug bash scripts/setup.sh
echo "== python environment for parity fixtures"
bash scripts/python-env.sh
echo "== chromium and playwright-core for the dashboard's browser tests"
bash scripts/browser-env.sh
# libtorch for the trainer (tch 0.24) comes from the venv's torch==2.11.0 wheel.
source scripts/torch-env.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The trainer's GPU build (NCCL groups, vLLM's NCCL weight route) compiles and links against the
# CUDA torch wheel without a GPU; its tests below show what runs without one. A CPU-only torch
# (another ORCH_VENV) has no libtorch_cuda in TORCH_LIB (torch-env.sh) to build it against:
# then it is skipped, loudly.
if [[ -f "$TORCH_LIB/libtorch_cuda.so" ]]; then
  NCCL_BUILD=1
  cargo clippy -p trainer --all-targets --features nccl -- -D warnings
else
  NCCL_BUILD=0
  echo "== SKIPPED: the nccl build (no libtorch_cuda.so in $TORCH_LIB: a CPU-only torch)"
fi
echo "== cargo test"
log="$(mktemp)"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [[ "$NCCL_BUILD" == 1 ]]; then
  echo "== cargo test -p trainer --features nccl --test nccl"
  cargo test -p trainer --features nccl --test nccl 2>&1 | tee -a "$log"
  nccl_status=${PIPESTATUS[0]}
  [[ "$status" == 0 ]] && status=$nccl_status
fi
set -e
passed=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"
echo "${passed} passed, ${failed} failed"
exit "$status"

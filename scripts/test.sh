#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this and nothing else):
# Postgres + migrations, the Python parity environment, fmt, clippy, and every workspace test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== setup (Postgres, migrations)"
ORCH_PROFILE=debug bash scripts/setup.sh
echo "== python environment for parity fixtures"
bash scripts/python-env.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace --no-fail-fast

#!/usr/bin/env bash
# trainer serve on this machine: generation throughput at 1, 8 and 64 concurrent requests for a
# tiny and a small model (beside the same model decoding one sequence in-process, no server),
# and the handoff of a 256 x 16k-token train batch (encode, send, decode + validate).
#   scripts/bench-serve.sh [MAX_TOKENS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/python-env.sh
source scripts/torch-env.sh
cargo bench -p trainer --bench serve -- "${1:-64}"

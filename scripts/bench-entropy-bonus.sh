#!/usr/bin/env bash
# What the entropy bonus (`trainer.entropy_bonus`) costs a train step: `trainer bench` with it
# off and on (c = 0.1; every counted token of the bench's batch has an advantage, so every one
# takes the bonus), in alternating rounds, printing the median seconds per step of each and
# their ratio. The bonus's work is in the head, so the vocabulary sets its share.
#   scripts/bench-entropy-bonus.sh [CONFIG] [SEQS] [SEQ_LEN] [extra trainer-bench flags...]
# Defaults: trainer/configs/small.json, 4 x 512 tokens, full fine-tune, on CPU (or CUDA if seen).
# BENCH_VOCAB=151936 overrides the config's vocabulary (Qwen3's) in a temporary copy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG="${1:-trainer/configs/small.json}"
SEQS="${2:-4}"
LEN="${3:-512}"
shift $(( $# > 3 ? 3 : $# ))
STEPS="${BENCH_STEPS:-3}"
ROUNDS="${BENCH_ROUNDS:-5}"
source scripts/torch-env.sh
cargo build --release -p orchestrator -p trainer --quiet
if [[ -n "${BENCH_VOCAB:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["vocab_size"]=int(sys.argv[2]); json.dump(c, open(sys.argv[3], "w"))' \
    "$CONFIG" "$BENCH_VOCAB" "$tmp/config.json"
  CONFIG="$tmp/config.json"
fi
common=(--config "$CONFIG" --seqs "$SEQS" --seq-len "$LEN" --steps "$STEPS" --warmup 1)
runs=()
for _ in $(seq 1 "$ROUNDS"); do
  runs+=("off $(target/release/trainer bench "${common[@]}" "$@")")
  runs+=("on $(target/release/trainer bench "${common[@]}" --entropy-bonus 0.1 "$@")")
done
python3 - "$CONFIG" "$SEQS" "$LEN" "$ROUNDS" "${runs[@]}" <<'PY'
import json, statistics, sys
cfg, seqs, n, rounds = sys.argv[1:5]
rows = {}
for line in sys.argv[5:]:
    name, _, js = line.strip().partition(" ")
    rows.setdefault(name, []).append(json.loads(js.strip().splitlines()[-1])["seconds_per_step"])
vocab = json.load(open(cfg))["vocab_size"]
off, on = statistics.median(rows["off"]), statistics.median(rows["on"])
print(f"vocab {vocab}, {seqs} x {n} tokens, median of {rounds} rounds (s/step):")
print(f"  bonus off {off:.3f}   bonus on {on:.3f}   on/off {on / off:.3f}")
print("  rounds off:", " ".join(f"{x:.3f}" for x in rows["off"]))
print("  rounds on: ", " ".join(f"{x:.3f}" for x in rows["on"]))
PY

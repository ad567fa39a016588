#!/usr/bin/env bash
# Train-step throughput of our trainer beside PyTorch + transformers doing the same step in the
# same run (same config, dtype, SDPA, batch, loss, AdamW). Prints both and the ratio of medians
# over BENCH_ROUNDS alternating rounds (default 5) of BENCH_STEPS timed steps (default 3).
#   scripts/bench-trainer.sh [CONFIG] [SEQS] [SEQ_LEN] [LORA_R] [extra trainer-bench flags...]
# Defaults: trainer/configs/small.json, 4 x 512 tokens, full fine-tune, on CPU (or CUDA if seen).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG="${1:-trainer/configs/small.json}"
SEQS="${2:-4}"
LEN="${3:-512}"
LORA="${4:-0}"
shift $(( $# > 4 ? 4 : $# ))
STEPS="${BENCH_STEPS:-3}"
ROUNDS="${BENCH_ROUNDS:-5}"
bash scripts/python-env.sh
source scripts/torch-env.sh
# Both packages, as every other build here: building one alone changes the features the
# workspace's dependencies are compiled with and rebuilds them.
cargo build --release -p orchestrator -p trainer --quiet
common=(--config "$CONFIG" --seqs "$SEQS" --seq-len "$LEN" --steps "$STEPS" --warmup 1 --lora-r "$LORA")
gc=$(printf '%s\n' "$@" | grep -x -- '--grad-checkpoint' || true)
# The trainer binary raises glibc's mmap and trim thresholds at start (trainer/src/alloc.rs); the
# reference runs twice a round, as users run it and with the same thresholds through glibc's
# environment variables, so the ratio shows what is the allocator and what is the step.
# Rounds alternate the three, so this shared VM's drift falls on all of them alike.
heap=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824)
runs=()
for r in $(seq 1 "$ROUNDS"); do
  runs+=("ours $(target/release/trainer bench "${common[@]}" "$@")")
  runs+=("ref $("$ROOT/.venv/bin/python" scripts/parity/bench_step.py "${common[@]}" $gc)")
  runs+=("refheap $(env "${heap[@]}" "$ROOT/.venv/bin/python" scripts/parity/bench_step.py "${common[@]}" $gc)")
done
python3 - "$CONFIG" "$SEQS" "$LEN" "$LORA" "$ROUNDS" "${gc:-none}" "${runs[@]}" <<'PY'
import json, statistics, sys
cfg, seqs, n, lora, rounds, gc = sys.argv[1:7]
rows = {}
for line in sys.argv[7:]:
    name, _, js = line.strip().partition(" ")
    rows.setdefault(name, []).append(json.loads(js))
mode = f"LoRA r={lora}" if lora != "0" else "full fine-tune"
if gc != "none":
    mode += ", gradient checkpointing"
print(f"config {cfg}, {seqs} x {n} tokens, {mode}, {rounds} alternating rounds (median, min-max s/step)")
med = {}
for name, label in [("ours", "ours (tch)"), ("ref", "PyTorch + transformers"),
                    ("refheap", "  same, glibc thresholds as ours")]:
    s = [r["seconds_per_step"] for r in rows[name]]
    med[name] = statistics.median(s)
    extra = ""
    if name == "ours" and rows[name][0].get("mfu"):
        extra = f"  MFU {statistics.median(r['mfu'] for r in rows[name]) * 100:.1f}%"
    elif name == "ref":
        extra = f"  torch {rows[name][0]['torch']}, {rows[name][0]['threads']} threads"
    tps = rows[name][0]["tokens_per_step"] / med[name]
    print(f"  {label:34s} {tps:10.1f} tokens/s  ({med[name]:.3f} s/step, {min(s):.3f}-{max(s):.3f}){extra}")
print(f"  ratio ours / PyTorch               {med['ref'] / med['ours']:.2f}x")
print(f"  ratio ours / PyTorch, same glibc   {med['refheap'] / med['ours']:.2f}x")
PY

#!/usr/bin/env bash
# Train-step throughput of our trainer beside PyTorch + transformers doing the same step in the
# same run (same config, dtype, SDPA, batch, loss, AdamW). Prints both and the ratio.
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
bash scripts/python-env.sh
source scripts/torch-env.sh
cargo build --release -p trainer --quiet
common=(--config "$CONFIG" --seqs "$SEQS" --seq-len "$LEN" --steps "$STEPS" --warmup 1 --lora-r "$LORA")
ours=$(target/release/trainer bench "${common[@]}" "$@")
ref=$("$ROOT/.venv/bin/python" scripts/parity/bench_step.py "${common[@]}" $(printf '%s\n' "$@" | grep -x -- '--grad-checkpoint' || true))
python3 - "$ours" "$ref" "$CONFIG" "$SEQS" "$LEN" "$LORA" <<'PY'
import json, sys
ours, ref = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cfg, seqs, n, lora = sys.argv[3:7]
mode = f"LoRA r={lora}" if lora != "0" else "full fine-tune"
print(f"config {cfg}, {seqs} x {n} tokens, {mode}")
print(f"  ours (tch)              {ours['tokens_per_second']:10.1f} tokens/s  ({ours['seconds_per_step']:.3f} s/step)"
      + (f"  MFU {ours['mfu']*100:.1f}%" if ours.get('mfu') else ""))
print(f"  PyTorch + transformers  {ref['tokens_per_second']:10.1f} tokens/s  ({ref['seconds_per_step']:.3f} s/step, torch {ref['torch']}, {ref['threads']} threads)")
print(f"  ratio ours / PyTorch    {ours['tokens_per_second'] / ref['tokens_per_second']:.2f}x")
PY

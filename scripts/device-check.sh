#!/usr/bin/env bash
# The trainer's GPU checks (issue 22), from binaries built here with the `nccl` feature and run
# on a machine with an NVIDIA GPU whose python3 holds torch 2.11 (+cu130) and transformers:
#   scripts/device-check.sh build       # here: build, strip and copy the binaries into .devbin/
#   scripts/device-check.sh run OUTDIR [CASES]  # there, from the repo root with .devbin/: logs in
#                                       # OUTDIR; CASES: a file of bench runs (default below)
#   scripts/device-check.sh pack-warm DIR       # here: init-smoke.sh's training inputs from DIR
#   scripts/device-check.sh warm OUTDIR INPUTS  # there: init-smoke.sh's warm start on the GPU
#   scripts/device-check.sh pack-reflect DIR    # here: reflection-pass.sh's inputs from DIR
#   scripts/device-check.sh reflect OUTDIR INPUTS  # there: three reflection passes on the GPU
# `run` needs no Rust toolchain: the binaries load the GPU machine's own libtorch, CUDA runtime
# and NCCL (LD_LIBRARY_PATH before the build's RUNPATH). It runs trainer/tests/nccl.rs and
# trainer/tests/cuda.rs with RUBRICEM_REQUIRE_CUDA=1, then (DEVICE_CHECK_DP_ROUNDS=N, default 0:
# skipped) tests/dist.rs's data-parallel timing on that machine's CPUs (gloo, 1 and 2 ranks of
# one thread each, N rounds: the scaling figure on a machine with cores to spare), then
# `trainer bench` beside the PyTorch + transformers reference (scripts/parity/bench_step.py) on
# the same steps.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

build() {
  set -e
  bash scripts/python-env.sh
  source scripts/torch-env.sh
  mkdir -p .devbin
  cargo test --release -p trainer --features nccl --test nccl --test cuda --test dist --no-run \
    --message-format=json >.devbin/build.json
  python3 - <<'PY'
import json, subprocess
for line in open(".devbin/build.json"):
    j = json.loads(line)
    exe = j.get("executable")
    if exe and j["target"]["name"] in ("trainer", "nccl", "cuda", "dist"):
        subprocess.run(["strip", "-o", f".devbin/{j['target']['name']}", exe], check=True)
PY
  rm .devbin/build.json
  ls -la .devbin
}

# The GPU machine's torch libraries, CUDA runtime and NCCL on LD_LIBRARY_PATH.
gpu_libs() {
  local site
  site="$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
  local libs="$site/torch/lib"
  for so in libcudart.so.13 libnccl.so.2; do
    libs="$libs:$(dirname "$(find "$site/nvidia" -name "$so" | head -1)")"
  done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# Here: the inputs of init-smoke.sh's training stages from DIR (made with INIT_INPUTS_ONLY=1),
# packed into .devwarm/inputs.tar.xz for `warm` there.
pack_warm() {
  local dir="${1:?DIR}"
  mkdir -p .devwarm
  (cd "$dir" && tar -cJf "$ROOT/.devwarm/inputs.tar.xz" world/tasks.jsonl world/tasks-sft.jsonl \
    world/tasks-rl.jsonl index/meta.json sft-demos.jsonl sft.jsonl tokenizer model-init)
  ls -la .devwarm
}

# There: init-smoke.sh's copying exercise and two SFT passes on the GPU in f32 (INIT_DEVICE=cuda
# INIT_DTYPE=f32) from the packed inputs; OUT gets model-sft.tar, provenance.txt (the hash of
# every stage, the machine) and the trainer's output. INIT_SFT_SPLIT as the inputs were made.
warm() {
  local out="${1:?OUTDIR}" pack="${2:?INPUTS.tar.xz}"
  gpu_libs
  local dir=/tmp/warm
  mkdir -p "$dir" "$out"
  tar -xJf "$pack" -C "$dir"
  INIT_SFT_SPLIT="${INIT_SFT_SPLIT:-3:2}" INIT_DEVICE=cuda INIT_DTYPE=f32 ORCH_BIN=/bin/false \
    TRAINER_BIN="$ROOT/.devbin/trainer" bash scripts/init-smoke.sh "$dir" || return 1
  cp "$dir/provenance.txt" "$out/"
  tar -C "$dir" -cf "$out/model-sft.tar" model-sft
}

# Here: what scripts/reflection-pass.sh trains from in DIR (a directory init-smoke.sh made: its
# model-sft, and the pass's rows, which the script's data step writes first when DIR has none),
# packed into .devwarm/reflect.tar.xz for `reflect` there. A model-sft that is a saved warm start
# under warm-starts/ (init-smoke.sh's INIT_WARM_START) is named, not packed: the tracked tree
# travels anyway, and the device call's 64 MiB holds the tree, the binaries and this pack.
pack_reflect() {
  local dir="${1:?DIR}" saved="" w
  REFLECT_DATA_ONLY=1 bash scripts/reflection-pass.sh "$dir" || return 1
  for w in warm-starts/*/; do
    if cmp -s "$w/model.safetensors" "$dir/model-sft/model.safetensors"; then saved="${w%/}"; fi
  done
  mkdir -p .devwarm
  local model=(model-sft)
  if [[ -n "$saved" ]]; then
    echo "$saved" >"$dir/model-sft-saved"
    model=(model-sft-saved)
    echo "pack-reflect: model-sft is $saved (named, not packed)" >&2
  fi
  (cd "$dir" && tar -cJf "$ROOT/.devwarm/reflect.tar.xz" index/meta.json "${model[@]}" \
    sft-reflect-demos.jsonl sft-reflect-injected.jsonl sft-reflect.jsonl)
  rm -f "$dir/model-sft-saved"
  ls -la .devwarm
}

# There: three reflection passes on the GPU in f32 from the packed inputs, as
# warm-starts/split-3-2-reflect's table lists them (row-order seeds 2, 3 and 4, each from the
# last; here every pass takes the same rows: today's script always adds the injected ones).
# OUT gets model-reflect3.tar and each pass's provenance.
reflect() {
  local out="${1:?OUTDIR}" pack="${2:?INPUTS.tar.xz}"
  gpu_libs
  local dir=/tmp/reflect from=model-sft to seed
  mkdir -p "$dir" "$out"
  tar -xJf "$pack" -C "$dir"
  if [[ -f "$dir/model-sft-saved" ]]; then
    mkdir -p "$dir/model-sft"
    cp "$(cat "$dir/model-sft-saved")"/{*.json,model.safetensors} "$dir/model-sft/"
  fi
  for seed in 2 3 4; do
    to="model-reflect$([[ $seed == 2 ]] || echo $((seed - 1)))"
    REFLECT_FROM="$from" REFLECT_OUT="$to" REFLECT_SEED="$seed" REFLECT_DEVICE=cuda \
      REFLECT_DTYPE=f32 ORCH_BIN=/bin/false TRAINER_BIN="$ROOT/.devbin/trainer" \
      bash scripts/reflection-pass.sh "$dir" || return 1
    cp "$dir/provenance-$to.txt" "$out/"
    from="$to"
  done
  tar -C "$dir" -cf "$out/model-reflect3.tar" model-reflect3
}

run() {
  local out="${1:?OUTDIR}"
  local only="${DEVICE_CHECK_ONLY:-all}"  # all, tests or bench
  mkdir -p "$out"
  local py=python3
  gpu_libs
  {
    nvidia-smi -L
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
    $py -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    ldd .devbin/trainer | grep -E 'not found|libtorch_cuda|libnccl|libcudart'
  } 2>&1 | tee "$out/env.log"
  export RUBRICEM_REQUIRE_CUDA=1
  if [[ $only != bench ]]; then
    echo "== trainer/tests/nccl.rs"
    timeout 180 .devbin/nccl --test-threads=1 --nocapture 2>&1 | tee "$out/nccl.log"
    echo "== trainer/tests/cuda.rs"
    timeout 300 .devbin/cuda --test-threads=1 --nocapture 2>&1 | tee "$out/cuda.log"
  fi
  [[ $only == tests ]] && return 0
  local rounds="${DEVICE_CHECK_DP_ROUNDS:-0}"
  if ((rounds > 0)); then
    echo "== tests/dist.rs data_parallel_timing on the CPUs, $rounds rounds"
    DP_TIMING_ROUNDS="$rounds" timeout 400 .devbin/dist data_parallel_timing --exact \
      --ignored --nocapture --test-threads=1 2>&1 | tee "$out/dp-timing.log" | grep -v 'timing -> '
  fi
  echo "== trainer bench beside PyTorch + transformers (SDPA, AdamW)"
  # One line per run: who (ours; before: BEFORE_BIN; ref: bf16 parameters and AdamW state; amp:
  # fp32 parameters under bf16 autocast, fused AdamW), the config's name, the flags both take.
  local cases="${2:-}"
  if [[ -z "$cases" ]]; then
    cases="$(mktemp)"
    cat >"$cases" <<'CASES'
ours qwen3-0.6b --seqs 8 --seq-len 1024 --steps 5 --warmup 2
ref qwen3-0.6b --seqs 8 --seq-len 1024 --steps 5 --warmup 2
amp qwen3-0.6b --seqs 8 --seq-len 1024 --steps 5 --warmup 2
ours qwen3-0.6b --seqs 8 --seq-len 1024 --steps 5 --warmup 2 --lora-r 16
ref qwen3-0.6b --seqs 8 --seq-len 1024 --steps 5 --warmup 2 --lora-r 16
ours qwen3-0.6b --seqs 8 --seq-len 2048 --steps 5 --warmup 2 --grad-checkpoint
ref qwen3-0.6b --seqs 8 --seq-len 2048 --steps 5 --warmup 2 --grad-checkpoint
amp qwen3-0.6b --seqs 8 --seq-len 2048 --steps 5 --warmup 2 --grad-checkpoint
ours qwen3-8b --seqs 4 --seq-len 2048 --steps 3 --warmup 1 --lora-r 16 --grad-checkpoint
ref qwen3-8b --seqs 4 --seq-len 2048 --steps 3 --warmup 1 --lora-r 16 --grad-checkpoint
CASES
  fi
  local who cfg args r exe
  # TRAINER_BIN: another build of the trainer to time (e.g. before a change), named in the log.
  local bin="${TRAINER_BIN:-.devbin/trainer}"
  # BEFORE_BIN: the build a `before` line times (e.g. the commit before a change), so a change is
  # timed before and after on the same machine in one call.
  local before="${BEFORE_BIN:-.devbin/trainer-before}"
  while read -r who cfg args; do
    [[ -z "$who" ]] && continue
    case "$who" in
      ours | before)
        exe="$bin"
        [[ $who == before ]] && exe="$before"
        r="$(timeout 240 "$exe" bench --config "trainer/configs/$cfg.json" $args \
          --device cuda --peak-flops 989e12 2>>"$out/bench.err")" ;;
      ref | amp) r="$(timeout 240 $py scripts/parity/bench_step.py --config "trainer/configs/$cfg.json" \
          $args --device cuda --precision "$([[ $who == amp ]] && echo amp || echo bf16)" \
          2>>"$out/bench.err")" ;;
    esac
    [[ $who == ours && $bin != .devbin/trainer ]] && who="ours($bin)"
    [[ $who == before ]] && who="before($before)"
    echo "$who $cfg $args | ${r:-failed}" | tee -a "$out/bench.log"
  done <"$cases"
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  pack-warm) shift; pack_warm "$@" ;;
  warm) shift; warm "$@" ;;
  pack-reflect) shift; pack_reflect "$@" ;;
  reflect) shift; reflect "$@" ;;
  *) echo "usage: $0 build | run OUTDIR [CASES] | pack-warm DIR | warm OUTDIR INPUTS | pack-reflect DIR | reflect OUTDIR INPUTS" >&2; exit 2 ;;
esac

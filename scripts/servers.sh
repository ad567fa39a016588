# Source me: starting `trainer serve` processes for scripts/smoke.sh, scripts/ablation-mini.sh,
# scripts/probe-injection.sh and scripts/bench-wave.sh.
# Expects BIN (the binaries' directory) and ROOT (the repository root) to be set, and appends
# every started pid to the array PIDS (the caller's EXIT trap stops them).

# Keep an earlier run's log: FILE becomes FILE.1 (then .2, ...) instead of being overwritten, so
# a resumed or repeated run in the same directory leaves the first attempt's log readable.
keep_log() { # file
  local f=$1 n=1
  [[ -s "$f" ]] || return 0
  while [[ -e "$f.$n" ]]; do n=$((n + 1)); done
  mv "$f" "$f.$n"
}

# Exit unless nothing listens on 127.0.0.1:PORT. A server started there would fail to bind while
# wait_up took the process already listening (say, an earlier run's server still finishing its
# final evaluation) for it, and two runs would share one trainer.
port_free() { # port
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "127.0.0.1:$1 is already in use (an earlier run's server?); stop it or choose other ports" >&2
    exit 1
  fi
}

# Wait until URL answers /health (up to 2 minutes), else say where its log is and exit; with
# PID, exit as soon as that process has stopped (a failed bind, a bad model) instead of waiting.
wait_up() { # url log [pid]
  for _ in $(seq 1 240); do
    if [[ -n "${3:-}" ]] && ! kill -0 "$3" 2>/dev/null; then
      echo "server for $1 exited; see $2" >&2
      exit 1
    fi
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server at $1 did not start; see $2" >&2
  exit 1
}

# `trainer serve --bind 127.0.0.1:PORT ARGS...`, its output in LOG, once nothing else listens on
# PORT (port_free): its pid in SERVER_PID and appended to PIDS; returns when it answers /health
# (wait_up, which exits if it stops first).
start_server() { # port log [serve args...]
  local port=$1 log=$2
  shift 2
  port_free "$port"
  "$BIN/trainer" serve --bind "127.0.0.1:$port" "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_up "http://127.0.0.1:$port" "$log" "$SERVER_PID"
}

# The split layout on one core each: a policy server on PORT+1 and a trainer on PORT that
# checkpoints into DIR/checkpoints and publishes every version to the policy server (through
# DIR/published); logs DIR/policy.log and DIR/trainer.log (earlier ones kept by keep_log).
start_split_pair() { # port model dir
  local port=$1 model=$2 dir=$3
  mkdir -p "$dir"
  keep_log "$dir/policy.log"
  keep_log "$dir/trainer.log"
  start_server $((port + 1)) "$dir/policy.log" --model "$model" --threads 1 --device cpu
  start_server "$port" "$dir/trainer.log" --model "$model" --threads 1 --device cpu \
    --checkpoint-dir "$dir/checkpoints" --publish-url "http://127.0.0.1:$((port + 1))" \
    --publish-dir "$ROOT/$dir/published"
}

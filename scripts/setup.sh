#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: make Postgres reachable, create the database, apply the
# migrations. Uses DATABASE_URL if it answers; otherwise starts the local Debian cluster
# (installing the package if missing); otherwise prints the compose command.
#
#   DATABASE_URL   default postgres://postgres@127.0.0.1:5432/rubricem
#   ORCH_PROFILE   cargo profile used to run `orchestrator migrate` (release | debug; default release)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rubricem}"
PROFILE="${ORCH_PROFILE:-release}"

# host and port from the URL (postgres://user[:pw]@host[:port]/db)
hostport="${DATABASE_URL#*://}"; hostport="${hostport#*@}"; hostport="${hostport%%/*}"
PGHOST_="${hostport%%:*}"; PGPORT_="${hostport##*:}"
[[ "$PGPORT_" == "$hostport" ]] && PGPORT_=5432

say() { echo "setup: $*" >&2; }
reachable() { (exec 3<>"/dev/tcp/$PGHOST_/$PGPORT_") 2>/dev/null; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

start_local_cluster() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      say "installing PostgreSQL from Debian's packages"
      as_root apt-get update -qq
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq postgresql >/dev/null
    else
      return 1
    fi
  fi
  local ver
  ver="$(pg_lsclusters -h 2>/dev/null | awk '{print $1; exit}')"
  if [[ -z "$ver" ]]; then
    ver="$(ls /usr/lib/postgresql | sort -V | tail -1)"
    say "creating cluster $ver/main"
    as_root pg_createcluster "$ver" main >/dev/null
  fi
  local hba="/etc/postgresql/$ver/main/pg_hba.conf"
  if [[ -f "$hba" ]] && ! grep -q '# rubricem: trust loopback' "$hba"; then
    # Local development: trust TCP connections from this machine only (as CI machines are set up).
    say "allowing trusted connections from 127.0.0.1 and ::1 in $hba"
    as_root sed -i '1i # rubricem: trust loopback\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
  fi
  say "starting cluster $ver/main"
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null \
    || as_root pg_ctlcluster "$ver" main start 2>/dev/null \
    || as_root pg_ctlcluster "$ver" main reload
  for _ in $(seq 1 30); do reachable && return 0; sleep 1; done
  return 1
}

if reachable; then
  say "Postgres answers at $PGHOST_:$PGPORT_"
elif [[ "$PGHOST_" == "127.0.0.1" || "$PGHOST_" == "localhost" ]] && start_local_cluster; then
  say "local Postgres started at $PGHOST_:$PGPORT_"
else
  say "no Postgres at $PGHOST_:$PGPORT_ and no local cluster could be started."
  say "start one with:  docker compose up -d postgres   (then rerun this script)"
  exit 1
fi

# The orchestrator's build installs the dashboard's chart library from the npm registry
# (orchestrator/build.rs): Node.js and npm must be on PATH.
if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    say "installing Node.js and npm from Debian's packages (the dashboard's build needs npm)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null
  else
    say "npm not found: install Node.js and npm (orchestrator/build.rs runs npm ci)"
    exit 1
  fi
fi

flag=(); [[ "$PROFILE" == "release" ]] && flag=(--release)
cargo run -q "${flag[@]}" -p orchestrator -- migrate

#!/usr/bin/env bash
# What the dashboard's browser tests need: Debian's chromium (apt) and playwright-core (npm,
# pinned by scripts/browser/package-lock.json) to drive it. Idempotent; scripts/test.sh runs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (apt)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "installing nodejs and npm (apt)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
cd "$ROOT/scripts/browser"
if [ ! -f node_modules/playwright-core/package.json ] || ! cmp -s package-lock.json node_modules/.package-lock.json 2>/dev/null; then
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
fi
echo "browser tests: $(chromium --version 2>/dev/null | tail -1), playwright-core $(node -p "require('./node_modules/playwright-core/package.json').version")"

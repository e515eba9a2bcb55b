#!/usr/bin/env bash
# Print the path of a Chromium the browser tests can drive, installing one if none is found.
#
#   tools/browser.sh [PYTHON]      (make test runs it and exports the path as KVVIZ_CHROMIUM)
#
# Order: $KVVIZ_CHROMIUM; a Chromium on PATH; Playwright's own build (python -m playwright install
# --with-deps chromium); Debian's chromium through apt-get when running as root (or with password-less
# sudo). Otherwise it says what to install and exits 1. Progress goes to stderr, the path to stdout.
set -uo pipefail
PY="${1:-python3}"
PLAYWRIGHT_TIMEOUT_S="${KVVIZ_PLAYWRIGHT_TIMEOUT_S:-300}"

found() { echo "$1"; exit 0; }
say() { echo "tools/browser.sh: $*" >&2; }

on_path() {
  local name
  for name in chromium chromium-browser google-chrome-stable google-chrome; do
    command -v "$name" 2>/dev/null && return 0
  done
  return 1
}

if [ -n "${KVVIZ_CHROMIUM:-}" ]; then
  [ -x "$KVVIZ_CHROMIUM" ] && found "$KVVIZ_CHROMIUM"
  say "KVVIZ_CHROMIUM=$KVVIZ_CHROMIUM is not an executable file; looking for another Chromium."
fi
path=$(on_path) && found "$path"

say "no Chromium on PATH; trying Playwright's own build."
if timeout "$PLAYWRIGHT_TIMEOUT_S" "$PY" -m playwright install --with-deps chromium >&2; then
  path=$("$PY" -c 'from playwright.sync_api import sync_playwright
with sync_playwright() as pw:
    print(pw.chromium.executable_path)' 2>/dev/null)
  [ -n "$path" ] && [ -x "$path" ] && found "$path"
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
fi
if [ "$SUDO" != "none" ] && command -v apt-get >/dev/null 2>&1; then
  say "Playwright could not install its browser; installing Debian's chromium with apt-get."
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q chromium >&2
  path=$(on_path) && found "$path"
fi

say "no Chromium for the browser tests. Install one (Debian/Ubuntu: sudo apt-get install -y chromium;" \
    "or: $PY -m playwright install --with-deps chromium) or set KVVIZ_CHROMIUM=/path/to/chromium."
exit 1

#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (tests/browser/, Playwright driving
# /usr/bin/chromium headless). Playwright's own browser download is never used: it is a binary
# fetched from outside the package registries.
#
#   scripts/install-chromium.sh     # no-op when /usr/bin/chromium (or $CP_CHROMIUM) runs
#
# Installs with apt-get when it can (root, or passwordless sudo); otherwise it says how and exits
# 0: the browser tests then skip, naming the same command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# the packages: one list, which CI also reads (.ci/fresh_machine.py keeps them visible)
PACKAGES="$(sed 's/#.*//' debian-packages.txt | xargs)"

BROWSER="${CP_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$BROWSER" ] && "$BROWSER" --version >/dev/null 2>&1; then
  echo "chromium: $("$BROWSER" --version 2>/dev/null) ($BROWSER)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no apt-get here; install Chromium and set CP_CHROMIUM=/path/to/chromium for the browser tests" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install-chromium: run 'sudo apt-get install chromium' for the browser tests (they skip without it)" >&2
    exit 0
  fi
fi
echo "installing Debian's $PACKAGES (apt-get, from scripts/debian-packages.txt)"
$SUDO apt-get update -qq
# shellcheck disable=SC2086  # one word a package
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
echo "chromium: $("$BROWSER" --version 2>/dev/null) ($BROWSER)"

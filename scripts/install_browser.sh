#!/usr/bin/env bash
# Headless Chromium and its WebDriver from Debian's packages (`chromium`, `chromium-driver`): what
# tests/test_report_browser.py opens the sign-off pages in. Idempotent: where both are on PATH it
# does nothing, so CI runs it every time.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null

#!/usr/bin/env bash
# Headless Chromium from Debian's packages, for checking the MLflow UI as a user sees it.
# Does nothing when a Chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
    exit 0
fi
SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium

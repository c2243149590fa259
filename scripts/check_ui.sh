#!/usr/bin/env bash
# Check the MLflow UI as a user sees it: headless Chromium (installed from Debian's packages
# if missing) opens the comparison of the newest pipeline run's evaluate runs and must find
# their WRG / mean AOG / mean NTS. Run after `make repro`; the screenshot goes to reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
exec "${VENV:-.venv}/bin/prefshift" ui --check --port "${PORT:-5099}" --screenshot reports/mlflow_ui.png

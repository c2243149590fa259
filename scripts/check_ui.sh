#!/usr/bin/env bash
# Check the MLflow UI as a user sees it: headless Chromium (installed from Debian's packages
# if missing) opens the comparison of the newest pipeline run's evaluate runs and each run's
# page, and must find their WRG / mean AOG / mean NTS. Run after `make repro`; the screenshot
# goes to reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_chromium.sh
exec "${VENV:-.venv}/bin/prefshift" ui --check --port "${PORT:-5099}" --screenshot reports/mlflow_ui.png

#!/usr/bin/env bash
# Run the slow kill / resume / atomic-output tests N times while CPU-heavy processes compete,
# for anyone changing those tests: they poll a live stage process, and a race in the polling
# only shows under load. Exits non-zero if any run fails.
#
#   scripts/stress_test.sh [N] [pytest args...]     N runs (default 3), e.g. -k backbone
#
# STRESS_WORKERS busy processes (default 1) compete for the CPU; each is bounded by
# STRESS_SECONDS (default 3600) and all are killed when the script exits, however it exits.
set -euo pipefail

runs=${1:-3}
shift || true
workers=${STRESS_WORKERS:-1}
seconds=${STRESS_SECONDS:-3600}
python=${PYTHON:-python}
cd "$(dirname "$0")/.."

load_pids=()
stop_load() {
    for pid in "${load_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}
trap stop_load EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 "$workers"); do
    timeout "$seconds" "$python" -c 'while True: sum(i * i for i in range(10000))' &
    load_pids+=("$!")
done

failed=0
for run in $(seq 1 "$runs"); do
    start=$(date +%s)
    if "$python" -m pytest -q -m slow tests/test_atomic_outputs.py tests/test_resume.py "$@"; then
        echo "stress run $run/$runs: passed in $(($(date +%s) - start))s"
    else
        echo "stress run $run/$runs: FAILED after $(($(date +%s) - start))s"
        failed=$((failed + 1))
    fi
done
echo "stress: $failed of $runs runs failed, under $workers competing process(es)"
[ "$failed" -eq 0 ]

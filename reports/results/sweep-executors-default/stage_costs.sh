#!/bin/bash
# Usage: WORKDIR=<the bench --workdir> VENV_BIN=<venv>/bin bash stage_costs.sh > stage_costs.txt
# Wall time of each stage one λ point re-runs, on each side's own pipeline: `dvc repro -f -s <stage>`
# one at a time in the bench's kept clones, on a quiet machine. train@anchor_mid is not timed (it
# trains as train@anchor_last does); `inputs` is left out (both sides run it, in about a second).
set -u
export PATH=${VENV_BIN:?the absolute path of the bin folder of the virtualenv}:$PATH HF_HUB_OFFLINE=1
for side in old new; do
  cd ${WORKDIR:?the --workdir of bench/sweep_executors.py}/$side/project
  export PYTHONPATH=$PWD/src MLFLOW_TRACKING_URI=sqlite:///${WORKDIR:?the --workdir of bench/sweep_executors.py}/$side/mlflow.db
  if [ $side = old ]; then stages="plan train@anchor_last evaluate@anchor_last evaluate@anchor_mid downstream report"
  else stages="plan train@anchor_last evaluate@anchor_last evaluate@anchor_mid score_target@anchor_last-syn_help_chat score_target@anchor_last-syn_help_instruct score_target@anchor_mid-syn_help_chat score_target@anchor_mid-syn_help_instruct downstream_target@syn_help_chat downstream_target@syn_help_instruct downstream report"; fi
  for s in $stages; do
    t0=$(date +%s.%N); dvc repro -f -s -q "$s" >/dev/null 2>&1; rc=$?; t1=$(date +%s.%N)
    echo "$side $s rc=$rc $(python3 -c "print(round($t1-$t0,1))")"
  done
  git checkout -q -- . 2>/dev/null; dvc checkout -q >/dev/null 2>&1
done

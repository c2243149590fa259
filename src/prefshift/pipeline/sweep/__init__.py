"""`prefshift sweep`: a grid of params, each point a DVC experiment run by a task of its own.

One execution model for every executor. A grid point is a task (task.py): a clone of the baseline
commit, the point's `-S` overrides, `dvc exp run`, and its experiment pushed back into the user's
repository as a git ref, where `dvc exp show`, `dvc exp diff` and `dvc plots diff` see it. The
executors differ only in how they start and stop tasks: `local` (a process pool, `--jobs`),
`local-gpus` (the same pool with disjoint CUDA_VISIBLE_DEVICES, local.py) and `slurm` (a job
array, slurm.py). run.py checks, launches, waits, stops, resumes and files; the sweep's record
(record.py) keeps what was asked and where each point stands, so nothing depends on the command
that started it staying alive.
"""

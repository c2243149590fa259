"""`prefshift sweep`: a grid of params, each point a DVC experiment run by a task of its own.

A task (task.py) runs one point in its own clone of the baseline commit and pushes its experiment
back into the user's repository. The executors differ only in how they start and stop tasks: a pool
on this machine (local.py) or a SLURM job array (slurm.py). run.py drives a sweep; its record
(record.py) keeps what was asked and where each point stands, so nothing depends on the command that
started it staying alive. docs/sweeps.md and docs/cluster.md tell the whole story.
"""

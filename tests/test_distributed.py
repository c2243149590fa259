"""Multi-process training through the real `accelerate launch` CLI: 2 CPU processes over gloo.

Two processes with per-process batch B must train the same model as one process with
batch 2B: the global batches are the same pairs (prefshift.engine.train.rank_batches) and DDP
averages the two equal halves' gradients. The Bradley-Terry term is a mean over pairs,
so it matches up to float summation order; ANCHOR's MSE is a mean over response
tokens, and the mean of two halves' token means differs from the token mean of the
whole batch when the halves hold different token counts, so with lambda 1e-4 the
weights agree to ~1e-5 relative, not bit for bit (measured 9e-6; the bound is 1e-4).
Each rank caches reference states only for its own pairs, and only the main process
opens an MLflow run and writes the model.

Run as a script (`accelerate launch tests/test_distributed.py ROOT BATCH METHOD`), this
file is the worker: it calls `prefshift.pipeline.fit.fit`, the function behind
`prefshift train` and `prefshift teacher`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG = REPO / "configs" / "accelerate" / "cpu-2proc.yaml"
PAIRS = 64
BATCH = 8
METHOD = "anchor_last"


def _params(batch: int):
    from prefshift.config.params import parse_params

    student = {
        "batch_size": batch, "epochs": 1, "lr": 3e-3, "warmup_frac": 0.0, "log_every": 1,
        "drift_every": 2, "checkpoint_every": 2, "probe_size": 8,
    }  # fmt: skip
    # The paper's raw anchor at its small λ: the anchor MSE is a per-token mean on each process, and
    # DDP averages those means, which equals one process's mean only when the ranks' response-token
    # counts agree; a large normalised λ would magnify that difference past this test's tolerance.
    anchor = {"lambda": 1e-4, "normalize": "none"}
    raw = {"seed": 3, "student": student, "encode": {"max_length": 64}, "anchor": anchor}
    return parse_params(raw, "distributed test")


def _targets() -> list[float]:
    return [0.9 if i % 3 else 0.2 for i in range(PAIRS)]


def worker(root: Path, batch: int, method: str) -> None:
    sys.path.insert(0, str(HERE))
    import tiny_models
    from prefshift.core.paths import Layout
    from prefshift.pipeline.fit import fit

    params = _params(batch)
    fit(
        params,
        Layout(root, seed=0),
        name=method,
        method=method,
        base_dir=root / "base",
        pairs=tiny_models.pairs(PAIRS),
        targets=_targets(),
        cfg=params.student,
        out_dir=root / "model",
    )


def _prepare(root: Path, factory) -> None:
    import tiny_models
    from mlflow_support import seed_database
    from prefshift.core.paths import Layout
    from prefshift.data.schema import write_pairs
    from split_manifests import write_split_manifests

    root.mkdir(parents=True)
    seed_database(factory, root / "mlflow.db")
    tiny_models.base_dir(root, seed=1).rename(root / "base")
    layout = Layout(root, seed=0)
    for split in ("id_test", *_params(BATCH).data.targets):  # fit scores the saved model on them
        write_pairs(layout.split(split), tiny_models.pairs(8))
    write_split_manifests(layout, "v1", targets=_params(BATCH).data.targets)


def _launch(root: Path, batch: int, method: str, processes: int) -> subprocess.Popen:
    from mlflow_support import free_port

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PREFSHIFT_PIPELINE_RUN_ID="distributed-test", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if processes > 1:
        launcher = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
            "--main_process_port", str(free_port()),
        ]  # fmt: skip
    else:
        launcher = [sys.executable]
    cmd = [*launcher, str(Path(__file__).resolve()), str(root), str(batch), method]
    log = (root / "launch.log").open("w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(job: subprocess.Popen, root: Path) -> None:
    assert job.wait(timeout=240) == 0, (root / "launch.log").read_text()[-4000:]


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(model_dir.rglob("*.safetensors"))
    assert files, f"no weights under {model_dir}"
    merged: dict = {}
    for path in files:
        merged.update({f"{path.name}:{k}": v for k, v in load_file(path).items()})
    return merged


def _train_runs(root: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = []
    for experiment in client.search_experiments():
        found = client.search_runs([experiment.experiment_id])
        runs += [r for r in found if r.data.tags.get("stage") == "train"]
    return runs


def test_rank_batches_split_each_global_batch_into_disjoint_equal_step_shares():
    from prefshift.data.encode import length_grouped_batches
    from prefshift.engine.train import rank_batches

    lengths = [5, 9, 2, 7, 7, 3, 8, 1, 4, 6, 2]  # 11 pairs, global batch 2 x 2 = 4: sizes 4, 4, 3
    shares = [rank_batches(lengths, 2, seed=7, rank=r, world=2) for r in (0, 1)]
    whole = length_grouped_batches(lengths, 4, seed=7)
    assert [len(s) for s in shares] == [3, 3]
    for step, batch in enumerate(whole):
        assert shares[0][step] + shares[1][step] == batch
    assert sorted(len(b) for b in shares[0]) == [2, 2, 2]
    assert sorted(len(b) for b in shares[1]) == [1, 2, 2]
    # a global batch with fewer pairs than processes is dropped on every rank alike
    three = [rank_batches([3, 1, 2, 5, 4], 2, seed=0, rank=r, world=3) for r in range(3)]
    assert [len(s) for s in three] == [1, 1, 1]
    assert sorted(i for s in three for b in s for i in b) == sorted(
        length_grouped_batches([3, 1, 2, 5, 4], 6, 0)[0]
    )
    assert rank_batches(lengths, 4, seed=7, rank=0, world=1) == whole


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs" / "accelerate").glob("*.yaml")), ids=lambda p: p.stem
)
def test_accelerate_configs_load(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    kind = path.stem.split("-")[0]
    expected = {"cpu": "MULTI_GPU", "ddp": "MULTI_GPU", "fsdp": "FSDP", "zero3": "DEEPSPEED"}[kind]
    assert config.distributed_type.value == expected
    if kind == "zero3":
        assert config.deepspeed_config["zero_stage"] == 3
    if kind == "fsdp":
        assert config.fsdp_config["fsdp_version"] == 2


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path, tmp_path_factory):
    single, double = tmp_path / "single", tmp_path / "double"
    _prepare(single, tmp_path_factory)
    _prepare(double, tmp_path_factory)
    jobs = [(_launch(single, 2 * BATCH, METHOD, 1), single), (_launch(double, BATCH, METHOD, 2), double)]
    for job, root in jobs:
        _wait(job, root)

    one, two = _weights(single / "model"), _weights(double / "model")
    base = _weights(single / "base")
    assert one.keys() == two.keys()
    for key in one:
        scale = one[key].abs().max().clamp_min(1e-3)
        assert (one[key] - two[key]).abs().max() / scale < 1e-4, key
    moved = max((one[k] - base[k]).abs().max().item() for k in one if k in base)
    assert moved > 1e-3, "training did not change the weights, so the comparison proves nothing"

    logs = [
        json.loads((r / "reports" / "train" / METHOD / "seed-0.json").read_text()) for r in (single, double)
    ]
    steps = PAIRS // (2 * BATCH)
    assert [log["total_steps"] for log in logs] == [steps, steps]
    assert [len(log["steps"]) for log in logs] == [steps, steps]
    for a, b in zip(logs[0]["steps"], logs[1]["steps"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["acc"] == pytest.approx(b["acc"], abs=1e-6)
    assert [len(_train_runs(r)) for r in (single, double)] == [1, 1]
    assert [log["reference"]["entries"] for log in logs] == [2 * PAIRS, PAIRS]
    assert not (double / "models" / "checkpoints" / METHOD).exists()


if __name__ == "__main__":
    worker(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

"""Which benchmarks run, at which sizes, and where their results go."""

from __future__ import annotations

import datetime as dt
import functools
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefshift.bench.common import (
    BenchError,
    machine,
    number_rounds_from,
    set_threads,
    tokenizer_dir,
    versions,
)

NO_GPU = (
    "No GPU was available when this was written; the bf16 ~0.5B-parameter GPU figures "
    "(naive vs ANCHOR cached/uncached tokens/s and peak memory) are not measured."
)


@dataclass(frozen=True)
class Plan:
    """Sizes chosen so the default run takes a few minutes on a 2-core machine."""

    training: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"tiny_2x64": (256, 2), "small_4x256": (96, 1)}
    )
    """model -> (pairs, epochs). Each timed run lasts seconds: sub-second runs measured noise."""
    anchor: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"tiny_2x64": (256, 1), "small_4x256": (96, 1)}
    )
    """model -> (pairs, epochs) of the ANCHOR overhead runs; 1 epoch, the pipeline's default."""
    realistic: tuple[str, int] = ("small_4x256", 64)
    """(model, pairs) of the realistic-length comparison with TRL's defaults."""
    evaluation: dict[str, int] = field(default_factory=lambda: {"tiny_2x64": 512, "small_4x256": 128})
    """model -> test pairs."""
    reps: int = 3


QUICK = Plan(
    training={"tiny_2x64": (16, 1)},
    anchor={"tiny_2x64": (16, 1)},
    realistic=("small_4x256", 16),
    evaluation={"tiny_2x64": 16},
    reps=1,
)


@dataclass(frozen=True)
class ModelPlan:
    """The training and ANCHOR rows on a real local model directory (`--model-dir`), on the
    pairs of `--pairs` (synthetic ones without it), cut to the study's `max_length`.

    A pretrained model makes every run tens of seconds on one thread, so fewer variants run:
    ours against TRL and the bare loop, ANCHOR on the shared reference against naive."""

    pairs: int = 64
    epochs: int = 1
    max_length: int = 192
    training: tuple[str, ...] = ("trl", "trl_group_by_length", "bare_torch_loop")
    """Training variants besides ours (`training.bench_training`'s `only`): TRL aligned to fp32 with
    its random batches (the target's) and length-grouped, and the bare PyTorch loop."""
    anchor: tuple[str, ...] = ("anchor_shared",)
    """ANCHOR variants besides naive (`anchor.bench_anchor`'s `only`)."""
    reps: int = 3


QUICK_MODEL = ModelPlan(pairs=16, reps=1)


def _previous(json_path: Path) -> dict | None:
    """The result an earlier run left in `json_path`, its pipeline section stamped with the date and
    CPU it was measured on; None if there is none to read."""
    if not json_path.exists():
        return None
    try:
        old = json.loads(json_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    section = old.get("pipeline")
    if section and not section.get("date"):  # measured in that run, on its machine
        section |= {"date": old.get("date"), "cpu": (old.get("machine") or {}).get("cpu")}
    return old


def _restoring_threads(fn: Callable[..., dict]) -> Callable[..., dict]:
    """Restore the caller's torch thread count afterwards: results elsewhere in the same
    process (tests, notebooks) must not change because a benchmark ran first."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> dict:
        import torch

        previous = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(previous)

    return wrapper


def _one_invocation(plan: Plan, reps: int, trl_as_shipped: bool, log: Callable[[str], None]) -> dict:
    """Training, ANCHOR and evaluation benchmarks in this process (the pipeline is separate)."""
    from prefshift.bench.anchor import bench_anchor
    from prefshift.bench.evaluation import bench_evaluation
    from prefshift.bench.realistic import bench_realistic
    from prefshift.bench.training import bench_training

    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="prefshift-bench-") as tmp:
        tok = tokenizer_dir(Path(tmp), 600)
        result["training"] = bench_training(tok, plan.training, reps, log, trl_as_shipped)
        result["realistic"] = bench_realistic(tok, *plan.realistic, reps, log)
        result["anchor"] = {m: bench_anchor(tok, m, n, e, reps, log) for m, (n, e) in plan.anchor.items()}
        result["evaluation"] = bench_evaluation(tok, plan.evaluation, reps, log)
    return result


def _model_invocation(
    model_dir: Path,
    pairs: Path | None,
    max_length: int,
    plan: ModelPlan,
    reps: int,
    trl_as_shipped: bool,
    log: Callable[[str], None],
) -> dict:
    """The training and ANCHOR benchmarks of `ModelPlan` on `model_dir` (its own tokenizer)."""
    from prefshift.bench.anchor import bench_anchor
    from prefshift.bench.common import Workload, model_label
    from prefshift.bench.training import bench_training

    work = Workload(pairs=plan.pairs, max_length=max_length, source=pairs)
    shipped = ("trl_group_by_length_as_shipped", "ours_bf16") if trl_as_shipped else ()
    model, size = str(model_dir), (plan.pairs, plan.epochs)
    training = bench_training(
        model_dir, {model: size}, reps, log, trl_as_shipped, work, (*plan.training, *shipped)
    )
    anchor = bench_anchor(model_dir, model, *size, reps, log, work, plan.anchor)
    return {"training": training, "anchor": {model_label(model_dir): anchor}}


def _model_flags(model_dir: Path | None, pairs: Path | None, max_length: int | None) -> list[str]:
    return [
        *(["--model-dir", str(model_dir)] if model_dir else []),
        *(["--pairs", str(pairs)] if pairs else []),
        *(["--max-length", str(max_length)] if max_length else []),
    ]


def _command(
    quick: bool,
    pipeline: bool,
    invocations: int,
    trl_as_shipped: bool,
    readme: Path | None,
    pipeline_params: Path | None = None,
    pipeline_only: bool = False,
    out_dir: Path = Path("reports"),
    model: list[str] | None = None,
    stage_threads: int | None = None,
) -> str:
    flags = [
        f"--out {out_dir}" if out_dir != Path("reports") else "",
        *(model or []),
        "--pipeline-only" if pipeline_only else "",
        f"--stage-threads {stage_threads}" if stage_threads is not None else "",
        "--quick" if quick else "",
        f"--invocations {invocations}" if invocations > 1 else "",
        "--trl-as-shipped" if trl_as_shipped else "",
        "--pipeline" if pipeline and pipeline_params is None else "",
        f"--pipeline-params {pipeline_params}" if pipeline_params else "",
        f"--readme {readme}" if readme else "",
    ]
    return " ".join(["prefshift bench", *(f for f in flags if f)])


@_restoring_threads
def run_bench(
    out_dir: Path = Path("reports"),
    *,
    quick: bool = False,
    reps: int | None = None,
    pipeline: bool = False,
    keep: bool = False,
    threads: int = 1,
    stage_threads: int | None = None,
    repo: Path = Path("."),
    note: str | None = None,
    invocations: int = 1,
    trl_as_shipped: bool = False,
    readme: Path | None = None,
    pipeline_params: Path | None = None,
    pipeline_only: bool = False,
    first_round: int = 0,
    model_dir: Path | None = None,
    pairs: Path | None = None,
    max_length: int | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the benchmarks, write `out_dir`/bench.json and bench.md, return the result.

    With `invocations` > 1 the training, ANCHOR and evaluation benchmarks run that many times,
    each as its own process, and are merged (`bench.invocations`); the pipeline runs once.
    With `readme`, that file's numbers block is rewritten from the result (`bench.readme`).
    `pipeline_only` times the pipeline alone, e.g. each method's cost in another params file.
    `threads` is the in-process benchmarks' torch threads; the pipeline's stages take
    `stage_threads`, by default torch's own, as a user's `dvc repro` does (`bench.pipeline`).
    `model_dir` runs the training and ANCHOR rows of `ModelPlan` on that local model instead,
    on the HH-style pairs file `pairs` (synthetic pairs without it) cut to `max_length`.
    """
    from prefshift.bench.invocations import aggregate, run_invocations
    from prefshift.bench.pipeline import bench_pipeline
    from prefshift.bench.readme import update_readme
    from prefshift.bench.report import write_reports

    if pipeline_only and invocations > 1:
        raise BenchError("--pipeline-only times one pipeline: it runs once")
    if stage_threads is not None and stage_threads < 1:
        raise BenchError(f"--stage-threads {stage_threads}: give 1 or more, or omit it for torch's default")
    if stage_threads is not None and not (pipeline or pipeline_only or pipeline_params):
        raise BenchError("--stage-threads sets the pipeline's stages: add --pipeline or --pipeline-only")
    if model_dir is None and (pairs is not None or max_length is not None):
        raise BenchError("--pairs and --max-length set the workload of --model-dir; name the model")
    if readme is not None and pipeline_params is not None:
        raise BenchError("--readme writes the embedded default's pipeline rows: drop --pipeline-params")
    if model_dir is not None and (pipeline or pipeline_only or pipeline_params or readme):
        raise BenchError(
            "--model-dir times training and ANCHOR on that model; the pipeline and the README block"
            " belong to the default bench"
        )
    plan = QUICK if quick else Plan()
    model_plan = QUICK_MODEL if quick else ModelPlan()
    max_length = (max_length or model_plan.max_length) if model_dir else None
    model_flags = _model_flags(model_dir, pairs, max_length)
    reps = reps or (model_plan.reps if model_dir else plan.reps)
    set_threads(threads)
    number_rounds_from(first_round)
    if invocations > 1:
        argv = ["--reps", str(reps), "--threads", str(threads)]
        argv += (["--quick"] if quick else []) + (["--trl-as-shipped"] if trl_as_shipped else [])
        argv += ["--note", note] if note else []
        argv += model_flags
        result = aggregate(run_invocations(invocations, argv, reps, log))
    else:
        result = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "versions": versions(),
            "settings": {"quick": quick, "reps": reps, "threads": threads, "invocations": 1},
            "note": note,
            "gpu": NO_GPU,
        }
        if model_dir is not None:
            result["settings"] |= {"model_dir": str(model_dir), "pairs": str(pairs) if pairs else None}
            result["settings"]["max_length"] = max_length
            result |= _model_invocation(model_dir, pairs, max_length, model_plan, reps, trl_as_shipped, log)
            result["machine"]["load_avg_at_end"] = machine()["load_avg_1_5_15"]  # minutes of other load
        elif not pipeline_only:
            result |= _one_invocation(plan, reps, trl_as_shipped, log)
    result["settings"]["command"] = _command(
        quick,
        pipeline,
        invocations,
        trl_as_shipped,
        readme,
        pipeline_params,
        pipeline_only,
        out_dir,
        model_flags,
        stage_threads,
    )
    json_path = out_dir / "bench.json"
    previous = _previous(json_path)
    # `--pipeline-only` into a directory holding a full result replaces its pipeline section alone:
    # bench.json and the README block would otherwise lose the training rows.
    full = previous if pipeline_only and previous and previous.get("training") else None
    if pipeline_only and readme is not None and full is None:
        raise BenchError(
            f"--pipeline-only --readme rewrites the pipeline rows of the full bench result in {json_path},"
            " and there is none: run `prefshift bench --pipeline --readme …` first"
        )
    if full is not None and pipeline_params is not None:
        raise BenchError(
            f"{json_path} holds the full bench result, whose pipeline rows are the embedded default's:"
            " give --pipeline-params a directory of its own, e.g. --out reports/results/<name>"
        )
    measure = pipeline or pipeline_only or pipeline_params is not None
    timed = bench_pipeline(repo, log, keep, pipeline_params, stage_threads) if measure else None
    result["pipeline"] = timed or (previous or {}).get("pipeline")
    if full is not None:
        stamp = {"date": result["date"], "cpu": result["machine"]["cpu"]}
        stamp["command"] = result["settings"]["command"]
        result = {**full, "pipeline": {**result["pipeline"], **stamp}}
    paths = write_reports(result, out_dir)
    log(f"wrote {paths[0]} and {paths[1]}")
    if readme is not None:
        update_readme(readme, result)
        log(f"rewrote the benchmark numbers in {readme}")
    return result

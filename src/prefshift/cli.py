"""The command line: one command per DVC stage, plus the user-facing helpers.

Commands only parse options and call the stage module; stage modules are imported
lazily so `prefshift --help` stays fast and a stage pulls in only what it needs.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, NoReturn

import click
import typer
from typer.core import TyperGroup

from prefshift.config.params import ConfigError, Params, check_listed, for_seed, load_params
from prefshift.core.atomic import STDOUT, check_output
from prefshift.core.console import error_text, messages
from prefshift.core.errors import boundary_line, naming
from prefshift.core.paths import Layout
from prefshift.core.progress import lines_to
from prefshift.core.signals import (
    Terminated,
    discarded_stop,
    exit_code,
    heed_discarded_stops,
    signals_ignored,
)
from prefshift.core.standard_streams import reopen_closed

err_console = messages()


def _one_line(err: Exception) -> NoReturn:
    """The one error boundary: a problem the user can fix is one line on stderr and exit 2.

    Those are PrefshiftErrors, OSErrors that name their file (missing, a directory, no
    permission, read-only, disk full), and the library errors a bad input or store produces
    (`core.errors.boundary_line`: JSON, Unicode, tokenizer, sqlite and MLflow store errors),
    named by the file, row or store the code was reading. Anything else keeps its traceback.
    """
    line = boundary_line(err)
    if line is None:
        raise err
    err_console.print(error_text(line))
    raise typer.Exit(2) from None


class _Boundary(TyperGroup):
    """Every command, and every line of a command's body, runs inside `_one_line`; click's own
    exits and usage errors pass through as they are."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Terminated as stop:  # SIGTERM/SIGHUP that no command handled: its cleanups have run
            err_console.print(error_text(str(stop)))
            raise SystemExit(exit_code(stop.signum)) from None
        except Exception as err:
            _one_line(err)


app = typer.Typer(
    cls=_Boundary,
    add_completion=False,
    no_args_is_help=True,
    help="prefshift: weak-to-strong reward models under preference shift.",
)

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read.")]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-S", help="Override a param, e.g. -S anchor.lambda=0.01 (repeatable)."),
]
SeedOption = Annotated[
    int | None,
    typer.Option("--seed", help="Which replicate seed of params `seeds` (default: the first)."),
]
AllSeedsOption = Annotated[
    bool,
    typer.Option(
        "--all-seeds",
        help="Every seed of params `seeds`, one after another in one process (as DVC runs a method's stage).",
    ),
]
SplitOption = Annotated[
    str,
    typer.Option(
        "--split",
        help="Which best-of-n split: id_test (the source), or one of data.targets; each is its own stage.",
    ),
]
RootOption = Annotated[
    Path,
    typer.Option(
        "--root", exists=True, file_okay=False, help="Project root holding data/, models/, reports/."
    ),
]


def _stage(module: str, function: str = "run") -> Any:
    return getattr(importlib.import_module(f"prefshift.{module}"), function)


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a command's work inside the one error boundary (`_one_line`)."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        _one_line(err)


def _params(path: Path, overrides: list[str] | None) -> Params:
    return _call(load_params, path, overrides)


def _seeded(path: Path, overrides: list[str] | None, seed: int | None, root: Path) -> tuple[Params, Layout]:
    """Params and layout of one replicate seed, for the stages DVC runs once per seed."""
    loaded = _call(for_seed, _params(path, overrides), seed)
    return loaded, Layout(root).for_seed(loaded.seed)


def _seeds_to_run(params: Params, seed: int | None, all_seeds: bool) -> list[int | None]:
    if all_seeds and seed is not None:
        raise ConfigError(f"--seed {seed} and --all-seeds name different runs; pass one of them")
    return list(params.seeds) if all_seeds else [seed]


def _each_seed(
    path: Path, overrides: list[str] | None, seed: int | None, all_seeds: bool, root: Path
) -> list[tuple[Params, Layout]]:
    """(params, layout) of each seed a method's command runs: one (`--seed`, default the first) or
    every listed one (`--all-seeds`). DVC runs a method's stage once for all seeds, because each
    stage process spends seconds importing torch, transformers and MLflow before any work, which
    a method's seeds now pay once (most of a three-seed repro's drop from 997 s to 689 s,
    docs/performance.md)."""
    loaded = _params(path, overrides)
    seeded = [_call(for_seed, loaded, k) for k in _call(_seeds_to_run, loaded, seed, all_seeds)]
    return [(one, Layout(root).for_seed(one.seed)) for one in seeded]


def _method_stage(
    stage: str,
    method: str,
    path: Path,
    overrides: list[str] | None,
    seed: int | None,
    all_seeds: bool,
    root: Path,
) -> None:
    """Run a method's stage (`stage`.run) for each seed asked, after loading the method (its
    contract is checked there) and checking params list it."""
    _call(_stage("methods.registry", "get"), method)
    for loaded, layout in _each_seed(path, overrides, seed, all_seeds, root):
        _call(check_listed, loaded, method)
        _call(_stage(stage), loaded, layout, method)


@app.command()
def inputs(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Version the local data and model files params name: data/inputs/*.json (DVC runs it always)."""
    _call(_stage("pipeline.stages.inputs"), _params(params, set_), Layout(root))


DatasetOption = Annotated[
    str | None,
    typer.Option("--dataset", help="data.source or one of data.targets (default: every one of them)."),
]


@app.command()
def prepare(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    dataset: DatasetOption = None,
    root: RootOption = Path("."),
):
    """Normalise the source and target datasets to the pair schema (data/pairs/<dataset>/)."""
    _call(_stage("pipeline.stages.prepare"), _params(params, set_), Layout(root), dataset)


@app.command()
def split(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    dataset: DatasetOption = None,
    root: RootOption = Path("."),
):
    """Build teacher_train / student_train / id_test and each target's ood split (data/splits/)."""
    _call(_stage("pipeline.stages.split"), _params(params, set_), Layout(root), dataset)


@app.command()
def datasets():
    """List the dataset adapters, their category, default source and what they need."""
    _call(_stage("data.adapters", "print_catalogue"))


@app.command()
def backbone(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """Resolve (or pretrain, for the embedded default) the weak and strong backbones (models/base/)."""
    _call(_stage("pipeline.stages.backbone"), _params(params, set_), Layout(root))


@app.command()
def teacher(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    root: RootOption = Path("."),
):
    """Train one seed's weak teacher on the gold labels of teacher_train (models/teacher/seed-<k>/)."""
    _call(_stage("pipeline.stages.teacher"), *_seeded(params, set_, seed, root))


@app.command()
def label(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    root: RootOption = Path("."),
):
    """One seed's soft labels q_i for student_train (data/weak_labels/seed-<k>/)."""
    _call(_stage("pipeline.stages.label"), *_seeded(params, set_, seed, root))


@app.command("seam-principles")
def seam_principles(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """The strong LM's SEAM principles for every student_train prompt, shared by every seed (data/seam/)."""
    _call(_stage("pipeline.stages.seam_principles"), _params(params, set_), Layout(root))


@app.command("seam-label")
def seam_label(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    root: RootOption = Path("."),
):
    """SEAM soft labels: strong-LM principles judged by the teacher (data/targets/seam/seed-<k>/)."""
    _call(_stage("pipeline.stages.seam_label"), *_seeded(params, set_, seed, root))


@app.command()
def plan(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Write what each listed method reads (data/plan/), so DVC re-runs only the methods a change affects."""
    _call(_stage("pipeline.stages.plan"), _params(params, set_), Layout(root))


@app.command()
def reference(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """Store the strong base's states at student_train's response tokens once, for every anchor run."""
    _call(_stage("pipeline.stages.reference"), _params(params, set_), Layout(root))


@app.command()
def probe(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Linear probes: which cues the frozen strong base exposes where the reward is read."""
    _call(_stage("pipeline.stages.probe"), _params(params, set_), Layout(root))


@app.command()
def targets(
    method: Annotated[str, typer.Option("--method", "-m", help="naive, confidence, seam, anchor_last, ...")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    all_seeds: AllSeedsOption = False,
    root: RootOption = Path("."),
):
    """Write what student M trains on (data/targets/<M>/seed-<k>/): teacher q, gold, or SEAM's labels."""
    _method_stage("pipeline.stages.targets", method, params, set_, seed, all_seeds, root)


@app.command()
def train(
    method: Annotated[str, typer.Option("--method", "-m", help="naive, confidence, seam, anchor_last, ...")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    all_seeds: AllSeedsOption = False,
    root: RootOption = Path("."),
):
    """Train strong student M for one seed or every seed (models/students/<M>/seed-<k>/)."""
    _method_stage("pipeline.stages.train", method, params, set_, seed, all_seeds, root)


@app.command()
def evaluate(
    method: Annotated[str, typer.Option("--method", "-m", help="Which trained student to evaluate.")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    all_seeds: AllSeedsOption = False,
    root: RootOption = Path("."),
):
    """Metrics of student M from its held-out scores, per seed: reports/metrics/<M>/seed-<k>.json."""
    _method_stage("pipeline.stages.evaluate", method, params, set_, seed, all_seeds, root)


@app.command("score-target")
def score_target(
    model: Annotated[str, typer.Option("--model", help="teacher, or a method: naive, anchor_last, ...")],
    target: Annotated[str, typer.Option("--target", help="One of data.targets.")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    all_seeds: AllSeedsOption = False,
    root: RootOption = Path("."),
):
    """Score a trained model on one target, per seed (data/target_scores/<model>/<target>/seed-<k>/)."""
    for loaded, layout in _each_seed(params, set_, seed, all_seeds, root):
        if model != "teacher":
            _call(check_listed, loaded, model)
        _call(_stage("pipeline.stages.score_target"), loaded, layout, model, target)


@app.command("evaluate-teacher")
def evaluate_teacher(
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    seed: SeedOption = None,
    all_seeds: AllSeedsOption = False,
    root: RootOption = Path("."),
):
    """The teacher's accuracy on id_test and every target, per seed: reports/metrics/teacher/seed-<k>.json."""
    for loaded, layout in _each_seed(params, set_, seed, all_seeds, root):
        _call(_stage("pipeline.stages.evaluate_teacher"), loaded, layout)


def _split_layout(loaded: Params, layout: Layout, split: str) -> Layout:
    """`layout` bound to one best-of-n split, or a one-line error naming the splits params list."""
    from prefshift.pipeline.stages.policy_samples import split_layout

    return _call(split_layout, loaded, layout, split)


@app.command("policy-samples")
def policy_samples(
    split: SplitOption = "id_test",
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Sample downstream.n_max completions per prompt of one split from the policy LM
    (data/policy_samples/<split>/)."""
    loaded = _params(params, set_)
    _call(_stage("pipeline.stages.policy_samples"), loaded, _split_layout(loaded, Layout(root), split))


@app.command()
def judge(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Train (or name) the best-of-n gold judge, and score its accuracy: models/judge, reports/judge.json."""
    _call(_stage("pipeline.stages.judge"), _params(params, set_), Layout(root))


@app.command("judge-target")
def judge_target(
    target: Annotated[str, typer.Option("--target", help="One of data.targets.")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Score the best-of-n judge's accuracy on one target: reports/judge_targets/<target>.json."""
    _call(_stage("pipeline.stages.judge_target"), _params(params, set_), Layout(root), target)


@app.command("gold-judge")
def gold_judge(
    split: SplitOption = "id_test",
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Score every policy sample of one split with the gold judge (and the synthetic gold rule):
    data/downstream/<split>/gold.parquet."""
    loaded = _params(params, set_)
    _call(_stage("pipeline.stages.gold_judge"), loaded, _split_layout(loaded, Layout(root), split))


@app.command()
def downstream(
    method: Annotated[
        str | None,
        typer.Option(
            "--method",
            "-m",
            help="Only this proxy (of --seed): teacher or a method (default: all, all seeds).",
        ),
    ] = None,
    seed: SeedOption = None,
    split: SplitOption = "id_test",
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Best-of-n on one split with the teacher's and every listed method's RM of every seed as the
    proxy, judged by gold (reports/downstream/<split>/<M>/seed-<k>.json)."""
    if method is None:
        if seed is not None:
            _one_line(ConfigError("--seed picks one model's run: pass it with --method"))
        loaded = _params(params, set_)
        layout = _split_layout(loaded, Layout(root), split)
        _call(_stage("pipeline.stages.downstream", "run_all"), loaded, layout)
        return
    loaded, layout = _seeded(params, set_, seed, root)
    if method != "teacher":
        _call(check_listed, loaded, method)
    _call(_stage("pipeline.stages.downstream"), loaded, _split_layout(loaded, layout, split), method)


@app.command()
def report(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Tables and figures across methods (reports/summary.md, reports/figures/, reports/metrics.json)."""
    _call(_stage("pipeline.stages.report"), _params(params, set_), Layout(root))


@app.command()
def promote(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Register students that pass the gate; `champion` = best by mean NTS (reports/promotion.json)."""
    _call(_stage("pipeline.stages.promote"), _params(params, set_), Layout(root))


@app.command()
def pull(
    uri: Annotated[str, typer.Argument(help="models:/<name>@<alias> or models:/<name>/<version>")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the HF model to.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into a non-empty directory that holds no verified earlier pull, overwriting "
            "same-named files (only an earlier pull's own unchanged files are ever removed).",
        ),
    ] = False,
    root: RootOption = Path("."),
):
    """Download a registered reward model as a plain HF directory (content hash verified)."""
    result = _call(_stage("tracking.registry", "pull_to"), uri, out, Layout(root), force)
    err_console.print(f"pulled {result['name']} version {result['version']} to {result['out']}")


@app.command()
def score(
    model: Annotated[str, typer.Option("--model", help="models:/ URI or a local HF directory.")],
    input_: Annotated[Path, typer.Option("--input", "-i", help="JSONL of pairs or prompt+response rows.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Rewards JSONL; `-` or none: standard output.")
    ] = None,
    normalize: Annotated[
        bool, typer.Option("--normalize", help="(r - mean) / std with the model config's id_test stats.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an --out file of another user's.")] = False,
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Rewards per row, and chosen-vs-rejected accuracy when the input has pairs."""
    if out is not None and str(out) == STDOUT:
        out = None
    if out is not None:  # before any work: never its own input, and writable now
        local_model = [] if model.startswith("models:/") else [Path(model)]
        _call(check_output, out, inputs=[input_, params, *local_model], force=force)
    loaded = _params(params, set_)
    with lines_to(sys.stderr):  # stdout carries the rewards
        result = _call(
            _stage("tracking.score", "score_command"),
            model,
            input_,
            out,
            loaded,
            Layout(root),
            normalize,
            force,
        )
    cut = result["truncation"]
    summary = (
        f"scored {result['scored']} {result['kind']} rows; {result['skipped']} skipped (no response token "
        f"left after truncation); {cut['truncated']} cut to encode.max_length ({cut['share']:.1%})"
    )
    if result["accuracy"] is not None:
        summary += f"; chosen-vs-rejected accuracy {result['accuracy']:.2f}%"
    err_console.print(summary)


@app.command()
def ui(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 5000,
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    backend: Annotated[str | None, typer.Option("--backend", help="Tracking DB URI.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Verify the runs render in Chromium.")] = False,
    screenshot: Annotated[Path, typer.Option(help="Where --check saves its screenshot.")] = Path(
        "reports/mlflow_ui.png"
    ),
    params: ParamsOption = Path("params.yaml"),
    root: RootOption = Path("."),
):
    """Start the MLflow UI on the project's tracking database (or, with --check, verify it in a browser)."""
    if check:
        _call(check_output, screenshot)
        experiment = _params(params, None).tracking.experiment
        result = _call(_stage("tracking.ui", "check"), Layout(root), experiment, screenshot, port)
        shown = f"{', '.join(result['runs'])} with {', '.join(result['metrics'])}"
        err_console.print(f"UI shows {shown}; screenshot {result['screenshot']}")
        return
    raise typer.Exit(_call(_stage("tracking.ui", "serve"), Layout(root), host, port, backend))


@app.command()
def sync(
    to: Annotated[str | None, typer.Option("--to", help="Tracking URI (default: the project's).")] = None,
    root: RootOption = Path("."),
):
    """Upload runs recorded offline (.prefshift/offline.db) while the tracking server was down."""
    result = _call(_stage("tracking.sync", "sync"), Layout(root), to)
    err_console.print(f"synced {len(result['copied'])} run(s) from {result['source']} to {result['target']}")


@app.command()
def preset(
    name: Annotated[str | None, typer.Argument(help="Preset to apply (see --list).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the presets and exit.")] = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="params file to write.")] = Path("params.yaml"),
    set_: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the --out file if it exists.")] = False,
):
    """Write a full params.yaml from a preset for real runs; -S points it at local models or data.

    An existing file is refused unless --force: params.yaml is the user's, and what it held is lost.
    """
    if list_:
        _call(_stage("presets", "print_catalogue"))
        return
    if name is None:
        err_console.print(error_text("name a preset, or pass --list to see them"))
        raise typer.Exit(2)
    written = _call(_stage("presets", "write"), name, out, set_, force)
    typer.echo(f"wrote {written} from preset {name}")


@app.command()
def bench(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for bench.json and bench.md.")] = Path(
        "reports"
    ),
    quick: Annotated[bool, typer.Option("--quick", help="Tiny sizes, one repetition (smoke test).")] = False,
    reps: Annotated[int | None, typer.Option("--reps", min=1, help="Timed repetitions (default 3).")] = None,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="Also time full and no-op dvc repro.")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the --pipeline clone (path printed).")] = False,
    threads: Annotated[int, typer.Option("--threads", min=1, help="torch intra-op threads per run.")] = 1,
    stage_threads: Annotated[
        int | None,
        typer.Option(
            "--stage-threads", min=1, help="torch threads per pipeline stage (default: torch's, a core each)."
        ),
    ] = None,
    note: Annotated[str | None, typer.Option("--note", help="A line for the report.")] = None,
    invocations: Annotated[
        int, typer.Option("--invocations", min=1, help="Run the bench N times, one process each; merge.")
    ] = 1,
    trl_as_shipped: Annotated[
        bool, typer.Option("--trl-as-shipped", help="Also time TRL with its bf16 + checkpointing defaults.")
    ] = False,
    readme: Annotated[
        Path | None, typer.Option("--readme", help="Rewrite this README's benchmark numbers block.")
    ] = None,
    pipeline_params: Annotated[
        Path | None,
        typer.Option(
            "--pipeline-params",
            exists=True,
            dir_okay=False,
            help="Time the pipeline of this params file (e.g. from `prefshift preset robust-ft`), with "
            "each method's train stage against naive's.",
        ),
    ] = None,
    pipeline_only: Annotated[
        bool,
        typer.Option(
            "--pipeline-only", help="Time the pipeline alone (no training, ANCHOR or scoring benchmarks)."
        ),
    ] = False,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir",
            exists=True,
            file_okay=False,
            help="Time training (ours vs TRL) and ANCHOR (shared reference vs naive) on this local HF "
            "model directory instead (its own tokenizer, a fresh reward head).",
        ),
    ] = None,
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs",
            exists=True,
            dir_okay=False,
            help="With --model-dir: HH-style pairs (.jsonl or .jsonl.gz, chosen/rejected transcripts); "
            "synthetic pairs without it.",
        ),
    ] = None,
    max_length: Annotated[
        int | None, typer.Option("--max-length", min=8, help="With --model-dir: the token cut (192).")
    ] = None,
):
    """Training vs TRL, ANCHOR overhead, scoring throughput (and the pipeline): reports/bench.{json,md}."""
    for output in [out / "bench.json", out / "bench.md", *([readme] if readme else [])]:
        _call(check_output, output)
    if pipeline_params is not None:  # a params file (regular, bounded, valid) before any benchmark runs
        _params(pipeline_params, None)
    _call(
        _stage("bench.run", "run_bench"),
        out,
        quick=quick,
        reps=reps,
        pipeline=pipeline,
        keep=keep,
        threads=threads,
        stage_threads=stage_threads,
        note=note,
        invocations=invocations,
        trl_as_shipped=trl_as_shipped,
        readme=readme,
        pipeline_params=pipeline_params,
        pipeline_only=pipeline_only,
        model_dir=model_dir,
        pairs=pairs,
        max_length=max_length,
    )


sweep_app = typer.Typer(
    help="Run a params grid as DVC experiments, a task per point; status, collect and resume of a sweep."
)
app.add_typer(sweep_app, name="sweep")
ScratchOption = Annotated[
    Path | None,
    typer.Option(
        "--scratch",
        help="Folder (on the shared filesystem, for slurm) for the sweep's record, logs and clones "
        "(default $PREFSHIFT_SWEEP_SCRATCH, else .prefshift/sweeps).",
    ),
]
WaitOption = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Wait and collect, or return the sweep id at once (slurm).")
]
JobsOption = Annotated[
    int | None,
    typer.Option("--jobs", "-j", help="local: points at once; 1 suits CPUs (torch uses every core)."),
]
GpusOption = Annotated[
    str | None, typer.Option("--gpus", help="local-gpus: the devices to share out, e.g. 0,1,2,3.")
]
GpusPerTaskOption = Annotated[
    int | None, typer.Option("--gpus-per-task", help="GPUs each point gets (slurm, local-gpus).")
]
PartitionOption = Annotated[str | None, typer.Option("--partition", help="slurm: partition to submit to.")]
TimeOption = Annotated[str | None, typer.Option("--time", help="slurm: time limit per task, e.g. 12:00:00.")]
AccountOption = Annotated[str | None, typer.Option("--account", help="slurm: account to charge.")]
CpusPerTaskOption = Annotated[int | None, typer.Option("--cpus-per-task", help="slurm: CPUs per task.")]
TemplateOption = Annotated[
    Path | None,
    typer.Option("--sbatch-template", help="slurm: your file of extra #SBATCH and set-up lines."),
]


def _devices(gpus: str | None) -> tuple[str, ...] | None:
    from prefshift.pipeline.sweep.local import parse_devices

    return tuple(_call(parse_devices, gpus)) if gpus is not None else None


def _template(path: Path | None) -> str | None:
    return str(path.resolve()) if path else None  # resume may run elsewhere


@sweep_app.callback(invoke_without_command=True)
def sweep(
    ctx: typer.Context,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-S", help="Grid axis, e.g. -S anchor.lambda=1e-4,1e-2,1 (repeatable)."),
    ] = None,
    grid_file: Annotated[
        Path | None,
        typer.Option("--grid-file", help="A grid written down: blocks of axes (configs/paper-grid.yaml)."),
    ] = None,
    max_points: Annotated[
        int, typer.Option("--max-points", help="Refuse a grid of more points than this.")
    ] = 1000,
    methods: Annotated[
        str | None,
        typer.Option(
            "--methods",
            help="Comma-separated methods to collect (default anchor_last,anchor_mid or the grid file's).",
        ),
    ] = None,
    report: Annotated[bool, typer.Option("--report/--no-report", help="Rebuild the report after.")] = True,
    jobs: JobsOption = 1,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            help="local: --jobs tasks at once; local-gpus: own GPUs each; slurm: a job-array task per point.",
        ),
    ] = "local",
    gpus: GpusOption = None,
    gpus_per_task: GpusPerTaskOption = 0,
    partition: PartitionOption = None,
    time_limit: TimeOption = None,
    account: AccountOption = None,
    cpus_per_task: CpusPerTaskOption = None,
    sbatch_template: TemplateOption = None,
    scratch: ScratchOption = None,
    wait: WaitOption = True,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the points, the GPU-hour estimate and the sbatch script; run nothing."
        ),
    ] = False,
    root: RootOption = Path("."),
):
    """Run a params grid as DVC experiments (workspace untouched), file them in reports/sweeps/, report.

    Each point runs in its own clone of the baseline: `--jobs` at a time here (the default), on
    its own GPUs (`--executor local-gpus --gpus 0,1`) or as a SLURM array task (`--executor slurm`).
    Ctrl-C stops the points it started; `prefshift sweep resume <id>` continues.
    """
    if ctx.invoked_subcommand:
        return
    from prefshift.pipeline.sweep import grid as grid_module
    from prefshift.pipeline.sweep import run as sweep_run
    from prefshift.pipeline.sweep.slurm import SlurmResources

    if grid_file is not None and set_:
        err_console.print(error_text("--grid-file and -S: give the grid one way; add axes to the file"))
        raise typer.Exit(2)
    if grid_file is None and not set_:
        err_console.print(error_text("nothing to sweep: pass -S key=value1,value2 or --grid-file FILE"))
        raise typer.Exit(2)
    grid = _call(_grid, grid_file, max_points) if grid_file else None
    axes = None if grid else _call(grid_module.parse_grid, set_)
    points = grid.points if grid else _call(grid_module.grid_points, axes, max_points)
    default_methods = ",".join((grid.spec.methods_collected if grid else None) or sweep_run.SWEEP_METHODS)
    listed = [m.strip() for m in (methods or default_methods).split(",") if m.strip()]
    template = _template(sbatch_template)
    resources = SlurmResources(gpus_per_task, partition, time_limit, account, cpus_per_task, template)
    chosen = sweep_run.Executor(executor, jobs, _devices(gpus) or (), resources)
    _call(chosen.check, wait)
    if dry_run:
        _dry_run(root, grid, points, listed, chosen, scratch)
        return
    result = _call(sweep_run.start, root, points, listed, chosen, scratch, report, wait)
    _print_sweep(result)


def _grid(path: Path, max_points: int) -> Any:
    """The grid file, read; a library's error inside (bytes that are not UTF-8) names the file."""
    with naming(str(path)):
        return _stage("pipeline.sweep.grid_file", "load_grid_file")(path, max_points)


def _dry_run(root: Path, grid: Any, points: list, methods: list, chosen: Any, scratch: Path | None) -> None:
    """What a sweep would run and cost, printed; nothing is written, run or submitted. A grid the
    sweep would refuse is refused; what the workspace lacks is noted, after the plan."""
    loaded = _call(_stage("pipeline.sweep.grid", "check_distinct"), root / "params.yaml", points, methods)
    typer.echo(f"points: {len(points)}")
    if grid is not None:
        grid_module = importlib.import_module("prefshift.pipeline.sweep.grid_file")
        for line in grid_module.describe_points(grid.labels):
            typer.echo(f"  {line}")
        if grid.spec.estimate:
            for line in _call(grid_module.estimate, grid, loaded).lines()[1:]:
                typer.echo(line)
    preflight = _stage("pipeline.sweep.run", "preflight")
    problems, notes = _call(preflight, root, points, loaded, methods, chosen, scratch)
    for problem in problems:
        typer.echo(f"note: the sweep itself would stop here: {problem}")
    for note in notes:
        typer.echo(f"note: {note}")
    if chosen.kind == "slurm":
        slurm = importlib.import_module("prefshift.pipeline.sweep.slurm")
        typer.echo("sbatch script:")
        typer.echo(_call(slurm.dry_run_script, root, chosen.resources, points, scratch), nl=False)


def _print_sweep(result: dict) -> None:
    from prefshift.pipeline.sweep.commands import silence

    try:
        if result.get("sweep_id") and not result["experiments"]:
            err_console.print(
                f"sweep {result['sweep_id']} submitted ({result['folder']}); "
                f"follow it with `prefshift sweep status {result['sweep_id']}`, "
                f"gather it with `prefshift sweep collect {result['sweep_id']}`"
            )
            typer.echo(result["sweep_id"])
            return
        for experiment in result["experiments"]:
            err_console.print(f"{experiment['name']}: {', '.join(experiment['files'])}")
        if result["report"]:
            err_console.print(f"report: {result['report']} (`dvc repro report` records it in dvc.lock)")
    except BrokenPipeError:  # the reader went away; the results are filed all the same
        silence()


SweepIdArgument = Annotated[str, typer.Argument(help="The sweep's id, as `prefshift sweep` printed it.")]


@sweep_app.command("status")
def sweep_status(sweep_id: SweepIdArgument, scratch: ScratchOption = None, root: RootOption = Path(".")):
    """Where each point of a sweep stands; a failed or stopped one with its log's path."""
    for line in _call(_stage("pipeline.sweep.run", "status"), root, sweep_id, scratch):
        typer.echo(line)


@sweep_app.command("collect")
def sweep_collect(sweep_id: SweepIdArgument, scratch: ScratchOption = None, root: RootOption = Path(".")):
    """Bring a finished sweep's experiments in, check and file them, rebuild the report."""
    _print_sweep(_call(_stage("pipeline.sweep.run", "collect_id"), root, sweep_id, scratch))


@sweep_app.command("resume")
def sweep_resume(
    sweep_id: SweepIdArgument,
    jobs: JobsOption = None,
    gpus: GpusOption = None,
    gpus_per_task: GpusPerTaskOption = None,
    partition: PartitionOption = None,
    time_limit: TimeOption = None,
    account: AccountOption = None,
    cpus_per_task: CpusPerTaskOption = None,
    sbatch_template: TemplateOption = None,
    scratch: ScratchOption = None,
    wait: WaitOption = True,
    root: RootOption = Path("."),
):
    """Rerun only the points that are missing, failed or stopped; finished ones never rerun.

    An option left out keeps what the sweep was started with; one given (a longer --time, say, or
    fewer --jobs) holds for the points this resume and later ones rerun, each in its clone as left.
    """
    changes = dict(jobs=jobs, devices=_devices(gpus), gpus_per_task=gpus_per_task, partition=partition)
    changes.update(time=time_limit, account=account, cpus_per_task=cpus_per_task)
    changes["template"] = _template(sbatch_template)
    _print_sweep(_call(_stage("pipeline.sweep.run", "resume"), root, sweep_id, scratch, wait, **changes))


@sweep_app.command("task", hidden=True)
def sweep_task(folder: Path, index: int):
    """One grid point in its own clone: what each pool slot or SLURM array task runs."""
    raise typer.Exit(_call(_stage("pipeline.sweep.task", "run_point"), folder, index))


def main() -> None:
    """`prefshift` and `python -m prefshift`: run the command, then end the process without tearing
    the interpreter down.

    Python's shutdown frees every module and object one by one: about 1 s per process once torch,
    transformers and MLflow are loaded, 2 s after training, paid by each of the pipeline's stage
    processes. Everything a command writes is closed by then (outputs are renamed into place,
    MLflow runs ended), so the exit handlers run, the streams are flushed and the process ends.
    A thread still running keeps the ordinary shutdown, which waits for it.
    """
    reopen_closed()  # before anything is opened: no file may land on a closed 0, 1 or 2
    heed_discarded_stops()
    try:
        app()
    except SystemExit as stop:
        _leave(stop.code)
    _leave(0)


def _leave(code: int | str | None) -> NoReturn:
    """End with `code`, or with a stop's status where Python discarded the stop (a Ctrl-C in an exit
    handler, say) and the command ran on: it was asked to stop, so it does not say it succeeded."""
    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main_thread for t in threading.enumerate()):
        raise SystemExit(code or _stopped_status())
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    with signals_ignored():  # a stop sent again now would only cut the flush short
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or _stopped_status())


def _stopped_status() -> int:
    signum = discarded_stop()
    return exit_code(signum) if signum is not None else 0

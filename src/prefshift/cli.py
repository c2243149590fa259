"""The command line: one command per DVC stage, plus the user-facing helpers.

Commands only parse options and call the stage module; stage modules are imported
lazily so `prefshift --help` stays fast and a stage pulls in only what it needs.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from prefshift.config.params import Params, check_listed, check_method, load_params
from prefshift.core.atomic import STDOUT, check_output
from prefshift.core.console import error_text, messages
from prefshift.core.errors import PrefshiftError, file_error_message
from prefshift.core.paths import Layout
from prefshift.core.progress import lines_to

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="prefshift: weak-to-strong reward models under preference shift.",
)
err_console = messages()

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read.")]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-S", help="Override a param, e.g. -S anchor.lambda=0.01 (repeatable)."),
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
    """Run a command's work; a problem the user can fix is one line on stderr and exit 2.

    An OSError that names its file (missing, a directory, no permission, read-only, disk full)
    is such a problem wherever it is raised, so it is printed the same way, never as a traceback.
    One without a file name is not a file-boundary error and keeps its traceback.
    """
    try:
        return fn(*args, **kwargs)
    except PrefshiftError as err:
        err_console.print(error_text(err))
        raise typer.Exit(2) from None
    except OSError as err:
        if err.filename is None:
            raise
        err_console.print(error_text(file_error_message(err)))
        raise typer.Exit(2) from None


def _params(path: Path, overrides: list[str] | None) -> Params:
    return _call(load_params, path, overrides)


@app.command()
def inputs(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Version the local data and model files params name: data/inputs/*.json (DVC runs it always)."""
    _call(_stage("pipeline.stages.inputs"), _params(params, set_), Layout(root))


@app.command()
def prepare(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Normalise the source and target datasets to the pair schema (data/pairs/)."""
    _call(_stage("pipeline.stages.prepare"), _params(params, set_), Layout(root))


@app.command()
def split(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Build teacher_train / student_train / id_test / ood splits (data/splits/)."""
    _call(_stage("pipeline.stages.split"), _params(params, set_), Layout(root))


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
def teacher(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Train the weak teacher on the gold labels of teacher_train (models/teacher/)."""
    _call(_stage("pipeline.stages.teacher"), _params(params, set_), Layout(root))


@app.command()
def label(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Soft labels q_i for student_train and the teacher's scores on every test split."""
    _call(_stage("pipeline.stages.label"), _params(params, set_), Layout(root))


@app.command("seam-label")
def seam_label(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """SEAM soft labels for student_train: strong-LM principles, teacher judgements (data/targets/seam/)."""
    _call(_stage("pipeline.stages.seam_label"), _params(params, set_), Layout(root))


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
    root: RootOption = Path("."),
):
    """Write what student M trains on (data/targets/<M>/): teacher q, gold, or SEAM's labels."""
    _call(check_method, method)
    loaded = _params(params, set_)
    _call(check_listed, loaded, method)
    _call(_stage("pipeline.stages.targets"), loaded, Layout(root), method)


@app.command()
def train(
    method: Annotated[str, typer.Option("--method", "-m", help="naive, confidence, seam, anchor_last, ...")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Train one strong student (models/students/<method>/)."""
    _call(check_method, method)
    loaded = _params(params, set_)
    _call(check_listed, loaded, method)
    _call(_stage("pipeline.stages.train"), loaded, Layout(root), method)


@app.command()
def evaluate(
    method: Annotated[str, typer.Option("--method", "-m", help="Which trained student to evaluate.")],
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Score ID and OOD splits with a student; write reports/metrics/<method>.json."""
    _call(check_method, method)
    loaded = _params(params, set_)
    _call(check_listed, loaded, method)
    _call(_stage("pipeline.stages.evaluate"), loaded, Layout(root), method)


@app.command("policy-samples")
def policy_samples(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """Sample downstream.n_max completions per prompt from the policy LM (data/policy_samples/)."""
    _call(_stage("pipeline.stages.policy_samples"), _params(params, set_), Layout(root))


@app.command()
def judge(params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")):
    """Train (or name) the best-of-n gold judge, and score its accuracy: models/judge, reports/judge.json."""
    _call(_stage("pipeline.stages.judge"), _params(params, set_), Layout(root))


@app.command("gold-judge")
def gold_judge(
    params: ParamsOption = Path("params.yaml"), set_: SetOption = None, root: RootOption = Path(".")
):
    """Score every policy sample with the gold judge (and the synthetic gold rule): data/downstream/gold."""
    _call(_stage("pipeline.stages.gold_judge"), _params(params, set_), Layout(root))


@app.command()
def downstream(
    method: Annotated[
        str | None,
        typer.Option("--method", "-m", help="Only this proxy: teacher or a method (default: all of them)."),
    ] = None,
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Best-of-n with the teacher's and every listed method's RM as the proxy, judged by gold
    (reports/downstream/<M>.json)."""
    loaded = _params(params, set_)
    if method is None:
        _call(_stage("pipeline.stages.downstream", "run_all"), loaded, Layout(root))
        return
    if method != "teacher":
        _call(check_listed, loaded, method)
    _call(_stage("pipeline.stages.downstream"), loaded, Layout(root), method)


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
    params: ParamsOption = Path("params.yaml"),
    set_: SetOption = None,
    root: RootOption = Path("."),
):
    """Rewards per row, and chosen-vs-rejected accuracy when the input has pairs."""
    if out is not None and str(out) == STDOUT:
        out = None
    if out is not None:  # before any work: never its own input, and writable now
        local_model = [] if model.startswith("models:/") else [Path(model)]
        _call(check_output, out, inputs=[input_, params, *local_model])
    loaded = _params(params, set_)
    with lines_to(sys.stderr):  # stdout carries the rewards
        result = _call(
            _stage("tracking.score", "score_command"), model, input_, out, loaded, Layout(root), normalize
        )
    if out is None:
        for row in result["rows"]:
            typer.echo(json.dumps(row, sort_keys=True, allow_nan=False))
    cut = result["truncation"]
    summary = (
        f"scored {len(result['rows'])} {result['kind']} rows; {result['skipped']} skipped (no response token "
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
):
    """Training vs TRL, ANCHOR overhead, scoring throughput (and the pipeline): reports/bench.{json,md}."""
    for output in [out / "bench.json", out / "bench.md", *([readme] if readme else [])]:
        _call(check_output, output)
    _call(
        _stage("bench.run", "run_bench"),
        out,
        quick=quick,
        reps=reps,
        pipeline=pipeline,
        keep=keep,
        threads=threads,
        note=note,
        invocations=invocations,
        trl_as_shipped=trl_as_shipped,
        readme=readme,
    )


@app.command()
def sweep(
    set_: Annotated[
        list[str],
        typer.Option("--set", "-S", help="Grid axis, e.g. -S anchor.lambda=1e-4,1e-2,1 (repeatable)."),
    ],
    methods: Annotated[str, typer.Option("--methods", help="Comma-separated methods to collect.")] = (
        "anchor_last,anchor_mid"
    ),
    report: Annotated[bool, typer.Option("--report/--no-report", help="Rebuild the report after.")] = True,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", help="Experiments at once (`dvc queue start -j`); 1 suits CPUs (torch uses all)."
        ),
    ] = 1,
    root: RootOption = Path("."),
):
    """Queue a params grid as DVC experiments (workspace untouched), file them in reports/sweeps/, report."""
    listed = [m.strip() for m in methods.split(",") if m.strip()]
    result = _call(_stage("pipeline.sweep"), root, set_, listed, report, jobs)
    for experiment in result["experiments"]:
        err_console.print(f"{experiment['name']}: {', '.join(experiment['files'])}")
    if result["report"]:
        err_console.print(f"report: {result['report']} (`dvc repro report` records it in dvc.lock)")


def main() -> None:
    app()

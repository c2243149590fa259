"""Every CLI command over one shared corpus of malformed inputs: exit 2, one named line, no traceback.

The corpus is data: each `Bad` is a malformed input (a params file, an override, a row file, a
model directory, a tracking store, a grid file) with the files it writes, the arguments it adds
and the words the error must say. `COMMANDS` lists what every command is run with; a case names
the commands it applies to (`PARAMS_COMMANDS` for anything that reads params). To add a case,
append a `Bad` to `CORPUS`. `test_every_command_meets_the_corpus` fails when a command is added
to the CLI without being listed here.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from mlflow_support import seed_database
from prefshift.cli import app
from prefshift.models.reward import save_reward_model
from tiny_models import reward_model, tokenizer

BIG = "1" * 5000  # past Python's 4300-digit limit on int(str): a ValueError from deep inside json/yaml
ROW = {"prompt": "what is prime?", "response": "two divisors"}

# What each command is run with (before the case's own arguments); {p} is the case's params file.
COMMANDS: dict[str, list[str]] = {
    "inputs": ["inputs", "-p", "{p}"],
    "prepare": ["prepare", "-p", "{p}"],
    "split": ["split", "-p", "{p}"],
    "backbone": ["backbone", "-p", "{p}"],
    "teacher": ["teacher", "-p", "{p}"],
    "label": ["label", "-p", "{p}"],
    "seam-principles": ["seam-principles", "-p", "{p}"],
    "seam-label": ["seam-label", "-p", "{p}"],
    "plan": ["plan", "-p", "{p}"],
    "reference": ["reference", "-p", "{p}"],
    "probe": ["probe", "-p", "{p}"],
    "targets": ["targets", "-m", "naive", "-p", "{p}"],
    "train": ["train", "-m", "naive", "-p", "{p}"],
    "evaluate": ["evaluate", "-m", "naive", "-p", "{p}"],
    "score-target": ["score-target", "--model", "naive", "--target", "syn_help_chat", "-p", "{p}"],
    "evaluate-teacher": ["evaluate-teacher", "-p", "{p}"],
    "policy-samples": ["policy-samples", "-p", "{p}"],
    "judge": ["judge", "-p", "{p}"],
    "judge-target": ["judge-target", "--target", "syn_help_chat", "-p", "{p}"],
    "gold-judge": ["gold-judge", "-p", "{p}"],
    "downstream": ["downstream", "-p", "{p}"],
    "report": ["report", "-p", "{p}"],
    "promote": ["promote", "-p", "{p}"],
    "score": ["score", "--model", "{model}", "--input", "{rows}", "-p", "{p}"],
    "score models:/": ["score", "--model", "models:/rm@champion", "--input", "{rows}", "-p", "{p}"],
    "pull": ["pull", "models:/rm@champion", "--out", "{dir}/pulled"],
    "sync": ["sync"],
    "ui --check": ["ui", "--check", "-p", "{p}", "--screenshot", "{dir}/shot.png"],
    "preset": ["preset", "laptop-helpful", "--out", "{dir}/preset.yaml"],
    "sweep": ["sweep", "--dry-run"],
    "sweep status": ["sweep", "status", "s1", "--scratch", "{dir}/sweeps"],
    "sweep collect": ["sweep", "collect", "s1", "--scratch", "{dir}/sweeps"],
    "sweep resume": ["sweep", "resume", "s1", "--scratch", "{dir}/sweeps"],
    "sweep task": ["sweep", "task", "{dir}/sweeps/s1", "0"],
}
NO_ROOT = ("preset", "sweep task")  # commands without --root
PARAMS_COMMANDS = tuple(k for k, v in COMMANDS.items() if "{p}" in v)
OVERRIDE_COMMANDS = (*(c for c in PARAMS_COMMANDS if c != "ui --check"), "preset")  # ui takes no -S

# Commands the corpus does not reach, and why (each is still inside the one boundary, cli._Boundary).
NOT_RUN = {
    "datasets": "reads no input: it prints the adapter catalogue",
    "bench": "its inputs are the --pipeline-params file, checked by click (exists, not a directory)",
}
SWEEP_RECORD = ("sweep status", "sweep collect", "sweep resume", "sweep task")
RECORD = {
    "id": "s1",
    "root": "<dir>",
    "baseline": "0" * 40,
    "points": [{"seed": "1"}],
    "names": ["sweep-seed-1"],
    "methods": ["naive"],
    "report": False,
    "tracking_uri": "sqlite:///mlflow.db",
    "git_remote": "<dir>",
    "dvc_cache": None,
    "executor": {"kind": "local", "jobs": 1, "devices": [], "resources": {}},
    "jobs": [],
}


def _record(drop: str = "", **changes) -> dict[str, str]:
    """A sweep record as `prefshift sweep` writes it, field `drop` left out and `changes` applied."""
    record = {k: v for k, v in {**RECORD, **changes}.items() if k != drop}
    return {"sweeps/s1/sweep.json": json.dumps(record)}


def _locked(path: Path) -> Callable[[], Callable[[], None]]:
    """A real lock: another connection holds an exclusive transaction on the database."""

    def hold() -> Callable[[], None]:
        holder = sqlite3.connect(path, timeout=0)
        holder.execute("BEGIN EXCLUSIVE")
        return holder.close

    return hold


@dataclass
class Bad:
    """One malformed input: the files it writes (relative to the case folder; `<dir>` in a text
    is that folder), the arguments it adds, the commands it is tried on, and words the one-line
    error must contain."""

    name: str
    commands: tuple[str, ...]
    says: str
    files: dict[str, bytes | str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    store: str = "good"  # the tracking store: good | corrupt | locked | directory | empty | offline-corrupt
    model: Callable[[Path], None] | None = None  # changes the case's model directory
    project: Callable[[Path, Path], None] | None = None  # prepares the project (root, model directory)


def _config_number(model: Path) -> None:
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text.replace("{", '{"too_long": ' + BIG + ",", 1))


def _stats_number(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config)[:-1] + f', "mean": {BIG}, "std": 1.0}}')


def _config_not_utf8(model: Path) -> None:
    (model / "config.json").write_bytes(b'{"model_type": "\xff"}')


def _index_number(model: Path) -> None:
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a": ' + BIG + "}}")


GRID = ["--grid-file", "{dir}/grid.yaml"]


def _passing_student(root: Path, model: Path, link: bool = False) -> None:
    """A naive student whose verified metrics pass the gate, as promote finds it after `dvc repro`."""
    from prefshift.core.paths import Layout
    from test_registry import write_metrics

    layout = Layout(root, seed=0)
    write_metrics(layout, "naive", 70.0, 70.5, 1.0, 2.0)
    shutil.copytree(model, layout.student_dir("naive"))
    if link:
        (layout.student_dir("naive") / "notes.txt").symlink_to(root / "rows.jsonl")


CORPUS = [
    # params files and overrides
    Bad("params: a 5000-digit number", PARAMS_COMMANDS, "more digits than Python converts",
        files={"params.yaml": f"seed: {BIG}\n"}),
    Bad("params: not UTF-8", PARAMS_COMMANDS, "params.yaml", files={"params.yaml": b"seed: \xff\xfe\n"}),
    Bad("params: a 13th month", PARAMS_COMMANDS, "params.yaml: a value that cannot be read",
        files={"params.yaml": "seed: 2026-13-01\n"}),
    Bad("params: a directory", PARAMS_COMMANDS, "params.yaml", files={"params.yaml/x": ""}),
    Bad("override: a 5000-digit number", OVERRIDE_COMMANDS, "more digits than Python converts",
        args=["-S", f"seed={BIG}"]),
    Bad("override: not YAML", OVERRIDE_COMMANDS, "not valid YAML", args=["-S", "seed=[1"]),
    # a local data source for prepare
    Bad("data: a 5000-digit number in a local JSONL", ("prepare",), "test.jsonl line 1: a number with more",
        files={
        "params.yaml": "data:\n  source: own\n  category: helpful\n  targets: []\n  sources:\n"
                       "    own: {adapter: local, path: <dir>/data_in, category: helpful}\n",
        "data_in/test.jsonl": '{"prompt": "hi", "chosen": "a", "rejected": "b", "n": ' + BIG + "}\n",
        "data_in/train.jsonl": json.dumps({"prompt": "hi", "chosen": "a", "rejected": "b"}) + "\n"}),
    # rows for score
    Bad("rows: a 5000-digit number", ("score",), "rows.jsonl line 1: not a JSON object (a number with more",
        files={"rows.jsonl": '{"prompt": "hi", "response": "yo", "n": ' + BIG + "}\n"}),
    Bad("rows: a lone surrogate in a response", ("score",), "rows.jsonl line 1: field 'response' holds",
        files={"rows.jsonl": '{"prompt": "hi", "response": "a \\ud800 b"}\n'}),
    Bad("rows: a lone low surrogate in a message", ("score",), "rows.jsonl line 2: prompt[0].content holds",
        files={"rows.jsonl": json.dumps(ROW) + '\n{"prompt": [{"role": "user", "content": "\\udfff"}], '
               '"response": "yo"}\n'}),
    Bad("rows: a surrogate in a pair", ("score",), "field 'rejected' holds",
        files={"rows.jsonl": '{"prompt": "hi", "chosen": "yo", "rejected": "\\udbff\\udbff"}\n'}),
    Bad("rows: a JSON-text prompt with a 5000-digit number", ("score",), "scored 1",  # plain text: scored
        files={"rows.jsonl": json.dumps({"prompt": "[" + BIG + "]", "response": "yo"}) + "\n"}),
    Bad("rows: not UTF-8", ("score",), "rows.jsonl line 1: not a JSON object",
        files={"rows.jsonl": b'{"prompt": "hi", "response": "\xff"}\n'}),
    Bad("rows: a response that is a number", ("score",), "field 'response' must be a string",
        files={"rows.jsonl": '{"prompt": "hi", "response": 5}\n'}),
    # model directories
    Bad("model: a 5000-digit number in config.json", ("score",), "config.json (a number with more digits",
        model=_config_number),
    Bad("model: config.json not UTF-8", ("score",), "unreadable config.json", model=_config_not_utf8),
    Bad("model: a 5000-digit number in the weight index", ("score",), "model.safetensors.index.json",
        model=_index_number),
    Bad("model: a 5000-digit normalisation mean", ("score",), "config.json (a number with more digits",
        model=_stats_number, args=["--normalize"]),
    Bad("model: a 5000-digit mean in the student promote registers", ("promote",), "config.json",
        model=_stats_number, project=_passing_student),
    Bad("model: a link inside the student promote registers", ("promote",), "a link",
        project=lambda root, model: _passing_student(root, model, link=True)),
    # tracking stores
    Bad("store: a damaged mlflow.db", ("pull", "score models:/", "sync"),
        "the database file is damaged or is not an MLflow database", store="corrupt"),
    Bad("store: a locked mlflow.db", ("pull", "score models:/", "sync"), "another process holds the database",
        store="locked"),
    Bad("store: a damaged mlflow.db when promoting", ("promote",), "the database file is damaged",
        store="corrupt", project=_passing_student),
    Bad("store: a locked mlflow.db when promoting", ("promote",), "another process holds the database",
        store="locked", project=_passing_student),
    Bad("store: a damaged offline database", ("sync",), "offline database", store="offline-corrupt"),
    Bad("store: mlflow.db is a directory", ("pull", "score models:/", "sync"), "mlflow.db is not a file",
        store="directory"),
    Bad("store: an empty mlflow.db", ("pull", "score models:/"), "no registered model named 'rm'",
        store="empty"),
    # grid files
    Bad("grid file: a 5000-digit number", ("sweep",), "grid.yaml: a number with more digits",
        files={"grid.yaml": f"blocks:\n- axes:\n    anchor.lambda: [{BIG}]\n"}, args=GRID),
    Bad("grid file: not UTF-8", ("sweep",), "grid.yaml: not UTF-8", files={"grid.yaml": b"\xff\xfe"},
        args=GRID),
    # sweep records and point states: prefshift's own files, edited or cut short (a full disk)
    Bad("sweep record: an empty object", SWEEP_RECORD, "sweep.json: id: Field required",
        files={"sweeps/s1/sweep.json": "{}"}),
    Bad("sweep record: a list", SWEEP_RECORD, "sweep.json: (top level): Input should be a valid dict",
        files={"sweeps/s1/sweep.json": "[]"}),
    Bad("sweep record: no executor", SWEEP_RECORD, "sweep.json: executor: Field required",
        files=_record(drop="executor")),
    Bad("sweep record: a name short", SWEEP_RECORD, "sweep.json: names: not one per point",
        files=_record(names=[])),
    Bad("sweep record: a stopped point's index as text", SWEEP_RECORD,
        "sweep.json: stops.0.points.0: Input should be a valid integer",
        files=_record(stops=[{"time": "t", "signal": "SIGINT", "points": ["0"], "done": []}])),
    Bad("sweep record: --jobs as text", ("sweep resume",), "sweep.json: executor.jobs: Input should be",
        files=_record(executor={**RECORD["executor"], "jobs": "two"})),
    Bad("point state: a list", SWEEP_RECORD, "0.json: (top level): Input should be a valid dict",
        files={**_record(), "sweeps/s1/points/0.json": "[]"}),
    Bad("point state: an attempt as text", SWEEP_RECORD, "0.json: attempt: Input should be a valid integer",
        files={**_record(), "sweeps/s1/points/0.json": '{"state": "failed", "attempt": "2"}'}),
    Bad("sweep record: cut short", SWEEP_RECORD, "sweep.json: not a sweep record (Unterminated string",
        files={"sweeps/s1/sweep.json": '{"id": "s1", "ro'}),
    Bad("point state: finished without its commit", SWEEP_RECORD,
        "0.json: (top level): Value error, state 'success' without the experiment's commit",
        files={**_record(), "sweeps/s1/points/0.json": '{"state": "success"}'}),
]  # fmt: skip

CASES = [pytest.param(bad, c, id=f"{c} | {bad.name}") for bad in CORPUS for c in bad.commands]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "rm"
    save_reward_model(reward_model(), tokenizer(), path)
    return path


def _store(case: Path, kind: str, tmp_path_factory) -> tuple[str, Callable[[], None]]:
    """The case's MLFLOW_TRACKING_URI and what to do after the command (release a lock)."""
    db = case / "mlflow.db"
    seed_database(tmp_path_factory, db)
    release: Callable[[], None] = lambda: None  # noqa: E731
    if kind == "corrupt":
        db.write_bytes(b"this is not a database " * 100)
    elif kind == "locked":
        release = _locked(db)()
    elif kind == "directory":
        db.unlink()
        db.mkdir()
    elif kind == "empty":  # a file sqlite opens, with no MLflow tables yet
        db.write_bytes(b"")
    offline = case / ".prefshift" / "offline.db"  # sync reads it first: a run recorded offline
    seed_database(tmp_path_factory, offline)
    if kind == "offline-corrupt":
        offline.write_bytes(b"this is not a database " * 100)
    return f"sqlite:///{db}", release


@pytest.mark.parametrize(("bad", "command"), CASES)
def test_a_malformed_input_is_one_line_and_exit_2(bad, command, tmp_path, tmp_path_factory, tiny_model):
    (tmp_path / "params.yaml").write_text("seeds: [0]\n")
    (tmp_path / "rows.jsonl").write_text(json.dumps(ROW) + "\n")
    for rel, content in bad.files.items():
        path = tmp_path / rel
        for folder in [path, *path.parents]:  # a file where the case wants a folder goes
            if folder.is_file():
                folder.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content.replace("<dir>", str(tmp_path)))
        else:
            path.write_bytes(content)
    model = tmp_path / "rm"
    shutil.copytree(tiny_model, model)
    if bad.model:
        bad.model(model)
    if bad.project:
        bad.project(tmp_path, model)
    uri, release = _store(tmp_path, bad.store, tmp_path_factory)
    values = {"p": str(tmp_path / "params.yaml"), "rows": str(tmp_path / "rows.jsonl"), "model": str(model),
              "dir": str(tmp_path)}  # fmt: skip
    args = [a.format(**values) for a in [*COMMANDS[command], *bad.args]]
    try:
        result = CliRunner().invoke(
            app, args if "--root" in args or command in NO_ROOT else [*args, "--root", str(tmp_path)],
            env={"MLFLOW_TRACKING_URI": uri, "PREFSHIFT_PIPELINE_RUN_ID": "boundary"},
        )  # fmt: skip
    finally:
        release()
    said = result.output
    if bad.says.startswith("scored"):  # a case the documented policy accepts
        assert result.exit_code == 0 and bad.says in said, said
        return
    assert result.exit_code == 2, f"{said}\n{result.exception!r}"
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in said and bad.says in said, said
    assert said.count("error:") == 1, said


def _commands(group, prefix: str = "") -> set[str]:
    found = set()
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found |= {f"{prefix}{name}"} | _commands(command, f"{prefix}{name} ")
        else:
            found.add(f"{prefix}{name}")
    return found


def test_every_command_meets_the_corpus():
    """A command added to the CLI must be listed in COMMANDS (and so meet the corpus) or NOT_RUN."""
    listed = {name.split(" ")[0] if name.startswith(("score", "ui")) else name for name in COMMANDS}
    assert _commands(typer.main.get_command(app)) - listed - set(NOT_RUN) == set()
    assert {c for bad in CORPUS for c in bad.commands} == set(COMMANDS)


def _raised(action: Callable[[], object]) -> Exception:
    try:
        action()
    except Exception as err:
        return err
    raise AssertionError("nothing was raised")


def test_the_boundary_names_the_real_library_errors_and_keeps_bugs_loud():
    """The errors as the libraries raise them; `naming` gives each the file, row or store."""
    from prefshift.core.errors import boundary_line, naming

    def named(where: str, action: Callable[[], object]) -> Exception:
        def inside() -> None:
            with naming(f"{where} (outer, never shown)"), naming(where):
                action()

        return _raised(inside)

    tok = tokenizer()
    cases = {
        "rows.jsonl line 3: the tokenizer was given something that is not text": named(
            "rows.jsonl line 3", lambda: tok(["a \ud800 b"])
        ),
        "stats.json: a number with more digits than Python converts": named(
            "stats.json", lambda: json.loads(BIG)
        ),
        "row 2: text that cannot be encoded": named("row 2", lambda: "\udfff".encode()),
        "grid.yaml: not UTF-8 text": named("grid.yaml", lambda: b"\xff".decode()),
        "notes.json: not valid JSON": named("notes.json", lambda: json.loads("{")),
    }
    for expected, err in cases.items():
        assert boundary_line(err).startswith(expected), boundary_line(err)
        assert "outer" not in boundary_line(err)
    assert boundary_line(_raised(lambda: {}["bug"])) is None
    assert boundary_line(_raised(lambda: int("x"))) is None  # a ValueError that is a bug stays loud


def test_a_store_error_from_sqlite_itself_says_what_to_do(tmp_path):
    from prefshift.core.errors import boundary_line, naming

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    release = _locked(db)()

    def insert() -> None:
        with naming(f"tracking store {db}"):
            sqlite3.connect(db, timeout=0).execute("insert into t values (1)")

    try:
        err = _raised(insert)
    finally:
        release()
    assert boundary_line(err) == (
        f"tracking store {db}: database is locked; another process holds the database: wait until it "
        "finishes (or stop it), then run again"
    )

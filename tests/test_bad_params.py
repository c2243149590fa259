"""Params, `-S` overrides, the CLI's own options and the tracking URI at their edges (issue 14).

Each case runs the real command (typer's runner, in-process) and expects exit 2 with a
message that names the file, key or override and says what to do; never a traceback,
never a run on values the user did not mean. Two cases walk the params schema itself,
so a field added later is held to the same rules without a test of its own.
"""

from __future__ import annotations

import json
import time
import types
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.config.params import ConfigError, Params, parse_params
from test_bad_inputs import GOOD, _cli_error, _jsonl, _params_file

REPO = Path(__file__).resolve().parents[1]
QUICK_FAILURE_S = 30  # the tracking checks take milliseconds; MLflow's own retries took ~105 s
PULL = ("pull", "models:/prefshift-reward@champion", "--out")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- class 1: params that used to run silently on values nobody wrote ------------------------


def test_score_refuses_a_missing_params_file(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", [GOOD])
    missing = tmp_path / "nope.yaml"
    message = _cli_error("score", "--model", str(tmp_path), "-i", str(rows), "-p", str(missing))
    assert f"{missing}: params file not found" in message and "pass --params" in message


def test_score_applies_overrides_and_names_the_bad_one(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", [GOOD])
    path = _params_file(tmp_path, {})
    message = _cli_error(
        "score", "--model", str(tmp_path), "-i", str(rows), "-p", str(path), "-S", "encode.max_length=banana"
    )
    assert f"{path} -S encode.max_length=banana: invalid params" in message
    assert "encode.max_length: Input should be a valid integer" in message


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("seed: 0\nanchor:\n  lambda: 0.1\nseed: 7\n", "seed", (1, 4)),
        ("anchor:\n  lambda: 0.1\nlabel:\n  temperature: 2.0\nanchor:\n  cache: false\n", "anchor", (1, 5)),
        ("anchor:\n  lambda: 0.1\n  cache: true\n  lambda: 0.2\n", "anchor.lambda", (2, 4)),
        ("data:\n  sources:\n    a: {path: x.jsonl, path: y.jsonl}\n", "data.sources.a.path", (3, 3)),
    ],
)
def test_duplicate_keys_are_refused_with_their_path_and_lines(tmp_path, text, key, lines):
    path = _write(tmp_path / "params.yaml", text)
    message = _cli_error("split", "-p", str(path), "--root", str(tmp_path))
    assert f"{path}: key {key} is given twice (lines {lines[0]} and {lines[1]}); keep one" in message


def test_no_methods_is_refused_before_promote_rewrites_its_report(tmp_path):
    decisions = tmp_path / "reports" / "promotion.json"
    decisions.parent.mkdir()
    decisions.write_text('{"decisions": ["kept"]}', encoding="utf-8")
    path = _params_file(tmp_path, {"methods": []})
    message = _cli_error("promote", "-p", str(path), "--root", str(tmp_path))
    assert "methods: no method listed; name at least one of naive," in message
    assert json.loads(decisions.read_text()) == {"decisions": ["kept"]}


def test_a_method_listed_twice_is_refused(tmp_path):
    message = _cli_error(
        "report", "-p", str(_params_file(tmp_path, {})), "-S", "methods=[naive, seam, naive]"
    )
    assert "methods: 'naive' is listed twice" in message


@pytest.mark.parametrize(
    "override",
    [
        "anchor.lambda=.inf",
        "student.lr=1e400",
        "label.temperature=.nan",
        "anchor.cache_max_gb=.inf",
        "promote.id_tolerance=-.inf",
        "anchor.mid_fractions=[0.5, .inf]",
    ],
)
def test_non_finite_numbers_are_refused(tmp_path, override):
    key = override.split("=")[0]
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", override)
    assert f"{key}" in message and "Input should be a finite number" in message


def test_non_finite_number_in_the_file_is_refused(tmp_path):
    path = _write(tmp_path / "params.yaml", "teacher:\n  weight_decay: .inf\n")
    message = _cli_error("split", "-p", str(path))
    assert "teacher.weight_decay: Input should be a finite number (got inf)" in message


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("teacher.batch_size=8.5", "a fraction where a whole number is expected"),
        ("evaluate.bootstrap=1000.0", "a fraction where a whole number is expected"),
        ("seed=true", "a boolean where a number is expected"),
        ("seeds=[0, 1.0]", "a fraction where a whole number is expected"),
        ("seed=-1", "Input should be greater than or equal to 0"),
        ("teacher.epochs=100000000000000000000000", "out of range: a whole number that fits in 64 bits"),
    ],
)
def test_counts_and_seeds_must_be_whole_numbers_in_range(tmp_path, override, problem):
    key = override.split("=")[0]
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", override)
    assert f"{key}: {problem}" in message


@pytest.mark.parametrize("text", ["", "# nothing here\n# but comments\n"])
def test_an_empty_params_file_is_an_error_that_says_how_to_get_one(tmp_path, text):
    path = _write(tmp_path / "params.yaml", text)
    message = _cli_error("prepare", "-p", str(path), "--root", str(tmp_path))
    assert f"{path}: the params file is empty" in message
    assert "prefshift preset NAME" in message and "restore the embedded default" in message


def test_a_params_path_that_is_a_directory_is_named(tmp_path):
    message = _cli_error("split", "-p", str(tmp_path))
    assert f"{tmp_path}: is a directory, not a params file" in message


def test_schema_defaults_are_the_embedded_default():
    """A section (or key) left out of a params file means what it means in params.yaml."""
    embedded = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    assert Params().resolved() == embedded
    partial = parse_params({"student": {"lr": 1e-3}, "backbone": {"strong": {"pretrain_lr": 1e-3}}})
    embedded["student"]["lr"] = embedded["backbone"]["strong"]["pretrain_lr"] = 1e-3
    assert partial.resolved() == embedded


def _leaves(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, set, bool]]:
    """(dotted params key, scalar types, whether it is a list) of every field, sections walked into."""
    for name, field in model.model_fields.items():
        key, annotation = f"{prefix}{field.alias or name}", field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaves(annotation, f"{key}.")
            continue
        is_list = typing.get_origin(annotation) is list
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        kinds = set(typing.get_args(annotation)) if is_list or union else {annotation}
        yield key, kinds, is_list


def _nested(key: str, value) -> dict:
    tree = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    return tree


def test_every_float_field_refuses_infinity_nan_and_booleans():
    floats = [(key, is_list) for key, kinds, is_list in _leaves(Params) if float in kinds]
    assert {"anchor.lambda", "student.lr", "label.temperature", "anchor.mid_fractions"} <= {
        k for k, _ in floats
    }
    for key, is_list in floats:
        for bad in (float("inf"), float("nan"), "1e400"):
            with pytest.raises(ConfigError, match=rf"{key}(\.0)?: Input should be a finite number"):
                parse_params(_nested(key, [bad] if is_list else bad))
        with pytest.raises(ConfigError, match=rf"{key}: a boolean where a number is expected"):
            parse_params(_nested(key, [True] if is_list else True))


def test_every_int_field_refuses_fractions_and_booleans():
    ints = [key for key, kinds, is_list in _leaves(Params) if kinds & {int} and not is_list]
    assert {"seed", "teacher.batch_size", "backbone.strong.num_layers", "data.caps.ood"} <= set(ints)
    for key in ints:
        with pytest.raises(ConfigError, match=rf"{key}: a fraction where a whole number is expected"):
            parse_params(_nested(key, 2.0))
        with pytest.raises(ConfigError, match=rf"{key}: a boolean where a number is expected"):
            parse_params(_nested(key, True))


# --- class 3: -S values that are not YAML, in every command that takes -S --------------------


BAD_VALUES = [
    ("anchor.lambda=[", "while parsing a flow node"),
    (
        "data.sources={a: {path: x_{split}.jsonl}}",
        "while parsing a flow mapping: did not find expected ',' or '}'",
    ),
]


@pytest.mark.parametrize(("override", "problem"), BAD_VALUES)
@pytest.mark.parametrize(
    "command",
    [
        ["split"],
        ["train", "-m", "naive"],
        ["score", "--model", "m", "-i", "rows.jsonl"],
        ["preset", "laptop-helpful"],
    ],
    ids=lambda c: c[0],
)
def test_an_override_that_is_not_yaml_is_named(tmp_path, command, override, problem):
    out = tmp_path / "written.yaml"
    extra = ["-o", str(out)] if command[0] == "preset" else ["-p", str(_params_file(tmp_path, {}))]
    message = _cli_error(*command, *extra, "-S", override)
    assert f"override {override!r}: not valid YAML: {problem}" in message
    assert "quote a string that holds" in message
    assert not out.exists()


def test_sweep_parses_its_grid_values_as_dvc_will(tmp_path):
    """A sweep's values go to `dvc exp run -S`, which reads them with Hydra's grammar, not YAML:
    the sweep checks them with that parser, before anything runs (test_sweep.py has the cases). The
    params file holds the param: DVC sets only a param the file holds."""
    _params_file(tmp_path, {"anchor": {"lambda": 1.0}})
    message = _cli_error("sweep", "-S", "anchor.lambda=1e-4,[", "--root", str(tmp_path), "--no-report")
    assert message.startswith("error: -S anchor.lambda=[: DVC cannot parse this value (")
    assert message.rstrip().endswith("quote it as a string: -S \"anchor.lambda='['\"")


def test_a_quoted_value_with_braces_is_accepted():
    from prefshift.config.params import apply_overrides

    raw = apply_overrides({}, ['data.sources={a: {path: "x_{split}.jsonl"}}'])
    assert raw == {"data": {"sources": {"a": {"path": "x_{split}.jsonl"}}}}


# --- class 4: a tracking database that cannot be opened fails at once, naming its path --------


def _timed_error(monkeypatch, uri: str, *args: str) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    started = time.monotonic()
    message = _cli_error(*args)
    assert time.monotonic() - started < QUICK_FAILURE_S
    return message


def test_a_tracking_database_path_that_is_a_directory_fails_fast(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    db.mkdir()
    message = _timed_error(monkeypatch, f"sqlite:///{db}", *PULL, str(tmp_path / "o"))
    assert f"tracking database {db} is not a file" in message and "MLFLOW_TRACKING_URI" in message


def test_a_tracking_database_in_a_missing_directory_fails_fast(tmp_path, monkeypatch):
    db = tmp_path / "no" / "such" / "dir" / "mlflow.db"
    message = _timed_error(monkeypatch, f"sqlite:///{db}", *PULL, str(tmp_path / "o"))
    assert f"no tracking database at {db}" in message


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc: read-only even for root")
def test_a_tracking_database_in_a_read_only_location_fails_fast(tmp_path, monkeypatch):
    offline = tmp_path / ".prefshift" / "offline.db"  # something to sync, so sync opens its target
    offline.parent.mkdir()
    offline.touch()
    target = "/proc/self/mlflow.db"
    uri = f"sqlite:///{target}"
    message = _timed_error(monkeypatch, uri, "sync", "--to", uri, "--root", str(tmp_path))
    assert f"tracking database {target} is not writable" in message and "make /proc/self writable" in message


def test_a_writing_stage_checks_its_tracking_database_first(tmp_path, monkeypatch):
    """`check_sqlite` runs before MLflow opens the database for every stage's run."""
    from prefshift.core.paths import Layout
    from prefshift.tracking import runs as tracking

    db = tmp_path / "missing" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    started = time.monotonic()
    refused = pytest.raises(tracking.TrackingError, match=rf"directory {tmp_path / 'missing'} does not exist")
    with refused, tracking.stage_run(Params(), Layout(tmp_path, seed=0), "teacher"):
        pass
    assert time.monotonic() - started < QUICK_FAILURE_S


# --- class 5: vague or misleading messages from the CLI's own options --------------------------


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("=3", "no key before '='"),
        (".x=1", "the key '.x' has an empty part"),
        ("anchor..lambda=1", "the key 'anchor..lambda' has an empty part"),
    ],
)
def test_an_empty_override_key_is_named_not_reported_as_root(tmp_path, override, problem):
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", override)
    assert f"override {override!r}: {problem}; expected section.key=value" in message
    assert "<root>" not in message


def test_a_section_level_check_does_not_dump_the_section(tmp_path):
    message = _cli_error(
        "split", "-p", str(_params_file(tmp_path, {})), "-S", "data.targets=[syn_help_forum]"
    )
    assert "data: data.targets must not contain the source dataset 'syn_help_forum'" in message
    assert "Value error" not in message and "(got {" not in message


def _usage_error(*args: str) -> str:
    """An option refused by the CLI itself (click): exit 2 and its message, box and spaces removed."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    return "".join(result.stderr.replace("│", "").split())


def test_a_scalar_where_a_section_belongs_is_said_so_in_params_terms(tmp_path):
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", "data.sources.mine=3")
    assert "data.sources.mine: expected a section of `key: value` entries (got 3)" in message
    assert "DatasetSource" not in message


def test_a_root_that_does_not_exist_is_refused(tmp_path):
    missing = tmp_path / "elsewhere"
    message = _usage_error("split", "--root", str(missing))
    assert "Invalidvaluefor'--root'" in message and f"'{missing}'doesnotexist" in message
    assert not missing.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["ui", "--port", "70000"],
            "Invalid value for '--port': Input should be less than or equal to 65535",
        ),
        (["bench", "--reps", "0"], "Invalid value for '--reps': Input should be greater than or equal to 1"),
        (
            ["bench", "--threads", "0"],
            "Invalid value for '--threads': Input should be greater than or equal to 1",
        ),
    ],
)
def test_out_of_range_options_are_refused_by_name(args, expected):
    assert "".join(expected.split()) in _usage_error(*args)


@pytest.mark.parametrize(
    ("methods", "problem"),
    [
        ("anchr_last", "unknown method 'anchr_last'"),
        (",", "name each method to collect once"),
        ("naive,naive", "name each method to collect once"),
    ],
)
def test_sweep_methods_are_checked_before_any_experiment(tmp_path, methods, problem):
    _params_file(tmp_path, {})
    message = _cli_error("sweep", "-S", "anchor.lambda=1,2", "--methods", methods, "--root", str(tmp_path))
    assert problem in message


def test_preset_out_that_is_a_directory_is_named(tmp_path):
    message = _cli_error("preset", "laptop-helpful", "-o", str(tmp_path))
    assert f"--out {tmp_path}: is a directory" in message


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        (
            "synthetic.target_cues={syn_help_chatt: [marker]}",
            "names 'syn_help_chatt', which is not a synthetic",
        ),
        (
            "synthetic.target_cues={syn_help_chat: [marker, marker]}",
            "target_cues.syn_help_chat lists a cue twice",
        ),
        ("synthetic.target_cues={syn_help_chat: [length]}", "synthetic.target_cues.syn_help_chat.0"),
    ],
)
def test_bad_target_cues_are_refused_with_their_key(tmp_path, override, problem):
    message = _cli_error("split", "-p", str(_params_file(tmp_path, {})), "-S", override)
    assert problem in message


def test_reversing_a_marker_that_is_switched_off_is_refused(tmp_path):
    path = _params_file(tmp_path, {"synthetic": {"marker_strength": None}})
    message = _cli_error("split", "-p", str(path))
    assert "reverses the marker cue, but synthetic.marker_strength is null" in message

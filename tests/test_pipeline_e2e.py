"""The whole pipeline as a user runs it: a git clone, `dvc repro`, MLflow, the registry, `pull`.

One shrunken embedded default (same stages, fewer pairs and steps) is run once per
session in a temporary git repository (tests/e2e_project.py); the tests below read what it produced.
What a change of anchor.lambda re-runs on this project (plan, the two anchor students and what reads
them; never `reference` or another student) is asserted stage by stage by a real one-point sweep
at the end, which runs on a copy of it (several points, stopped and resumed, are tested on a
trivial pipeline in test_sweep_executors.py: each point here costs about 160 s on a 2-core machine).
`make test` runs pytest-xdist with `--dist loadfile`, which keeps a file on one worker; this file
is started first (tests/conftest.py), so the other worker runs the rest meanwhile. The browser test of
the MLflow UI reads the same pipeline from test_pipeline_ui.py, on the other worker."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e_project import (
    SEEDS,
    SMALL,
    STUDENTS,
    best_of_n_stages,
    copy_reproduced,
    per_method,
    project,
    reproduced,
)
from e2e_project import ran_stages as _ran_stages
from e2e_project import run as _run


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    return reproduced(tmp_path_factory)


@pytest.mark.slow
def test_repro_runs_every_stage_and_writes_the_report(pipeline):
    root = pipeline["root"]
    ran = _ran_stages(pipeline["first"])
    expected = {"prepare", "split", "backbone", "plan", "reference", "seam_principles", "probe", "report"}
    expected |= {"promote"}
    expected |= {f"{stage}@{k}" for stage in ("teacher", "label", "evaluate_teacher") for k in SEEDS}
    expected |= per_method(("targets", "train", "evaluate"), STUDENTS)
    targets = yaml.safe_load((root / "params.yaml").read_text())["data"]["targets"]
    expected |= best_of_n_stages(targets)
    assert expected <= ran
    summary = (root / "reports" / "summary.md").read_text()
    for name in ("teacher", *STUDENTS, "syn_help_instruct", "syn_help_chat", "synthetic"):
        assert name in summary
    assert "## Best-of-n against a gold judge" in summary
    assert "## Shortcut cues and what the frozen strong base exposes" in summary
    assert summary.startswith("# prefshift results\n\n## Answer\n")  # the answer comes first
    assert "| anchor_last − naive | syn_help_chat |" in summary
    assert "Verdict: no verdict from one seed" in summary and " agree: " not in summary
    assert "## Across seeds" in summary and f"## Main table (seed {SEEDS[0]})" in summary
    headline = json.loads((root / "reports" / "metrics.json").read_text())
    assert set(STUDENTS) <= set(json.dumps(headline).replace('"', " ").split())
    assert sorted(p.name for p in (root / "reports" / "figures").glob("*.png"))


@pytest.mark.slow
def test_anchor_students_read_the_one_shared_reference(pipeline):
    """`reference` stores the union of the anchor students' layers once; each student reads it
    (route "shared") and runs no forward pass of the reference model itself."""
    from prefshift.methods.layers import anchor_layers

    root = pipeline["root"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    num_layers, fractions = params["backbone"]["strong"]["num_layers"], params["anchor"]["mid_fractions"]
    layers = sorted({n for kind in ("last", "mid") for n in anchor_layers(kind, num_layers, fractions)})
    assert layers != [num_layers], "anchor_mid adds layers of its own: the store is their union"
    manifest = json.loads((root / "data" / "reference" / "manifest.json").read_text())
    assert manifest["stored"] and manifest["layers"] == layers
    for method in ("anchor_last", "anchor_mid"):
        log = json.loads((root / "reports" / "train" / method / "seed-0.json").read_text())
        assert log["reference"]["route"] == "shared" and log["reference"]["forward_rows"] == 0, method


@pytest.mark.slow
def test_second_repro_runs_only_the_inputs_stage(pipeline):
    # `inputs` always runs (it hashes the local files params name) and rewrites identical bytes.
    output = _run(["dvc", "repro"], pipeline["root"], pipeline["env"])
    assert _ran_stages(output) == {"inputs"}


@pytest.mark.slow
def test_a_clone_without_dvcs_gitignore_files_restores_every_stage(tmp_path_factory):
    """DVC's .gitignore files inside output directories are not part of any dep's hash.

    DVC writes one into each directory that holds an output (models/teacher/.gitignore lists the
    seeds), and several stages depend on such a directory. core.autostage stages these files only
    when a command ends, so a `dvc repro` that was interrupted and resumed leaves them out of the
    commit a sweep clones; every point then re-ran the teacher's target scoring and every evaluate.
    """
    root, env = copy_reproduced(tmp_path_factory, "without-gitignores")
    written = [p for top in ("data", "models", "reports") for p in (root / top).rglob(".gitignore")]
    assert root / "models" / "teacher" / ".gitignore" in written
    for path in written:
        path.unlink()
    status = json.loads(_run(["dvc", "status", "--json"], root, env))
    assert set(status) <= {"inputs"}, status  # `inputs` is always_changed


@pytest.mark.slow
def test_every_student_has_an_mlflow_run_with_metrics_and_lineage(pipeline):
    from mlflow import MlflowClient

    client = MlflowClient(pipeline["env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("prefshift")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    evaluations = {r.info.run_name: r for r in runs if r.data.tags.get("stage") == "evaluate"}
    assert set(evaluations) == {f"evaluate@{m}-{k}" for m in STUDENTS for k in SEEDS}
    for run in evaluations.values():
        assert {"wrg", "mean_aog", "mean_nts"} <= set(run.data.metrics)
        assert run.data.tags["git.commit"] and run.data.tags["prefshift.pipeline_run_id"]
        assert any(key.startswith("dvc.dep.") for key in run.data.tags)
    trainings = {r.info.run_name: r for r in runs if r.data.tags.get("stage") == "train"}
    assert set(trainings) == {f"train@{m}-{k}" for m in STUDENTS for k in SEEDS}
    assert {trainings[f"train@naive-{k}"].data.tags["seed"] for k in SEEDS} == {str(k) for k in SEEDS}
    import torch  # what the numbers were computed on: metrics match across runs on one machine only

    for run in [*trainings.values(), *evaluations.values()]:
        assert run.data.tags["host.cpu"] and run.data.tags["host.machine"]
    for run in trainings.values():
        assert run.data.tags["torch.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert run.data.tags["torch.version"] == torch.__version__
        assert run.data.tags["prefshift.pair_forward"] == "shared_prefix"  # tiny Llama decoders
    assert any(r.data.tags.get("stage") == "teacher" for r in runs)
    # One DVC stage per split scores every proxy, and each model still gets its own MLflow run.
    best_of_n = {r.info.run_name: r for r in runs if r.data.tags.get("stage") == "downstream"}
    assert set(best_of_n) == {f"downstream@{m}-{k}" for m in ("teacher", *STUDENTS) for k in SEEDS}
    assert {r.data.tags["dvc.stage"] for r in best_of_n.values()} == {"downstream"}
    on_targets = [r for r in runs if r.data.tags.get("stage") == "downstream_target"]
    targets = yaml.safe_load((pipeline["root"] / "params.yaml").read_text())["data"]["targets"]
    assert {r.data.tags["dvc.stage"] for r in on_targets} == {f"downstream_target@{t}" for t in targets}
    assert len(on_targets) == len(targets) * len(best_of_n)
    history = client.get_metric_history(trainings["train@anchor_last-0"].info.run_id, "train/loss")
    assert len({m.step for m in history}) > 1, "training curves are logged per step"
    pipelines = {r.data.tags.get("prefshift.pipeline_run_id") for r in runs}
    assert len(pipelines - {None}) == 1, "one dvc repro must share one pipeline run id"


@pytest.mark.slow
def test_champion_pulls_into_plain_transformers_with_identical_rewards(pipeline, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from prefshift.config.params import load_params
    from prefshift.core.paths import Layout
    from prefshift.data.schema import read_pairs
    from prefshift.engine.scoring import load_for_scoring, score_pairs

    root, env = pipeline["root"], pipeline["env"]
    promotion = json.loads((root / "reports" / "promotion.json").read_text())
    assert list(promotion["aliases"]).count("champion") == 1
    out = tmp_path / "champion"
    _run(["prefshift", "pull", "models:/prefshift-reward@champion", "--out", str(out)], root, env)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)

    params = load_params(root / "params.yaml")
    params = params.model_copy(update={"encode": params.encode.model_copy(update={"max_length": 4096})})
    pairs = read_pairs(Layout(root).split("id_test"))[:8]
    ours = score_pairs(*load_for_scoring(out, params), pairs, params).set_index("pair_id")
    for pair in pairs:
        rewards = []
        for response in (pair.chosen, pair.rejected):  # rendered and tokenised the way TRL's reward path does
            text = tokenizer.apply_chat_template(
                [*pair.prompt, {"role": "assistant", "content": response}], tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.inference_mode():
                rewards.append(model(input_ids=ids).logits[0, 0].item())
        assert rewards[0] - rewards[1] == pytest.approx(ours.loc[pair.pair_id, "delta"], abs=1e-4)
    config = json.loads((out / "config.json").read_text())
    assert config["std"] > 0 and math.isfinite(config["mean"])


def _stages(root: Path, env: dict[str, str]) -> set[str]:
    return {
        line.split()[0] for line in _run(["dvc", "stage", "list"], root, env).splitlines() if line.strip()
    }


def test_methods_is_the_pipeline(tmp_path_factory):
    """methods [naive, anchor_last] and seeds [0, 2]: no other method has a stage, each seed has its
    own teacher and labels (stages named by the seed's value), each method one stage for every
    seed (`--all-seeds`, re-run when `seeds` changes), and `dvc repro` on the fresh clone
    plans exactly those stages (real DVC. `--dry --force`: in a fresh clone every stage has changed
    anyway, and DVC 3's dry run cannot hash the inputs of a stage whose upstream never ran). What
    the stages do is shown by `pipeline` above and, without a ceiling, by test_downstream and
    test_team_mlflow on the same tiny project."""
    from tiny_project import TINY

    root, env = project(
        tmp_path_factory.mktemp("two-methods"),
        {**TINY, "seeds": [0, 2], "promote": SMALL["promote"]},
        tmp_path_factory,
    )
    method_stages = per_method(("targets", "train", "evaluate"), ("naive", "anchor_last"))
    targets = yaml.safe_load((root / "params.yaml").read_text())["data"]["targets"]
    for target in targets:  # each target is prepared, split and scored by stages of its own
        method_stages |= {
            f"{stage}@{target}" for stage in ("prepare_target", "split_target", "score_teacher")
        }
        method_stages |= {f"score_target@{m}-{target}" for m in ("naive", "anchor_last")}
    expected = {
        "prepare",
        "split",
        "backbone",
        "teacher@0",
        "teacher@2",
        "label@0",
        "label@2",
        "evaluate_teacher@0",
        "evaluate_teacher@2",
        "plan",
        "reference",
        "seam_principles",  # runs, and writes an empty cache, when seam is not listed
        "probe",
        "report",
    }
    expected |= {"inputs", "promote"}
    expected |= best_of_n_stages(targets)  # the judge needs no ceiling
    assert _stages(root, env) == expected | method_stages
    assert _ran_stages(_run(["dvc", "repro", "--dry", "--force"], root, env)) == expected | method_stages
    assert not (root / "dvc.lock").exists() and not (root / "data").exists(), "--dry runs nothing"


@pytest.fixture(scope="module")
def sweep_project(tmp_path_factory):
    """The shrunken embedded default reproduced by `dvc repro` (tests/e2e_project.py), copied as it
    was right after that run, and NOT committed.

    That is a fresh clone after `make repro`: dvc.lock staged (core.autostage), the metrics
    files untracked, the state in which experiments used to come out without numbers. The copy
    has an empty MLflow database of its own, so the runs in it are the sweep's.
    """
    root, env = copy_reproduced(tmp_path_factory, "sweep")
    # MLflow's telemetry thread edits os.environ while tracking.py iterates it (KeyError).
    return root, {**env, "MLFLOW_DISABLE_TELEMETRY": "true"}


def _json(args: list[str], root: Path, env: dict[str, str]):
    """stdout of a DVC --json command, parsed (its warnings go to stderr)."""
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return json.loads(done.stdout)


def _show_rows(root: Path, env: dict[str, str]) -> dict[str, dict]:
    """Each experiment's rev and {metrics path: data}, by name, as `dvc exp show --json` lists them."""
    rows = {}
    for baseline in _json(["dvc", "exp", "show", "--json"], root, env):
        for exp in baseline.get("experiments") or []:
            rev = exp["revs"][0]
            metrics = (rev.get("data") or {}).get("metrics") or {}
            rows[exp.get("name") or rev["name"]] = {
                "rev": rev["rev"],
                "metrics": {path: entry.get("data") for path, entry in metrics.items()},
            }
    return rows


def _baseline_workflow() -> list[str]:
    """The commands of docs/sweeps.md's baseline workflow, as the page gives them."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "sweeps.md").read_text()
    block = page.split("### The baseline workflow", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


@pytest.mark.slow
def test_the_documented_lambda_sweep_runs_experiments_that_carry_their_metrics(sweep_project):
    """docs/sweeps.md's workflow, verbatim, on the reproduced project: before, committing the
    baseline as the page says made the sweep stop with a StopIteration traceback."""
    root, env = sweep_project
    before = (root / "params.yaml").read_bytes()
    commit, sweep = _baseline_workflow()
    assert sweep == "prefshift sweep -S anchor.lambda=0.5,2"
    _run(["bash", "-c", commit], root, env)
    output = _run(["bash", "-c", sweep], root, env)

    assert (root / "params.yaml").read_bytes() == before
    # What a λ change re-runs, in each experiment (its echoed task log): plan and the two anchor
    # students with what reads them (downstream scores every proxy in one stage); the shared
    # `reference`, the judge and its gold scores (they read no student) and the other four
    # students stay cached.
    anchor_stages = per_method(("train", "evaluate"), ("anchor_last", "anchor_mid"))
    targets = yaml.safe_load(before)["data"]["targets"]
    anchor_stages |= {f"score_target@{m}-{t}" for m in ("anchor_last", "anchor_mid") for t in targets}
    per_point = {"inputs", "plan", "downstream", "report"} | anchor_stages
    per_point |= {f"downstream_target@{t}" for t in targets}  # best-of-n is scored per split
    logs = output.split("--- experiment ")[1:]
    assert len(logs) == 2
    for log in logs:
        ran = [line for line in log.splitlines() if line.startswith("Running stage '")]
        assert _ran_stages(log) == per_point and len(ran) == len(per_point), log.splitlines()[0]

    name = "sweep-anchor.lambda-0.5"
    baseline = yaml.safe_load(before)["anchor"]["lambda"]
    assert baseline not in (0.5, 2)
    row = _show_rows(root, env)[name]
    own = [
        f"reports/metrics/{m}/seed-{k}.json" for k in SEEDS for m in ("anchor_last", "ceiling")
    ]  # ceiling: not rerun
    for path, block in (
        *((path, row["metrics"][path]) for path in own),
        ("reports/metrics.json", row["metrics"]["reports/metrics.json"]["anchor_last"]),
    ):
        assert all(isinstance(block[k], float) for k in ("wrg", "mean_aog", "mean_nts")), path
    params = yaml.safe_load(_run(["git", "show", f"{row['rev']}:params.yaml"], root, env))
    assert params["anchor"]["lambda"] == 0.5

    # Against the workspace (the baseline the sweep started from): what a user compares first.
    diff = _json(["dvc", "exp", "diff", name, "--all", "--json"], root, env)
    assert set(diff["metrics"]["reports/metrics/anchor_last/seed-0.json"]) >= {"wrg", "mean_aog", "mean_nts"}
    assert {k: v for k, v in diff["params"]["params.yaml"]["anchor.lambda"].items() if k != "diff"} == {
        "old": 0.5,
        "new": baseline,
    }
    assert name in _run(["dvc", "exp", "show", "--only-changed"], root, env)
    plots = _json(["dvc", "plots", "diff", name, "--json"], root, env)
    for plot in ("reports/plots/training/anchor_last.csv", "reports/plots/drift/anchor_last.csv"):
        assert {r for p in plots["data"][plot] for r in p["revisions"]} == {name, "workspace"}, plot
    assert not plots.get("errors")

    files = sorted(p.name for p in (root / "reports" / "sweeps").glob("*.json"))
    methods, lambdas = ("anchor_last", "anchor_mid"), ("0.5", "2")  # the sweep's default --methods
    assert files == sorted(
        f"{m}__anchor.lambda={v}__seed={k}.json" for m in methods for v in lambdas for k in SEEDS
    )
    result = json.loads((root / "reports" / "sweeps" / files[0]).read_text())
    assert result["sweep"] == {"anchor.lambda": 0.5, "seed": 0} and result["method"] == "anchor_last"
    assert result["wrg"] == row["metrics"]["reports/metrics/anchor_last/seed-0.json"]["wrg"]
    workspace = json.loads((root / "reports" / "metrics" / "anchor_last" / "seed-0.json").read_text())
    assert result["split_version"] == workspace["split_version"]

    summary = (root / "reports" / "summary.md").read_text()
    table = summary.split("### anchor.lambda", 1)[1].split("\n\n")[1]
    assert [line.split(" | ")[1] for line in table.splitlines()[2:]] == ["0.5", "2", "0.5", "2"]
    assert (root / "reports" / "figures" / "lambda_ablation.png").exists()

    # The same sweep again reruns nothing, as the page says: the records the first one filed in
    # reports/sweeps/ need no commit (committed, they made a new baseline, and every point ran again).
    again = _run(["bash", "-c", sweep], root, env)
    assert again.count("is on this baseline already") == 2 and "Running stage" not in again, again

    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("prefshift")
    runs = client.search_runs([experiment.experiment_id], "tags.method = 'anchor_last'", max_results=100)
    stages = ("train", "evaluate", "downstream", "downstream_target")
    lambdas = {stage: set() for stage in stages}
    for r in runs:
        lambdas[r.data.tags["stage"]].add(float(r.data.params["anchor.lambda"]))
    assert lambdas == {stage: {0.5, 2.0} for stage in stages}  # its own db

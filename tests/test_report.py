"""The report renders from fixture metric files; evaluate and report refuse inputs they cannot compare."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prefshift.config.params import Params
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.schema import make_pair, write_pairs
from prefshift.pipeline.heldout_scores import write_scores
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages import evaluate, report

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
TARGETS = ["syn_help_instruct", "syn_help_chat"]
PRESENT = ["naive", "confidence", "anchor_last", "anchor_mid", "ceiling"]


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("regenerate_fixtures", FIXTURES / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _params(seeds=(0, 1)) -> Params:
    return Params.model_validate(
        {"seeds": list(seeds), "data": {"targets": TARGETS}, "evaluate": {"bootstrap": 200}}
    )


@pytest.fixture()
def layout(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path, seed=0)
    for sub in ("metrics", "train", "sweeps", "downstream"):
        shutil.copytree(FIXTURES / sub, tmp_path / "reports" / sub)
    _regenerate_module().write_score_files(layout)
    return layout


def test_fixtures_are_current():
    module = _regenerate_module()
    for rel, payload in module.build().items():
        assert (FIXTURES / rel).read_text(encoding="utf-8") == module.dump(payload), (
            f"{rel} is stale: run python tests/fixtures/metrics/regenerate.py"
        )


def test_report_renders_every_method_and_target(layout: Layout):
    summary = report.run(_params(), layout)
    text = layout.summary.read_text(encoding="utf-8")
    assert "Synthetic demonstration" in text
    main = text.split("## Main table", 1)[1].split("##", 1)[0]
    for name in ["teacher", *PRESENT]:
        assert f"| {name} |" in main
    assert "| seam |" not in main
    for target in TARGETS:
        assert f"{target} acc" in main and f"{target} NTS" in main
    naive = json.loads((layout.root / "reports" / "metrics" / "naive" / "seed-0.json").read_text())
    wrg = naive["wrg"]
    lo, hi = naive["ci"]["wrg"]
    assert f"| {wrg:.1f} [{lo:.1f}, {hi:.1f}] |" in main
    # Diagnostics, drift, seeds and the lambda ablation are all present.
    assert "r(Δ, Δlen)" in text and "Best-of-n" in text
    assert "## Representation drift" in text and "layer_3" in text
    across = text.split("## Across seeds", 1)[1].split("##", 1)[0]
    assert "| teacher | 2 |" in across and "| naive | 2 |" in across
    assert f"0: {wrg:.1f} [{lo:.1f}, {hi:.1f}]; 1: " in across  # each seed's WRG with its interval
    assert "### anchor.lambda" in text and "| anchor_last | 0.01 | 2 |" in text
    mechanism = text.split("## Staying close and OOD accuracy", 1)[1].split("##", 1)[0]
    assert "| anchor_last | 0 | 0.9900 |" in mechanism and "| naive | 1 | 0.9500 |" in mechanism
    assert "One point per seed (2 seeds)" in mechanism
    alpha = text.split("## WiSE-FT: accuracy against α", 1)[1].split("##", 1)[0]
    assert "naive: α = 0.5, chosen on id_validation" in alpha and "| id_test | 50.0 | 60.5 | 60.0 |" in alpha
    # each target's row, from what score-target recorded on it (training reads no target)
    assert (
        f"| {TARGETS[0]} | 50.0 | 55.0 | 52.0 |" in alpha
        and f"| {TARGETS[1]} | 50.0 | 56.0 | 51.0 |" in alpha
    )
    for png in ("id_vs_ood", "gains", "training", "drift", "lambda_ablation", "mechanism", "alpha_naive"):
        assert (layout.figures / f"{png}.png").stat().st_size > 1000
        assert f"(figures/{png}.png)" in text
    # DVC metrics file: headline numbers for the teacher and each method.
    dvc = json.loads(layout.metrics_summary.read_text())
    assert set(dvc) == {"split_version", "seeds", "teacher", "across_seeds", *PRESENT}
    assert dvc["seeds"] == [0, 1] and dvc["across_seeds"]["naive"]["wrg"]["n"] == 2
    assert dvc["naive"]["wrg"] == pytest.approx(wrg)
    assert set(dvc["naive"]["targets"]) == set(TARGETS)
    assert summary == dvc
    # DVC plot series.
    drift = pd.read_csv(layout.plots_dir / "drift" / "anchor_last.csv")
    assert list(drift.columns) == ["step", "mean_cosine", "layer_0", "layer_1", "layer_2", "layer_3"]
    training = pd.read_csv(layout.plots_dir / "training" / "teacher.csv")
    assert list(training.columns) == ["step", "loss", "acc", "lr"]
    acc = pd.read_csv(layout.plots_dir / "accuracy.csv")
    assert set(acc["model"]) == {"teacher", *PRESENT} and set(acc["split"]) == {"id_test", *TARGETS}
    lam = pd.read_csv(layout.plots_dir / "lambda.csv")
    assert sorted(lam["lambda"]) == [1e-4, 1e-2, 1.0] and set(lam["seeds"]) == {2}


def test_a_sweep_over_methods_only_adds_no_ablation_table(layout: Layout):
    """`-S seed=1 -S methods=[naive,anchor_last]` trains two students the same way as the full list."""
    doc = json.loads(layout.for_seed(1).metrics("naive").read_text())
    write = layout.sweeps_dir / "naive-seed1.json"
    write.write_text(json.dumps({**doc, "sweep": {"seed": 1, "methods": ["naive", "anchor_last"]}}))
    assert "methods" not in report.ablation_tables(report.load_sweeps(layout))


def test_seed_replicates_bring_their_own_split_but_one_per_seed(layout: Layout):
    """A sweep over `seed` reshuffles the split, so its version differs from the main run's by design."""
    for method in ("naive", "anchor_last"):
        doc = json.loads(layout.for_seed(1).metrics(method).read_text())
        doc.update(split_version="seed1-split", sweep={"seed": 1})
        (layout.sweeps_dir / f"{method}-seed1.json").write_text(json.dumps(doc))
    report.run(_params(), layout)
    path = layout.sweeps_dir / "naive-seed1.json"
    doc = json.loads(path.read_text())
    doc["split_version"] = "another-split"
    path.write_text(json.dumps(doc))
    with pytest.raises(PrefshiftError, match="seed 1's replicates come from different split versions"):
        report.run(_params(), layout)


def test_paired_comparisons_agree_with_the_metrics_files_of_every_seed(layout: Layout):
    from prefshift.pipeline.stages import report_comparisons

    runs = report.load_runs(_params(), layout)
    rows = report_comparisons.compare(_params(), layout, PRESENT)
    cell = {(r["a"], r["b"], r["split"], r["metric"]): r for r in rows}
    target = "syn_help_instruct"
    for key in [("anchor_last", "teacher", "syn_help_chat", "acc"), ("anchor_last", "naive", target, "acc")]:
        a, b, split, _ = key
        per_seed = []
        for docs in runs.values():  # each seed's difference is its metrics files' difference
            baseline = docs[a]["teacher"] if b == "teacher" else docs[b]
            left, right = docs[a]["targets"][split]["acc"], baseline["targets"][split]["acc"]
            per_seed.append(left - right)
        result = cell[key]
        assert result["seeds"]["per_seed"] == pytest.approx(per_seed, abs=1e-3)
        assert result["diff"] == pytest.approx(np.mean(per_seed), abs=1e-3)
        assert result["seed_ids"] == [0, 1] and result["verdict"].count("2 seeds, ") == 1
        lo, hi = result["ci"]
        assert lo < result["diff"] < hi and (hi - lo) > (result["pairs_ci"][1] - result["pairs_ci"][0]) / 2
    # One seed: the pairs interval is evaluate's own bootstrap, and there is no verdict.
    one = report_comparisons.compare(_params(seeds=[0]), layout, PRESENT)
    vs_teacher = next(
        r
        for r in one
        if (r["a"], r["b"], r["split"], r["metric"]) == ("anchor_last", "teacher", "syn_help_chat", "acc")
    )
    anchor = runs[0]["anchor_last"]["targets"]["syn_help_chat"]
    assert vs_teacher["diff"] == pytest.approx(anchor["aog"], abs=1e-3)
    assert vs_teacher["ci"] == pytest.approx(anchor["ci"]["aog"], abs=1e-3)
    assert all(r["verdict"].endswith("one seed: no verdict") for r in one)
    assert {r["a"] for r in rows} == set(PRESENT) and ("naive", "naive", target, "acc") not in cell

    # Each unordered pair once: anchor_last − naive, never also naive − anchor_last.
    assert ("naive", "anchor_last", target, "acc") not in cell
    unordered = [(frozenset((r["a"], r["b"])), r["split"], r["metric"]) for r in rows]
    assert len(unordered) == len(set(unordered))
    # NTS rows only where NTS differs from accuracy on some seed.
    for r in rows:
        if r["metric"] == "nts":
            acc = cell[(r["a"], r["b"], r["split"], "acc")]["seeds"]["per_seed"]
            assert any(abs(x - y) > 1e-9 for x, y in zip(r["seeds"]["per_seed"], acc, strict=True))
    # Holm over the answer family: methods against naive and anchor_last on the OOD targets.
    family = [r for r in rows if r["holm_family"]]
    assert {r["b"] for r in family} == {"naive", "anchor_last"} and "ceiling" not in {r["a"] for r in family}
    assert {r["split"] for r in family} == set(TARGETS) and {r["metric"] for r in family} == {"acc"}
    assert all(r["holm_family"] == len(family) and r["p_holm"] >= r["p"] for r in family)

    report.run(_params(), layout)
    text = layout.summary.read_text(encoding="utf-8")
    answer = text.split("## Answer", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Answer") < text.index("## Setting") < text.index("## Across seeds")
    row = cell[("anchor_last", "naive", target, "acc")]
    assert f"| anchor_last − naive | {target} | {row['diff']:+.1f} " in answer
    assert f"not distinguishable (could have detected ≥ {row['mde']:.1f} pp)" in answer
    assert "Holm), every seed" in answer and f"over the {len(family)} comparisons" in answer
    assert "**Below chance**" in answer and "confidence on syn_help_chat" in answer
    assert "## Paired comparisons" in text and "[comparisons.csv](comparisons.csv)" in text
    table = pd.read_csv(layout.summary.parent / "comparisons.csv")
    assert len(table) == len(rows) and not table.duplicated(["a", "b", "split", "metric"]).any()
    ordered_pairs = set(zip(table["a"], table["b"], strict=True))
    assert ordered_pairs.isdisjoint({(b, a) for a, b in ordered_pairs})
    assert "Do the pairwise metrics predict the pick?" in text and "Kendall" in text
    best = text.split("## Best-of-n against a gold judge", 1)[1].split("## ", 1)[0]
    assert "the judge `trained judge" in best and "| ceiling | id_test | 12 | " in best
    for png in ("best_of_n", "best_of_n_rule"):
        assert (layout.figures / f"{png}.png").stat().st_size > 1000 and f"(figures/{png}.png)" in text


def test_the_answer_fits_the_first_screen_and_pgr_needs_a_ceiling_above_the_teacher(layout: Layout):
    path = layout.metrics("ceiling")
    ceiling = json.loads(path.read_text())
    ceiling["ci"]["mean_aog"] = [-1.0, ceiling["mean_aog"] + 1.0]  # the ceiling ≈ the teacher OOD
    path.write_text(json.dumps(ceiling))
    report.run(_params(), layout)
    lines = layout.summary.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# prefshift results" and lines[2] == "## Answer"
    assert lines.index("## Setting") < 40  # table, chance flags and all, within the first 40 lines
    main = lines[lines.index("## Main table (seed 0)") :]
    naive = next(line for line in main if line.startswith("| naive |")).split(" | ")
    assert naive[-1] == "— (ceiling ≈ teacher) |" and naive[-2] != "—"  # PGR ID stays: WRG's interval > 0


def test_report_refuses_best_of_n_from_other_splits(layout: Layout):
    path = layout.for_split("id_test").downstream("naive")
    path.write_text(json.dumps({**json.loads(path.read_text()), "split_version": "other"}))
    with pytest.raises(report.ReportError, match="re-run `prefshift downstream --split id_test`"):
        report.run(_params(), layout)


def test_report_refuses_an_alpha_curve_without_a_listed_targets_row(layout: Layout):
    """An α curve's OOD rows come from score-target, one per target: a missing one names that stage."""
    from prefshift.pipeline.stages.score_target import on_target_path

    on_target_path(layout, "naive", TARGETS[1]).unlink()
    with pytest.raises(report.ReportError, match=f"score-target --model naive --target {TARGETS[1]}"):
        report.run(_params(), layout)


def test_report_refuses_best_of_n_missing_on_a_listed_target(layout: Layout):
    """Each split's best-of-n is its own stage: a model with curves on id_test but none on a listed
    target names the stage to run, rather than a section silently short of that target's rows."""
    target = TARGETS[1]
    layout.for_split(target).downstream("naive").unlink()
    with pytest.raises(report.ReportError, match=f"run `prefshift downstream --split {target}`"):
        report.run(_params(), layout)


def test_headline_carries_length_shortcut_and_null_pgr():
    naive = json.loads((FIXTURES / "metrics" / "naive" / "seed-0.json").read_text())
    head = evaluate.headline(naive, TARGETS)
    shortcut = naive["length_shortcut"]["id_test"]
    assert head["length_r_id"] == shortcut["pearson_r"]
    assert head["acc_chosen_longer_id"] == shortcut["chosen_longer"]["acc"]
    assert head["targets"]["syn_help_chat"]["nts"] == naive["targets"]["syn_help_chat"]["nts"]
    teacher = evaluate.headline(naive["teacher"], TARGETS, student=False)
    assert "wrg" not in teacher and teacher["id_acc"] == naive["teacher"]["id"]["acc"]


def test_report_refuses_mixed_split_versions(layout: Layout):
    path = layout.metrics("naive")
    data = json.loads(path.read_text())
    data["split_version"] = "other"
    path.write_text(json.dumps(data))
    with pytest.raises(report.ReportError, match="different split versions"):
        report.run(_params(), layout)


def test_report_refuses_metrics_against_different_teacher_scores(layout: Layout):
    path = layout.metrics("ceiling")
    data = json.loads(path.read_text())
    data["teacher"]["id"]["acc"] += 1.0
    path.write_text(json.dumps(data))
    with pytest.raises(report.ReportError, match="teacher was re-labelled"):
        report.run(_params(), layout)


def test_report_without_metrics_says_what_to_run(tmp_path: Path):
    with pytest.raises(report.ReportError, match="prefshift evaluate --method"):
        report.run(_params(), Layout(tmp_path, seed=0))


def _splits(layout: Layout, sizes: dict[str, int], version: str = "v1") -> None:
    for split, n in sizes.items():
        pairs = [
            make_pair(
                dataset=split,
                category="helpful",
                prompt=[{"role": "user", "content": f"q{i}"}],
                chosen=f"good {i}",
                rejected=f"bad {i}",
            )
            for i in range(n)
        ]
        write_pairs(layout.split(split), pairs)
    entry = {"version": version}
    source = {s: entry for s in sizes if s == "id_test"}
    layout.split_manifest.write_text(json.dumps({"version": version, "splits": source}))
    for target in (s for s in sizes if s != "id_test"):  # each target's manifest: its own version
        layout.target_manifest(target).write_text(json.dumps({"splits": {f"ood/{target}": entry}}))


def test_evaluate_without_teacher_scores_says_run_teacher(tmp_path: Path):
    layout = Layout(tmp_path, seed=0)
    _splits(layout, {"id_test": 3, **{t: 3 for t in TARGETS}})
    with pytest.raises(evaluate.EvaluateError, match="run `prefshift teacher`"):
        evaluate.run(_params(), layout, "naive")


def test_evaluate_names_an_empty_target(tmp_path: Path):
    layout = Layout(tmp_path, seed=0)
    _splits(layout, {"id_test": 3, TARGETS[0]: 3, TARGETS[1]: 0})
    with pytest.raises(evaluate.EvaluateError, match=f"split '{TARGETS[1]}' has zero pairs"):
        evaluate.run(_params(), layout, "naive")


def test_evaluate_refuses_scores_of_another_split_version(tmp_path: Path):
    layout = Layout(tmp_path, seed=0)
    _splits(layout, {"id_test": 2, **{t: 2 for t in TARGETS}}, version="new")
    frame = pd.DataFrame(
        {
            "pair_id": ["p1", "p2"],
            "delta": [1.0, -1.0],
            "gold": [1.0, 1.0],
            "len_chosen": [3, 4],
            "len_rejected": [4, 3],
        }
    )
    with output_set(layout.root, "prefshift teacher", directories=[layout.scores_dir("teacher")]) as out:
        write_scores(out.path(layout.scores("teacher", "id_test")), frame, "old")
    with pytest.raises(
        PrefshiftError, match="built from split version old of split 'id_test', now version new"
    ):
        evaluate.run(_params(), layout, "naive")

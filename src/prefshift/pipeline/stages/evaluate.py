"""`prefshift evaluate --method M`: compare a student's held-out scores with the teacher's and the ceiling's.

No model is loaded here: the training stages write each model's margins on the source's splits,
`prefshift score-target` its margins on each target (`prefshift.pipeline.heldout_scores`), and
everything is computed by `compute_metrics` from plain score frames, so the metrics are testable
and re-computable from files alone. Every score file carries the version of the split it scored,
and a model's train log the versions of the splits it was trained on; evaluation checks those and
nothing else, so a model is evaluated on a target that did not exist when it was trained. Every
comparison is made on identical pair sets, so numbers from different splits are never mixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from prefshift.config.params import LMSpec, Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import Group, Pair, read_groups, read_pairs
from prefshift.data.splits import load_manifest, split_entries
from prefshift.data.synthetic import CUE_META, CUES
from prefshift.pipeline.heldout_scores import read_skips, read_truncation
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages.evaluate_inputs import (
    EvaluateError,
    check_scores,
    check_trained_on,
    read_heldout,
    read_train_log,
    training_summary,
)
from prefshift.science import benchmark_targets, diagnostics, metrics


def _aligned(split: str, frames: Mapping[str, pd.DataFrame]) -> tuple[metrics.SplitCredits, dict[str, Any]]:
    """Credits of every model on the pairs all of them scored, and how many each one lacked.

    Scoring skips pairs whose response does not survive truncation, and weak and
    strong tokenizers may truncate differently, so models can miss a few pairs; those
    are left out of every model's accuracy (comparisons stay paired) and counted.
    """
    ids = {name: set(frame["pair_id"]) for name, frame in frames.items()}
    common = set.intersection(*ids.values())
    if not common:
        raise EvaluateError(
            f"split {split!r}: the {', '.join(frames)} scores share no pair; they come from different "
            f"split versions — re-run `dvc repro` (or `prefshift teacher` and `prefshift train`)"
        )
    order = [pid for pid in frames["student"]["pair_id"] if pid in common]
    credits = {
        name: metrics.credit(frame.set_index("pair_id")["delta"].reindex(order).to_numpy(dtype=float))
        for name, frame in frames.items()
    }
    union = set.union(*ids.values())
    coverage = {"compared": len(order), "missing": {name: len(union - got) for name, got in ids.items()}}
    return metrics.SplitCredits(**credits), coverage


def cue_sides(pairs: Mapping[str, Sequence[Pair]]) -> dict[str, dict[str, dict[str, str | None]]]:
    """split → cue → pair_id → the response carrying the cue, for every cue some pair of the split records."""
    out: dict[str, dict[str, dict[str, str | None]]] = {}
    for split, rows in pairs.items():
        for cue in CUES:
            sides = {p.pair_id: (p.meta or {}).get(CUE_META[cue]) for p in rows}
            if any(side is not None for side in sides.values()):
                out.setdefault(split, {})[cue] = sides
    return out


def model_diagnostics(
    scores: Mapping[str, pd.DataFrame],
    params: Params,
    group_scores: Mapping[str, pd.DataFrame] | None = None,
    gold_groups: Mapping[str, Sequence[Group]] | None = None,
    sides: Mapping[str, Mapping[str, Mapping[str, str | None]]] | None = None,
) -> dict[str, Any]:
    """ECE, length and cue shortcuts per split, and best-of-n per dataset whose groups were scored."""
    out: dict[str, Any] = {"ece": {}, "length_shortcut": {}, "cue_shortcut": {}, "best_of_n": {}}
    for split, frame in scores.items():
        out["ece"][split] = diagnostics.expected_calibration_error(
            frame["delta"], frame["gold"], params.evaluate.ece_bins
        )
        out["length_shortcut"][split] = diagnostics.length_shortcut(
            frame["delta"], frame["len_chosen"], frame["len_rejected"]
        )
        for cue, by_pair in (sides or {}).get(split, {}).items():
            out["cue_shortcut"].setdefault(split, {})[cue] = diagnostics.cue_reliance(
                frame["delta"], [by_pair.get(pid) for pid in frame["pair_id"]]
            )
    for dataset, frame in (group_scores or {}).items():
        gold = {g.group_id: g.scores for g in (gold_groups or {}).get(dataset, [])}
        missing = [gid for gid in frame["group_id"] if gid not in gold]
        if missing:
            raise EvaluateError(
                f"group scores of {dataset!r} name group {missing[0]!r}, absent from its split's groups "
                f"(another split version?)"
            )
        out["best_of_n"][dataset] = diagnostics.best_of_n(
            [list(r) for r in frame["rewards"]], [gold[gid] for gid in frame["group_id"]]
        )
    return out


def compute_metrics(
    student: Mapping[str, pd.DataFrame],
    teacher: Mapping[str, pd.DataFrame],
    ceiling: Mapping[str, pd.DataFrame] | None,
    params: Params,
    group_scores: Mapping[str, pd.DataFrame] | None = None,
    gold_groups: Mapping[str, Sequence[Group]] | None = None,
    teacher_group_scores: Mapping[str, pd.DataFrame] | None = None,
    sides: Mapping[str, Mapping[str, Mapping[str, str | None]]] | None = None,
) -> dict[str, Any]:
    """All metrics of one student from score frames keyed by split ("id_test" and each target).

    The teacher block carries the teacher's own accuracies (from the same bootstrap
    draws) and diagnostics, so the report's teacher row needs no further input.
    """
    targets = list(params.data.targets)
    splits = [metrics.ID_SPLIT, *targets]
    models = {"student": student, "teacher": teacher} | ({"ceiling": ceiling} if ceiling is not None else {})
    for name, frames in models.items():
        for split in splits:
            if split not in frames:
                raise EvaluateError(f"no {name} scores for split {split!r}")
            check_scores(frames[split], f"{name} scores of {split!r}")
            if len(frames[split]) == 0:
                raise EvaluateError(f"split {split!r} has zero scored pairs ({name}); check its split file")
    credits, coverage = {}, {}
    for split in splits:
        credits[split], coverage[split] = _aligned(
            split, {name: frames[split] for name, frames in models.items()}
        )
    result = metrics.paired_metrics(
        credits, targets, draws=params.evaluate.bootstrap, level=params.evaluate.ci, seed=params.seed
    )
    result["pairs"] = coverage
    result.update(
        model_diagnostics({s: student[s] for s in splits}, params, group_scores, gold_groups, sides)
    )
    result["teacher"].update(
        model_diagnostics({s: teacher[s] for s in splits}, params, teacher_group_scores, gold_groups, sides)
    )
    return result


def data_hashes(manifest: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of every split file the metrics were computed from, as the manifest records them."""
    return {name: entry["sha256"] for name, entry in sorted(manifest.get("splits", {}).items())}


def _describe(spec: LMSpec) -> str:
    if spec.name_or_path == "tiny":
        return (
            f"tiny Llama {spec.num_layers}x{spec.hidden_size} (pretrained here, {spec.pretrain_steps} steps)"
        )
    return spec.name_or_path + (f"@{spec.revision}" if spec.revision else "")


def setting(params: Params, sizes: Mapping[str, int]) -> dict[str, Any]:
    """What produced the numbers, copied into every metrics file and the summary header."""
    return {
        "category": params.data.category,
        "source": params.data.source,
        "targets": list(params.data.targets),
        "models": {"weak": _describe(params.backbone.weak), "strong": _describe(params.backbone.strong)},
        "sizes": dict(sizes),
        "seed": params.seed,
        "bootstrap": params.evaluate.bootstrap,
        "ci": params.evaluate.ci,
    }


def _train_sizes(manifest: Mapping[str, Any]) -> dict[str, int]:
    splits = manifest.get("splits", {})
    return {name: splits[name]["count"] for name in ("teacher_train", "student_train") if name in splits}


def metrics_document(
    result: Mapping[str, Any],
    *,
    method: str,
    manifest: Mapping[str, Any],
    params: Params,
    sizes: Mapping[str, int],
    training_log: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """reports/metrics/<method>/seed-<k>.json: compute_metrics' result plus provenance, rounded."""
    document = {
        **result,
        "method": method,
        "split_version": str(manifest["version"]),
        "data_hashes": data_hashes(manifest),
        "setting": setting(params, {**_train_sizes(manifest), **sizes}),
        "training": _without_timings(training_summary(training_log)),
    }
    return rounded(document)


def _without_timings(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """Wall time and peak memory vary run to run; the metrics file must not (same seed, same bytes)."""
    if summary is None:
        return None
    return {k: v for k, v in summary.items() if k not in ("wall_s", "peak_rss_mb")}


def rounded(tree: Any) -> Any:
    if isinstance(tree, float):
        return round(tree, 4)
    if isinstance(tree, Mapping):
        return {k: rounded(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [rounded(v) for v in tree]
    return tree


def headline(m: Mapping[str, Any], targets: Sequence[str], student: bool = True) -> dict[str, Any]:
    """Headline numbers of one model from its metrics document (or its `teacher` block, student=False).

    The DVC metrics file holds one of these per model and MLflow logs it for each
    evaluation, so the length correlation and calibration sit next to the accuracies.
    """
    out: dict[str, Any] = {
        "id_acc": m["id"]["acc"],
        "mean_acc_ood": m["mean_acc_ood"],
        "ece_id": m["ece"][metrics.ID_SPLIT],
        "length_r_id": m["length_shortcut"][metrics.ID_SPLIT]["pearson_r"],
        "acc_chosen_longer_id": m["length_shortcut"][metrics.ID_SPLIT]["chosen_longer"]["acc"],
        "acc_chosen_shorter_id": m["length_shortcut"][metrics.ID_SPLIT]["chosen_shorter"]["acc"],
        "targets": {
            t: {
                "acc": m["targets"][t]["acc"],
                "ece": m["ece"][t],
                "length_r": m["length_shortcut"][t]["pearson_r"],
            }
            for t in targets
        },
        "best_of_n": {ds: block["acc"] for ds, block in m.get("best_of_n", {}).items()},
        "cue_gap_id": {
            cue: block["gap"] for cue, block in m.get("cue_shortcut", {}).get(metrics.ID_SPLIT, {}).items()
        },
    }
    if student:
        out.update(
            wrg=m["wrg"],
            mean_aog=m["mean_aog"],
            mean_nts=m["mean_nts"],
            pgr_id=m["pgr_id"],
            pgr_ood=m["pgr_ood"],
        )
        for t in targets:
            out["targets"][t].update(aog=m["targets"][t]["aog"], nts=m["targets"][t]["nts"])
    if "benchmarks" in m:
        out["benchmarks"] = benchmark_targets.headline(m["benchmarks"])
    return out


def run(params: Params, layout: Layout, method: str) -> dict[str, Any]:
    manifest = load_manifest(layout)
    splits = [metrics.ID_SPLIT, *params.data.targets]
    pairs = {}
    for split in splits:
        pairs[split] = read_pairs(layout.split(split))
        if not pairs[split]:
            raise EvaluateError(f"{layout.split(split)}: split {split!r} has zero pairs; nothing to evaluate")
    ids = {split: {p.pair_id for p in pairs[split]} for split in splits}
    targets = params.data.targets
    check_trained_on(layout, "teacher", read_train_log(layout.train_log("teacher")))
    teacher = read_heldout(layout, "teacher", ids, targets)
    if not layout.student_dir(method).exists():
        raise EvaluateError(
            f"{layout.student_dir(method)}: no trained student; run `prefshift train --method {method}`"
        )
    check_trained_on(layout, method, read_train_log(layout.train_log(method)))
    student = read_heldout(layout, method, ids, targets)

    from prefshift.tracking import runs as tracking

    with (
        tracking.stage_run(params, layout, "evaluate", method) as logger,
        output_set(
            layout.root, f"prefshift evaluate --method {method}", files=[layout.metrics(method)]
        ) as out,
    ):
        document = _compare(params, layout, method, manifest, pairs, student, teacher)
        metrics.check_finite(document, str(layout.metrics(method)))
        write_json(out.path(layout.metrics(method)), document)
        logger.log_metrics(headline(document, params.data.targets))
        logger.log_artifact(out.path(layout.metrics(method)), "metrics")
    messages().print(closing_line(method, layout.metrics(method), document))
    return document


def closing_line(method: str, path: Path, document: Mapping[str, Any]) -> str:
    """What a successful evaluation wrote and its headline numbers, in one line (accuracy %, gains pp)."""
    return (
        f"evaluate {method}: {path} — ID {document['id']['acc']:.1f}%, mean OOD "
        f"{document['mean_acc_ood']:.1f}%, WRG {_signed(document['wrg'])}, "
        f"mean AOG {_signed(document['mean_aog'])}"
    )


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}"


def _group_scores(
    layout: Layout, model: str, datasets: Sequence[str], source: str
) -> dict[str, pd.DataFrame]:
    paths = {ds: layout.group_scores(model, ds, source) for ds in datasets}
    return {ds: pq.read_table(path).to_pandas() for ds, path in paths.items() if path.exists()}


def _compare(
    params: Params,
    layout: Layout,
    method: str,
    manifest: Mapping[str, Any],
    pairs: Mapping[str, list[Pair]],
    student: Mapping[str, pd.DataFrame],
    teacher: Mapping[str, pd.DataFrame],
) -> dict[str, Any]:
    """The metrics document of one student from its and the teacher's score files."""
    splits = list(pairs)
    datasets = [params.data.source, *params.data.targets]
    source = params.data.source
    group_files = {ds: layout.split_groups(ds, source) for ds in datasets}
    gold_groups = {ds: read_groups(path) for ds, path in group_files.items() if path.exists()}
    group_scores = _group_scores(layout, method, list(gold_groups), source)
    teacher_groups = _group_scores(layout, "teacher", list(gold_groups), source)
    # Students are compared with the ceiling in the report (metrics.with_ceiling): the pipeline
    # has a ceiling stage only when `methods` lists it, so no student's evaluation waits on one.
    ceiling = student if method == "ceiling" else None
    result = compute_metrics(
        student, teacher, ceiling, params, group_scores, gold_groups, teacher_groups, cue_sides(pairs)
    )
    official = benchmark_targets.benchmark_metrics(
        params,
        pairs,
        student,
        teacher,
        gold_groups,
        group_scores,
        teacher_groups,
        (result["id"]["acc"], result["teacher"]["id"]["acc"]),
    )
    if official is not None:
        result["benchmarks"], result["teacher"]["benchmarks"] = official
    targets = params.data.targets
    skips = read_skips(layout, method, targets)
    result["pairs"] = {
        s: {**result["pairs"][s], "skipped_by_scoring": skips.get(s, {}).get("skipped", {})} for s in splits
    }
    result["truncation"] = {
        "student": read_truncation(layout, method, targets),
        "teacher": read_truncation(layout, "teacher", targets),
    }
    return metrics_document(
        result,
        method=method,
        manifest={**manifest, "splits": split_entries(layout, targets)},
        params=params,
        sizes={s: len(pairs[s]) for s in splits},
        training_log=read_train_log(layout.train_log(method)),
    )

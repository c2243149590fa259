"""`prefshift report`: tables, figures and DVC metrics/plots across every evaluated method.

Inputs are only files other stages wrote: reports/metrics/<method>/seed-<k>.json for every seed
params list (the teacher row comes from their `teacher` block, computed on the same bootstrap
draws), the first seed's reports/train/<name>/seed-<k>.json for curves and drift, every seed's
per-pair scores for the paired comparisons, and optional sweep results in reports/sweeps/*.json
for the ablation tables. The across-seeds table and the paired verdicts use every seed; the
detail tables (main table, diagnostics, drift, curves) show the first seed and say so.

The summary opens with the answer (report_answer: each method against naive and anchor_last on
each target, with its MDE and the seeds a chosen effect needs), then the setting and the detail.
This module assembles; each section lives in its own module: report_inputs (reading and checking),
report_tables, report_ablations, report_figures, report_comparisons (also reports/comparisons.csv),
report_agreement, report_downstream, report_mechanism, report_truncation, report_probe.

Sweep file format (written by whatever drives a sweep, e.g. `dvc exp` + a copy):
a metrics JSON exactly as `prefshift evaluate` writes it, plus a top-level
`"sweep": {"<dotted param>": value, ...}` naming the params that differ from
params.yaml, e.g. {"anchor.lambda": 0.01} or {"anchor.lambda": 0.01, "seed": 2}.
Every key other than `seed` and `methods` gets an ablation table (rows: method x
value); runs that differ only in `seed` are replicates, shown as mean ± std across
seeds. A sweep whose keys are `seed` (and perhaps `methods`, which selects students
without changing any) is a seed replicate of the main run.

DVC plots written under reports/plots/ (all CSV with a header row):
- training/<name>.csv: step, loss, acc, lr (one file per trained model)
- drift/<method>.csv: step, mean_cosine, layer_<k>... (cosine to the frozen reference)
- accuracy.csv: model, split, acc, ci_low, ci_high (pp)
- lambda.csv (only with lambda sweeps): method, lambda, seeds, wrg, mean_aog, mean_nts, drift_cosine
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.core.atomic import write_json, write_text
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages import (
    report_agreement,
    report_answer,
    report_comparisons,
    report_downstream,
    report_mechanism,
    report_probe,
    report_truncation,
)
from prefshift.pipeline.stages.evaluate import headline
from prefshift.pipeline.stages.evaluate_inputs import read_train_log, training_summary
from prefshift.pipeline.stages.report_ablations import ABLATION_KEYS, ablation_tables, lambda_series
from prefshift.pipeline.stages.report_errors import ReportError
from prefshift.pipeline.stages.report_figures import write_figures, write_plots
from prefshift.pipeline.stages.report_format import models_of, ordered
from prefshift.pipeline.stages.report_inputs import (
    check_replicates,
    check_teachers,
    check_versions,
    load_runs,
    load_sweeps,
)
from prefshift.pipeline.stages.report_inputs import read_json as _read_json
from prefshift.pipeline.stages.report_tables import (
    diagnostics_tables,
    drift_table,
    header_section,
    main_table,
    seeds_table,
)
from prefshift.pipeline.sweep_points import ablation_keys, replicate_seed
from prefshift.science import benchmark_targets
from prefshift.science.metrics import ID_SPLIT, across_seeds

__all__ = ["ReportError", "_read_json", "ablation_tables", "load_runs", "load_sweeps", "run"]
"""What other modules and the tests reach through `report`: the stage, its inputs and its error."""


def render_summary(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]],
    sweeps: Sequence[Mapping[str, Any]],
    training: Mapping[str, Mapping[str, Any] | None],
    version: str,
    figures: Sequence[Path],
    layout: Layout,
    extra_sections: Sequence[str] = (),
    cue_section: str | None = None,
    answer: str | None = None,
) -> str:
    """The summary: the answer first (one screen), then the setting, then the detail."""
    metrics = next(iter(runs.values()))
    setting = next(iter(metrics.values()))["setting"]
    targets = setting["targets"]
    first = setting["seed"]
    parts = [
        "# prefshift results",
        *([answer] if answer else []),
        header_section(setting, version, ordered(metrics), list(runs)),
        f"## Across seeds\n\nMean ± std over seeds {', '.join(map(str, runs))} (accuracy in %, gains in "
        "pp), and each seed's WRG with its pairs interval. The paired comparisons below give intervals "
        "that span seeds and pairs.\n\n" + seeds_table(runs, ordered(metrics)),
        f"## Main table (seed {first})\n\nAccuracy in %, gains in pp, {round(setting['ci'] * 100)}% "
        "intervals over pairs in brackets. WRG = ID gain over the teacher; AOG = OOD gain per target; "
        "NTS = AOG minus the student's ID regression (if any).\n\n" + main_table(metrics, targets),
    ]
    official = benchmark_targets.summary_section(models_of(metrics))
    if official:
        parts.append(official)
    if cue_section:
        parts.append(cue_section)
    parts.append("## Diagnostics\n\n" + diagnostics_tables(metrics, [ID_SPLIT, *targets]))
    parts.append(
        "## Representation drift at the end of training\n\nMean cosine similarity between the "
        "student's and the frozen reference's hidden states on the probe batch (1 = no drift).\n\n"
        + drift_table(training)
    )
    if any(ablation_keys(run["sweep"]) for run in sweeps):
        parts.append(
            "## Ablations\n\nFrom reports/sweeps/*.json; mean ± std over runs that differ only in seed "
            "(the λ figure's error bars are the same std).\n\n" + ablation_tables(sweeps)
        )
    parts += list(extra_sections)
    parts.append(
        "## Figures\n\n"
        + "\n".join(f"![{p.stem}]({p.relative_to(layout.summary.parent).as_posix()})" for p in figures)
    )
    return "\n\n".join(parts) + "\n"


def beyond_accuracy(
    params: Params,
    layout: Layout,
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]],
    logs: Mapping[str, Mapping[str, Any]],
    version: str,
    figures_dir: Path,
    comparisons: Sequence[Mapping[str, Any]],
) -> tuple[list[str], list[Path]]:
    """DESIGN §10's sections past pairwise accuracy: paired comparisons across seeds, truncation,
    best-of-n and whether the pairwise metrics predict it, and the mechanism (drift against OOD
    accuracy per seed, WiSE-FT's α curve)."""
    metrics = next(iter(runs.values()))
    splits = [ID_SPLIT, *params.data.targets]
    sections = [
        report_comparisons.comparisons_section(comparisons, params.evaluate.ci),
        report_truncation.truncation_section(metrics, params.evaluate.warn_truncated_share),
    ]
    by_seed = report_downstream.load_downstream(layout, version, splits, params.methods, list(runs))
    docs = by_seed.get(params.seeds[0], {})  # the curves shown: the first seed's
    skip = report_downstream.load_skip(layout, version)
    sections.append(
        report_downstream.skipped_section(skip)
        if skip
        else report_downstream.best_of_n_section(
            docs, splits, report_downstream.load_judge(layout, params.data.targets)
        )
    )
    if by_seed and not skip:
        rows = report_agreement.agreement_rows(
            runs,
            by_seed,
            splits,
            draws=params.evaluate.bootstrap,
            level=params.evaluate.ci,
            seed=params.seed,
        )
        n_max = next(iter(docs.values())).get("n_max")
        sections.append(report_agreement.agreement_section(rows, n_max, params.evaluate.ci))
    figures = report_downstream.write_best_of_n_figures(docs, splits, figures_dir) if docs else []
    for section, written in (
        report_mechanism.mechanism_section(runs, figures_dir),
        report_mechanism.alpha_section(
            report_mechanism.with_target_rows(
                {m: log for m, log in logs.items() if m != "teacher"},
                layout.for_seed(params.seeds[0]),
                params.data.targets,
            ),
            figures_dir,
        ),
    ):
        sections.append(section)
        figures += written
    return [s for s in sections if s], figures


def run(params: Params, layout: Layout) -> dict[str, Any]:
    runs = load_runs(params, layout)
    sweeps = load_sweeps(layout)
    replicates = [s for s in sweeps if replicate_seed(s["sweep"]) is not None]
    version = check_versions(
        {
            **{str(layout.for_seed(k).metrics(m)): v for k, docs in runs.items() for m, v in docs.items()},
            **{s["_path"]: s for s in sweeps if s not in replicates},
        },
        layout,
    )
    check_replicates(replicates)
    check_teachers(runs, layout)
    metrics = runs[params.seeds[0]]
    detail = layout.for_seed(params.seeds[0])
    targets = next(iter(metrics.values()))["setting"]["targets"]
    logs = {n: log for n in ["teacher", *ordered(metrics)] if (log := read_train_log(detail.train_log(n)))}
    training = {m: training_summary(logs.get(m)) for m in ordered(metrics)}
    series = lambda_series(sweeps)
    comparisons = report_comparisons.compare(params, layout, ordered(metrics))
    answer = report_answer.answer_section(
        comparisons,
        runs,
        targets,
        level=params.evaluate.ci,
        effect=params.report.effect_pp,
        alphas=_chosen_alphas(params, layout, runs),
    )
    table = report_comparisons.table_path(layout)
    files = [layout.metrics_summary, layout.summary, table]
    directories = [layout.figures, layout.plots_dir]
    with output_set(layout.root, "prefshift report", files, directories, manifest=False) as out:
        figures_dir = out.path(layout.figures)
        staged = write_figures(layout, metrics, targets, logs, series, into=figures_dir)
        write_plots(layout, metrics, targets, logs, series, into=out.path(layout.plots_dir))
        extra_sections, extra_figures = beyond_accuracy(
            params, layout, runs, logs, version, figures_dir, comparisons
        )
        cues = report_probe.probe_section(params, report_probe.load_probe(layout, version))
        figures = [layout.figures / p.name for p in [*staged, *extra_figures]]
        summary = summary_metrics(runs, targets, version)
        write_json(out.path(layout.metrics_summary), summary)
        report_comparisons.write_table(comparisons, out.path(table))
        write_text(
            out.path(layout.summary),
            render_summary(runs, sweeps, training, version, figures, layout, extra_sections, cues, answer),
        )
    skips = {"best-of-n": report_downstream.load_skip(layout, version), "probe": _probe_skip(layout, version)}
    messages().print(closing_line(layout, metrics, len(figures), skips))
    return summary


def _chosen_alphas(
    params: Params, layout: Layout, runs: Mapping[int, Mapping[str, Any]]
) -> dict[int, float] | None:
    """WiSE-FT's α per seed (from each seed's training log), when wise_ft ran."""
    alphas = {}
    for seed in runs:
        log = read_train_log(layout.for_seed(seed).train_log("wise_ft"))
        chosen = (log or {}).get("after_training", {}).get("chosen_alpha")
        if chosen is not None:
            alphas[seed] = chosen
    return alphas or None


def summary_metrics(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]], targets: Sequence[str], version: str
) -> dict:
    """reports/metrics.json: the first seed's headline per model (as `dvc metrics` shows it) and,
    under `across_seeds`, each method's mean and std over every seed."""
    metrics = next(iter(runs.values()))
    summary: dict[str, Any] = {
        "split_version": version,
        "seeds": list(runs),
        "teacher": headline(models_of(metrics)["teacher"], targets, student=False),
    }
    summary.update({m: headline(metrics[m], targets) for m in ordered(metrics)})
    summary["across_seeds"] = {
        m: across_seeds([r[m] for r in runs.values() if m in r], ABLATION_KEYS[:-1]) for m in ordered(metrics)
    }
    return summary


def _probe_skip(layout: Layout, version: str) -> str | None:
    probe = report_probe.load_probe(layout, version)
    return None if probe is None else probe.get("skipped")


def closing_line(
    layout: Layout, metrics: Mapping[str, Mapping[str, Any]], figures: int, skips: Mapping[str, str | None]
) -> str:
    """One line on success: what the report wrote, the student with the highest mean NTS, and what
    optional stage was skipped (its reason is in the summary)."""
    students = [m for m in ordered(metrics) if m != "ceiling"] or ordered(metrics)
    best = max(students, key=lambda m: (metrics[m]["mean_nts"], -students.index(m)))
    m = metrics[best]
    skipped = [name for name, reason in skips.items() if reason]
    return (
        f"report: {layout.summary}, {layout.metrics_summary} and {figures} figure(s) — highest mean NTS: "
        f"{best} (ID {m['id']['acc']:.1f}%, mean OOD {m['mean_acc_ood']:.1f}%, "
        f"mean AOG {m['mean_aog']:+.1f}, mean NTS {m['mean_nts']:+.1f})"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )

"""`prefshift report`: tables, figures and DVC metrics/plots across every evaluated method.

Inputs are only files other stages wrote: reports/metrics/<method>/seed-<k>.json for every seed
params list (the teacher row comes from their `teacher` block, computed on the same bootstrap
draws), the first seed's reports/train/<name>/seed-<k>.json for curves and drift, every seed's
per-pair scores for the paired comparisons, and optional sweep results in reports/sweeps/*.json
for the ablation tables. The across-seeds table and the paired verdicts use every seed; the
detail tables (main table, diagnostics, drift, curves) show the first seed and say so.

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

import io
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from prefshift.config.params import Params, method_order
from prefshift.core.atomic import write_json, write_text
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.splits import load_manifest
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages import report_probe
from prefshift.pipeline.stages.evaluate import headline, read_train_log, training_summary
from prefshift.pipeline.stages.report_errors import ReportError
from prefshift.pipeline.sweep_points import ablation_keys, replicate_seed
from prefshift.science import benchmark_targets
from prefshift.science import figures as figs
from prefshift.science.metrics import ID_SPLIT, across_seeds, check_finite, with_ceiling

ABLATION_KEYS = ("id.acc", "wrg", "mean_acc_ood", "mean_aog", "mean_nts", "training.final_drift_mean")
LAMBDA_KEY = "anchor.lambda"
DASH = "—"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object")
    for key in ("method", "split_version", "id", "teacher", "targets"):
        if key not in data:
            raise ReportError(f"{path}: not a metrics file (no {key!r}); re-run `prefshift evaluate`")
    check_finite(data, str(path))
    return data


def load_runs(params: Params, layout: Layout) -> dict[int, dict[str, dict[str, Any]]]:
    """seed → method → metrics document, for every seed params list (reports/metrics/<method>/seed-<k>.json).

    The first listed seed's documents are the detail tables' (the report names it); a seed with
    no metrics at all is left out and the header says which seeds the numbers rest on.
    """
    runs = {}
    for seed in params.seeds:
        seeded = layout.for_seed(seed)
        found = {m: _read_json(seeded.metrics(m)) for m in params.methods if seeded.metrics(m).exists()}
        if "ceiling" in found:
            found = {m: v if m == "ceiling" else with_ceiling(v, found["ceiling"]) for m, v in found.items()}
        if found:
            runs[seed] = found
    first = layout.for_seed(params.seeds[0]).metrics("x").parent
    if params.seeds[0] not in runs:
        raise ReportError(
            f"no metrics in {first} (the first seed of params `seeds`); run `dvc repro`, or "
            f"`prefshift evaluate --method M --seed {params.seeds[0]}` for one of {', '.join(params.methods)}"
        )
    return runs


def load_sweeps(layout: Layout) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(layout.sweeps_dir.glob("*.json")):
        data = _read_json(path)
        if not isinstance(data.get("sweep"), dict) or not data["sweep"]:
            raise ReportError(f"{path}: a sweep result needs a non-empty 'sweep' object of dotted params")
        data["_path"] = str(path)
        runs.append(data)
    return runs


def check_versions(named: Mapping[str, Mapping[str, Any]], layout: Layout) -> str:
    """One split version for everything compared, equal to the current manifest's when there is one."""
    versions = {name: str(m["split_version"]) for name, m in named.items()}
    if layout.split_manifest.exists():
        versions = {"current splits (manifest)": str(load_manifest(layout)["version"]), **versions}
    if len(set(versions.values())) > 1:
        listing = "; ".join(f"{name}: {v}" for name, v in versions.items())
        raise ReportError(
            f"refusing to compare metrics from different split versions ({listing}); "
            f"re-run `prefshift evaluate` for the stale ones (or remove stale sweep files)"
        )
    return next(iter(versions.values()))


def check_replicates(replicates: Sequence[Mapping[str, Any]]) -> None:
    """Seed replicates: one split version per seed, shared by its methods.

    `seed` reshuffles the split, so a replicate's split differs from the main run's by design;
    what must hold is that the methods compared within one seed saw the same split.
    """
    by_seed: dict[int, dict[str, str]] = defaultdict(dict)
    for run in replicates:
        by_seed[replicate_seed(run["sweep"])][run["_path"]] = str(run["split_version"])
    for seed, versions in sorted(by_seed.items()):
        if len(set(versions.values())) > 1:
            listing = "; ".join(f"{name}: {v}" for name, v in versions.items())
            raise ReportError(
                f"seed {seed}'s replicates come from different split versions ({listing}); "
                "re-run that seed's sweep point (or remove its stale sweep files)"
            )


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def _ci(value: float | None, ci: Sequence[float] | None) -> str:
    if value is None:
        return DASH
    return f"{value:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{value:.1f}"


def _sd(stat: Mapping[str, Any], digits: int = 1) -> str:
    if stat["mean"] is None:
        return DASH
    mean = f"{stat['mean']:.{digits}f}"
    return mean if stat["std"] is None else f"{mean} ± {stat['std']:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ordered(metrics: Mapping[str, Any]) -> list[str]:
    return method_order(metrics)


def _is_synthetic(setting: Mapping[str, Any]) -> bool:
    return any(str(d).startswith("syn_") for d in [setting["source"], *setting["targets"]])


def header_section(
    setting: Mapping[str, Any], version: str, methods: Sequence[str], seeds: Sequence[int]
) -> str:
    order = ["teacher_train", "student_train", ID_SPLIT, *setting["targets"]]
    counts = setting.get("sizes", {})
    sizes = ", ".join(f"{k} {counts[k]}" for k in order if k in counts)
    lines = [
        "# prefshift results",
        "",
        f"- Setting: {setting.get('category', '?')} preferences; source `{setting['source']}` → targets "
        + ", ".join(f"`{t}`" for t in setting["targets"]),
        f"- Models: weak {setting['models']['weak']}, strong {setting['models']['strong']}",
        f"- Pairs per split: {sizes}",
        f"- Seeds: {', '.join(map(str, seeds))} (the across-seeds table and every verdict rest on all of "
        f"them; the detail tables after them show seed {setting.get('seed')})",
        f"- Intervals: {round(setting['ci'] * 100)}% paired bootstrap over pairs, "
        f"{setting['bootstrap']} draws; split version `{version}`",
        f"- Methods evaluated: {', '.join(methods)}",
        "- All numbers are percentage points except PGR (a ratio; — when the ceiling does not beat "
        "the teacher).",
    ]
    if _is_synthetic(setting):
        lines += [
            "",
            "> **Synthetic demonstration.** These datasets are the embedded synthetic suite with tiny "
            "backbones pretrained from scratch. The numbers demonstrate the pipeline, the metrics and the "
            "shortcut failure mode (source-only cues that help in distribution and hurt out of "
            "distribution, one that the pretrained strong model already exposes and one it does not); they "
            "are not the paper's results and say nothing about whether ANCHOR works on real models.",
        ]
    return "\n".join(lines)


def main_table(metrics: Mapping[str, Mapping[str, Any]], targets: Sequence[str]) -> str:
    """The paper's layout: ID acc, WRG, then acc / AOG / NTS per target, with intervals."""
    header = ["Method", "ID acc", "WRG"]
    for t in targets:
        header += [f"{t} acc", f"{t} AOG", f"{t} NTS"]
    header += ["mean AOG", "mean NTS", "PGR ID", "PGR OOD"]
    teacher = next(iter(metrics.values()))["teacher"]
    rows = [["teacher", _ci(teacher["id"]["acc"], teacher["id"]["ci"]), DASH]]
    for t in targets:
        rows[0] += [_ci(teacher["targets"][t]["acc"], teacher["targets"][t]["ci"]), DASH, DASH]
    rows[0] += [DASH] * 4
    for method in _ordered(metrics):
        m = metrics[method]
        row = [method, _ci(m["id"]["acc"], m["id"]["ci"]), _ci(m["wrg"], m["ci"]["wrg"])]
        for t in targets:
            cell = m["targets"][t]
            row += [
                _ci(cell["acc"], cell["ci"]["acc"]),
                _ci(cell["aog"], cell["ci"]["aog"]),
                _ci(cell["nts"], cell["ci"]["nts"]),
            ]
        row += [
            _ci(m["mean_aog"], m["ci"]["mean_aog"]),
            _ci(m["mean_nts"], m["ci"]["mean_nts"]),
            _num(m["pgr_id"], 2),
            _num(m["pgr_ood"], 2),
        ]
        rows.append(row)
    return _table(header, rows)


def _models(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Teacher first, then every method: each with ece, length_shortcut and best_of_n blocks."""
    return {"teacher": next(iter(metrics.values()))["teacher"], **{m: metrics[m] for m in _ordered(metrics)}}


def _subset(block: Mapping[str, Any]) -> str:
    return f"{_num(block['acc'])} (n={block['n']})"


def diagnostics_tables(metrics: Mapping[str, Mapping[str, Any]], splits: Sequence[str]) -> str:
    rows = []
    for name, m in _models(metrics).items():
        for split in splits:
            ls = m["length_shortcut"][split]
            rows.append(
                [
                    name,
                    split,
                    _num(m["ece"][split]),
                    _num(ls["pearson_r"], 2),
                    _subset(ls["chosen_longer"]),
                    _subset(ls["chosen_shorter"]),
                    _subset(ls["equal_length"]),
                ]
            )
    text = [
        "ECE: calibration error of σ(Δ), folded to the preferred response (pp). r: Pearson correlation of "
        "the reward margin with the length difference (chosen − rejected, tokens); a model that tracks "
        "length shows |r| near 1 and a large gap between the two length columns.",
        "",
        _table(
            [
                "Model",
                "Split",
                "ECE",
                "r(Δ, Δlen)",
                "acc chosen longer",
                "acc chosen shorter",
                "acc equal length",
            ],
            rows,
        ),
    ]
    cue_rows = [
        [
            name,
            split,
            report_probe.CUE_NAMES[cue],
            _subset(block["on_chosen"]),
            _subset(block["on_rejected"]),
            _num(block["gap"]),
        ]
        for name, m in _models(metrics).items()
        for split in splits
        for cue, block in m.get("cue_shortcut", {}).get(split, {}).items()
    ]
    if cue_rows:
        text += [
            "",
            "Shortcut cues: accuracy when the cue sits on the chosen response and when on the rejected one. "
            "Cues are placed independently of the content, so a model that ignores a cue scores alike on "
            "both; the gap (pp) is how far it follows the cue.",
            "",
            _table(["Model", "Split", "Cue", "acc cue on chosen", "acc cue on rejected", "gap"], cue_rows),
        ]
    datasets = sorted({ds for m in _models(metrics).values() for ds in m.get("best_of_n", {})})
    if datasets:
        bon_rows = []
        for name, m in _models(metrics).items():
            cells = [_num(m.get("best_of_n", {}).get(ds, {}).get("acc")) for ds in datasets]
            bon_rows.append([name, *cells])
        chance = next(m["best_of_n"] for m in _models(metrics).values() if m.get("best_of_n"))
        bon_rows.append(["random pick", *[_num(chance.get(ds, {}).get("random")) for ds in datasets]])
        text += [
            "",
            "Best-of-n selection accuracy (pp): share of groups where the model's top-reward "
            "response is a gold-best one (reward ties earn fractional credit).",
            "",
            _table(["Model", *datasets], bon_rows),
        ]
    return "\n".join(text)


def drift_table(summaries: Mapping[str, Mapping[str, Any] | None]) -> str:
    rows, layers = (
        [],
        sorted({k for s in summaries.values() if s for k in s["final_drift"]}, key=figs.layer_order),
    )
    for name, s in summaries.items():
        if not s:
            continue
        rows.append(
            [
                name,
                str(s["final_step"]),
                _num(s["final_drift_mean"], 3),
                *[_num(s["final_drift"].get(layer), 3) for layer in layers],
                _num(s["final_loss"], 4),
                _num(s["wall_s"], 0),
                _num(s["peak_rss_mb"], 0),
            ]
        )
    if not rows:
        return "No training logs found."
    return _table(
        ["Method", "final step", "mean cosine", *layers, "final loss", "wall s", "peak RSS MB"], rows
    )


def _sweep_groups(sweeps: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple[str, str], list[Mapping]]]:
    grouped: dict[str, dict[tuple[str, str], list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    for run in sweeps:
        for key in ablation_keys(run["sweep"]):
            grouped[key][(run["method"], json.dumps(run["sweep"][key]))].append(run)
    return grouped


def ablation_tables(sweeps: Sequence[Mapping[str, Any]]) -> str:
    sections = []
    for key, cells in sorted(_sweep_groups(sweeps).items()):
        rows = []
        for (method, value), runs in sorted(cells.items(), key=lambda kv: (kv[0][0], _sort_value(kv[0][1]))):
            stats = across_seeds(runs, ABLATION_KEYS)
            cells = [_sd(stats[k], 3 if k.startswith("training.") else 1) for k in ABLATION_KEYS]
            rows.append([method, value, str(len(runs)), *cells])
        sections.append(
            f"### {key}\n\n"
            + _table(
                [
                    "Method",
                    key,
                    "runs",
                    "ID acc",
                    "WRG",
                    "mean OOD acc",
                    "mean AOG",
                    "mean NTS",
                    "final drift cos",
                ],
                rows,
            )
        )
    return "\n\n".join(sections)


def _sort_value(text: str) -> tuple[int, Any]:
    value = json.loads(text)
    return (0, value) if isinstance(value, (int, float)) else (1, text)


def _per_seed_wrg(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], method: str) -> str:
    """Each seed's WRG with its pairs interval: whether naive beats its teacher on every seed."""
    cells = [
        f"{seed}: {_ci(docs[method]['wrg'], docs[method]['ci']['wrg'])}"
        for seed, docs in runs.items()
        if method in docs
    ]
    return "; ".join(cells)


def seeds_table(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], methods: Sequence[str]) -> str:
    """Mean ± std across the pipeline's seeds, and each seed's WRG with its interval."""
    teacher = [{"id": next(iter(docs.values()))["teacher"]["id"]} for docs in runs.values()]
    stats = across_seeds(teacher, ["id.acc"])
    rows = [["teacher", str(len(teacher)), _sd(stats["id.acc"]), DASH, DASH, DASH, DASH, DASH]]
    for method in methods:
        docs = [r[method] for r in runs.values() if method in r]
        if not docs:
            continue
        stats = across_seeds(docs, ABLATION_KEYS[:-1])
        rows.append(
            [
                method,
                str(len(docs)),
                *[_sd(stats[k]) for k in ABLATION_KEYS[:-1]],
                _per_seed_wrg(runs, method),
            ]
        )
    header = ["Method", "seeds", "ID acc", "WRG", "mean OOD acc", "mean AOG", "mean NTS", "WRG per seed [CI]"]
    return _table(header, rows)


def _csv(path: Path, frame: pd.DataFrame) -> None:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    write_text(path, buffer.getvalue())


def _accuracy_rows(models: Mapping[str, Mapping[str, Any]], targets: Sequence[str]) -> pd.DataFrame:
    rows = []
    for name, m in models.items():
        blocks = {ID_SPLIT: m["id"], **{t: m["targets"][t] for t in targets}}
        for split, block in blocks.items():
            ci = block["ci"]["acc"] if isinstance(block["ci"], Mapping) else block["ci"]
            rows.append(
                {"model": name, "split": split, "acc": block["acc"], "ci_low": ci[0], "ci_high": ci[1]}
            )
    return pd.DataFrame(rows, columns=["model", "split", "acc", "ci_low", "ci_high"])


def _lambda_series(sweeps: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for (method, value), runs in sorted(_sweep_groups(sweeps).get(LAMBDA_KEY, {}).items()):
        stats = across_seeds(runs, ABLATION_KEYS)
        rows.append(
            {
                "method": method,
                "lambda": float(json.loads(value)),
                "seeds": len(runs),
                "wrg": stats["wrg"]["mean"],
                "mean_aog": stats["mean_aog"]["mean"],
                "mean_nts": stats["mean_nts"]["mean"],
                "drift_cosine": stats["training.final_drift_mean"]["mean"],
                **{f"{k}_std": stats[k]["std"] for k in ("wrg", "mean_aog", "mean_nts")},
            }
        )
    return pd.DataFrame(rows)


def _lambda_figure(series: pd.DataFrame, path: Path) -> None:
    curves: dict[str, dict[str, list[tuple[float, figs.Estimate]]]] = defaultdict(lambda: defaultdict(list))
    for row in series[series["lambda"] > 0].to_dict("records"):
        for name, col in (("WRG", "wrg"), ("mean AOG", "mean_aog"), ("mean NTS", "mean_nts")):
            value, std = row[col], row[f"{col}_std"]
            ci = None if pd.isna(std) else [value - std, value + std]
            curves[row["method"]][name].append((row["lambda"], figs.Estimate(value, ci)))
    figs.lambda_curve(curves, path)


def write_figures(
    layout: Layout,
    metrics: Mapping[str, Mapping[str, Any]],
    targets: Sequence[str],
    logs: Mapping[str, Mapping[str, Any]],
    lambda_series: pd.DataFrame,
    into: Path | None = None,
) -> list[Path]:
    """The figures, written into `into` (the report's staged figures directory) or reports/figures."""
    out = into or layout.figures
    models = _models(metrics)
    points = {}
    for name, m in models.items():
        ood_ci = m["ci"]["mean_acc_ood"]
        points[name] = (
            figs.Estimate(m["id"]["acc"], m["id"]["ci"]),
            figs.Estimate(m["mean_acc_ood"], ood_ci),
        )
    written = [out / "id_vs_ood.png", out / "gains.png"]
    figs.id_vs_ood(points, written[0])
    figs.gains(
        {
            gain.upper(): {
                method: {
                    t: figs.Estimate(
                        metrics[method]["targets"][t][gain], metrics[method]["targets"][t]["ci"][gain]
                    )
                    for t in targets
                }
                for method in _ordered(metrics)
            }
            for gain in ("aog", "nts")
        },
        written[1],
    )
    curves = {name: log["steps"] for name, log in logs.items() if log.get("steps")}
    if curves:
        written.append(out / "training.png")
        figs.training_curves(curves, written[-1])
    drifts = {name: log["drift"] for name, log in logs.items() if log.get("drift")}
    if drifts:
        written.append(out / "drift.png")
        figs.drift(drifts, written[-1])
    if not lambda_series.empty:
        written.append(out / "lambda_ablation.png")
        _lambda_figure(lambda_series, written[-1])
    return written


def write_plots(
    layout: Layout, metrics: Mapping, targets: Sequence[str], logs: Mapping, lambda_series, into=None
) -> None:
    plots = into or layout.plots_dir
    _csv(plots / "accuracy.csv", _accuracy_rows(_models(metrics), targets))
    for name, log in logs.items():
        if log.get("steps"):
            frame = pd.DataFrame(log["steps"]).reindex(columns=["step", "loss", "acc", "lr"])
            _csv(plots / "training" / f"{name}.csv", frame)
        if log.get("drift"):
            frame = pd.DataFrame(log["drift"])
            layers = sorted([c for c in frame.columns if c != "step"], key=figs.layer_order)
            frame["mean_cosine"] = frame[layers].mean(axis=1)
            _csv(plots / "drift" / f"{name}.csv", frame[["step", "mean_cosine", *layers]])
    if not lambda_series.empty:
        _csv(plots / "lambda.csv", lambda_series)


def render_summary(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]],
    sweeps: Sequence[Mapping[str, Any]],
    training: Mapping[str, Mapping[str, Any] | None],
    version: str,
    figures: Sequence[Path],
    layout: Layout,
    extra_sections: Sequence[str] = (),
    cue_section: str | None = None,
) -> str:
    metrics = next(iter(runs.values()))
    setting = next(iter(metrics.values()))["setting"]
    targets = setting["targets"]
    first = setting["seed"]
    parts = [
        header_section(setting, version, _ordered(metrics), list(runs)),
        f"## Across seeds\n\nMean ± std over seeds {', '.join(map(str, runs))} (accuracy in %, gains in "
        "pp), and each seed's WRG with its pairs interval. The paired comparisons below give intervals "
        "that span seeds and pairs.\n\n" + seeds_table(runs, _ordered(metrics)),
        f"## Main table (seed {first})\n\nAccuracy in %, gains in pp, {round(setting['ci'] * 100)}% "
        "intervals over pairs in brackets. WRG = ID gain over the teacher; AOG = OOD gain per target; "
        "NTS = AOG minus the student's ID regression (if any).\n\n" + main_table(metrics, targets),
    ]
    official = benchmark_targets.summary_section(_models(metrics))
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
) -> tuple[list[str], list[Path]]:
    """DESIGN §10's sections past pairwise accuracy: paired comparisons across seeds, truncation,
    best-of-n, and the mechanism (drift against OOD accuracy per seed, WiSE-FT's α curve)."""
    from prefshift.pipeline.stages import (
        report_comparisons,
        report_downstream,
        report_mechanism,
        report_truncation,
    )

    metrics = next(iter(runs.values()))
    splits = [ID_SPLIT, *params.data.targets]
    sections = [
        report_comparisons.comparisons_section(report_comparisons.compare(params, layout, _ordered(metrics))),
        report_truncation.truncation_section(metrics, params.evaluate.warn_truncated_share),
    ]
    docs = report_downstream.load_downstream(layout, version, params.methods)
    skip = report_downstream.load_skip(layout, version)
    sections.append(
        report_downstream.skipped_section(skip)
        if skip
        else report_downstream.best_of_n_section(docs, splits, report_downstream.load_judge(layout))
    )
    figures = report_downstream.write_best_of_n_figures(docs, splits, figures_dir) if docs else []
    for section, written in (
        report_mechanism.mechanism_section(runs, figures_dir),
        report_mechanism.alpha_section({m: log for m, log in logs.items() if m != "teacher"}, figures_dir),
    ):
        sections.append(section)
        figures += written
    return [s for s in sections if s], figures


def _teacher_accuracies(m: Mapping[str, Any]) -> dict[str, float]:
    teacher = m["teacher"]
    return {ID_SPLIT: teacher["id"]["acc"], **{t: block["acc"] for t, block in teacher["targets"].items()}}


def _check_teachers(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], layout: Layout) -> None:
    """Within a seed every method compares to one teacher labelling and one list of targets."""
    for seed, metrics in runs.items():
        seeded = layout.for_seed(seed)
        first = next(iter(metrics.values()))
        targets = first["setting"]["targets"]
        for name, m in metrics.items():
            if _teacher_accuracies(m) != _teacher_accuracies(first):
                raise ReportError(
                    f"{seeded.metrics(name)}: its teacher accuracies differ from {first['method']}'s, so the "
                    "teacher was re-labelled in between; re-run `prefshift evaluate` for every method of "
                    f"seed {seed}"
                )
            if m["setting"]["targets"] != targets:
                raise ReportError(
                    f"{seeded.metrics(name)}: evaluated on targets {m['setting']['targets']}, "
                    f"others on {targets}; re-run `prefshift evaluate --method {name} --seed {seed}`"
                )


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
    _check_teachers(runs, layout)
    metrics = runs[params.seeds[0]]
    detail = layout.for_seed(params.seeds[0])
    targets = next(iter(metrics.values()))["setting"]["targets"]
    logs = {n: log for n in ["teacher", *_ordered(metrics)] if (log := read_train_log(detail.train_log(n)))}
    training = {m: training_summary(logs.get(m)) for m in _ordered(metrics)}
    lambda_series = _lambda_series(sweeps)
    files, directories = [layout.metrics_summary, layout.summary], [layout.figures, layout.plots_dir]
    with output_set(layout.root, "prefshift report", files, directories, manifest=False) as out:
        figures_dir = out.path(layout.figures)
        staged = write_figures(layout, metrics, targets, logs, lambda_series, into=figures_dir)
        write_plots(layout, metrics, targets, logs, lambda_series, into=out.path(layout.plots_dir))
        extra_sections, extra_figures = beyond_accuracy(params, layout, runs, logs, version, figures_dir)
        cues = report_probe.probe_section(params, report_probe.load_probe(layout, version))
        figures = [layout.figures / p.name for p in [*staged, *extra_figures]]
        summary = summary_metrics(runs, targets, version)
        write_json(out.path(layout.metrics_summary), summary)
        write_text(
            out.path(layout.summary),
            render_summary(runs, sweeps, training, version, figures, layout, extra_sections, cues),
        )
    from prefshift.pipeline.stages.report_downstream import load_skip

    skips = {"best-of-n": load_skip(layout, version), "probe": _probe_skip(layout, version)}
    messages().print(closing_line(layout, metrics, len(figures), skips))
    return summary


def summary_metrics(
    runs: Mapping[int, Mapping[str, Mapping[str, Any]]], targets: Sequence[str], version: str
) -> dict:
    """reports/metrics.json: the first seed's headline per model (as `dvc metrics` shows it) and,
    under `across_seeds`, each method's mean and std over every seed."""
    metrics = next(iter(runs.values()))
    summary: dict[str, Any] = {
        "split_version": version,
        "seeds": list(runs),
        "teacher": headline(_models(metrics)["teacher"], targets, student=False),
    }
    summary.update({m: headline(metrics[m], targets) for m in _ordered(metrics)})
    summary["across_seeds"] = {
        m: across_seeds([r[m] for r in runs.values() if m in r], ABLATION_KEYS[:-1])
        for m in _ordered(metrics)
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
    students = [m for m in _ordered(metrics) if m != "ceiling"] or _ordered(metrics)
    best = max(students, key=lambda m: (metrics[m]["mean_nts"], -students.index(m)))
    m = metrics[best]
    skipped = [name for name, reason in skips.items() if reason]
    return (
        f"report: {layout.summary}, {layout.metrics_summary} and {figures} figure(s) — highest mean NTS: "
        f"{best} (ID {m['id']['acc']:.1f}%, mean OOD {m['mean_acc_ood']:.1f}%, "
        f"mean AOG {m['mean_aog']:+.1f}, mean NTS {m['mean_nts']:+.1f})"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )

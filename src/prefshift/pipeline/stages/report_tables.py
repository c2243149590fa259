"""The report's detail tables: header, across seeds, main table, diagnostics, drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefshift.pipeline.stages import report_probe
from prefshift.pipeline.stages.report_ablations import ABLATION_KEYS
from prefshift.pipeline.stages.report_format import (
    DASH,
    ci_cell,
    is_synthetic,
    models_of,
    num,
    ordered,
    sd_cell,
    table,
)
from prefshift.science import figures as figs
from prefshift.science.metrics import CEILING_TIES_TEACHER, ID_SPLIT, across_seeds


def header_section(
    setting: Mapping[str, Any], version: str, methods: Sequence[str], seeds: Sequence[int]
) -> str:
    order = ["teacher_train", "student_train", ID_SPLIT, *setting["targets"]]
    counts = setting.get("sizes", {})
    sizes = ", ".join(f"{k} {counts[k]}" for k in order if k in counts)
    lines = [
        "## Setting",
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
        "the teacher with an interval above 0).",
    ]
    if is_synthetic(setting):
        lines += [
            "",
            "> **Synthetic demonstration.** These datasets are the embedded synthetic suite with tiny "
            "backbones pretrained from scratch. The numbers demonstrate the pipeline, the metrics and the "
            "shortcut failure mode (source-only cues that help in distribution and hurt out of "
            "distribution, one that the pretrained strong model already exposes and one it does not); they "
            "are not the paper's results and say nothing about whether ANCHOR works on real models.",
        ]
    return "\n".join(lines)


def _pgr(m: Mapping[str, Any], key: str) -> str:
    """PGR, or why not: a ceiling whose gain over the teacher may be 0 makes the ratio meaningless."""
    if m[key] is None and key in m.get("pgr_withheld", {}):
        return f"{DASH} ({CEILING_TIES_TEACHER})"
    return num(m[key], 2)


def main_table(metrics: Mapping[str, Mapping[str, Any]], targets: Sequence[str]) -> str:
    """The paper's layout: ID acc, WRG, then acc / AOG / NTS per target, with intervals."""
    header = ["Method", "ID acc", "WRG"]
    for t in targets:
        header += [f"{t} acc", f"{t} AOG", f"{t} NTS"]
    header += ["mean AOG", "mean NTS", "PGR ID", "PGR OOD"]
    teacher = next(iter(metrics.values()))["teacher"]
    rows = [["teacher", ci_cell(teacher["id"]["acc"], teacher["id"]["ci"]), DASH]]
    for t in targets:
        rows[0] += [ci_cell(teacher["targets"][t]["acc"], teacher["targets"][t]["ci"]), DASH, DASH]
    rows[0] += [DASH] * 4
    for method in ordered(metrics):
        m = metrics[method]
        row = [method, ci_cell(m["id"]["acc"], m["id"]["ci"]), ci_cell(m["wrg"], m["ci"]["wrg"])]
        for t in targets:
            cell = m["targets"][t]
            row += [
                ci_cell(cell["acc"], cell["ci"]["acc"]),
                ci_cell(cell["aog"], cell["ci"]["aog"]),
                ci_cell(cell["nts"], cell["ci"]["nts"]),
            ]
        row += [
            ci_cell(m["mean_aog"], m["ci"]["mean_aog"]),
            ci_cell(m["mean_nts"], m["ci"]["mean_nts"]),
            _pgr(m, "pgr_id"),
            _pgr(m, "pgr_ood"),
        ]
        rows.append(row)
    return table(header, rows)


def _subset(block: Mapping[str, Any]) -> str:
    return f"{num(block['acc'])} (n={block['n']})"


def diagnostics_tables(metrics: Mapping[str, Mapping[str, Any]], splits: Sequence[str]) -> str:
    rows = []
    for name, m in models_of(metrics).items():
        for split in splits:
            ls = m["length_shortcut"][split]
            rows.append(
                [
                    name,
                    split,
                    num(m["ece"][split]),
                    num(ls["pearson_r"], 2),
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
        table(
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
            num(block["gap"]),
        ]
        for name, m in models_of(metrics).items()
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
            table(["Model", "Split", "Cue", "acc cue on chosen", "acc cue on rejected", "gap"], cue_rows),
        ]
    datasets = sorted({ds for m in models_of(metrics).values() for ds in m.get("best_of_n", {})})
    if datasets:
        bon_rows = []
        for name, m in models_of(metrics).items():
            cells = [num(m.get("best_of_n", {}).get(ds, {}).get("acc")) for ds in datasets]
            bon_rows.append([name, *cells])
        chance = next(m["best_of_n"] for m in models_of(metrics).values() if m.get("best_of_n"))
        bon_rows.append(["random pick", *[num(chance.get(ds, {}).get("random")) for ds in datasets]])
        text += [
            "",
            "Best-of-n selection accuracy (pp): share of groups where the model's top-reward "
            "response is a gold-best one (reward ties earn fractional credit).",
            "",
            table(["Model", *datasets], bon_rows),
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
                num(s["final_drift_mean"], 3),
                *[num(s["final_drift"].get(layer), 3) for layer in layers],
                num(s["final_loss"], 4),
                num(s["wall_s"], 0),
                num(s["peak_rss_mb"], 0),
            ]
        )
    if not rows:
        return "No training logs found."
    return table(
        ["Method", "final step", "mean cosine", *layers, "final loss", "wall s", "peak RSS MB"], rows
    )


def _per_seed_wrg(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], method: str) -> str:
    """Each seed's WRG with its pairs interval: whether naive beats its teacher on every seed."""
    cells = [
        f"{seed}: {ci_cell(docs[method]['wrg'], docs[method]['ci']['wrg'])}"
        for seed, docs in runs.items()
        if method in docs
    ]
    return "; ".join(cells)


def seeds_table(runs: Mapping[int, Mapping[str, Mapping[str, Any]]], methods: Sequence[str]) -> str:
    """Mean ± std across the pipeline's seeds, and each seed's WRG with its interval."""
    teacher = [{"id": next(iter(docs.values()))["teacher"]["id"]} for docs in runs.values()]
    stats = across_seeds(teacher, ["id.acc"])
    rows = [["teacher", str(len(teacher)), sd_cell(stats["id.acc"]), DASH, DASH, DASH, DASH, DASH]]
    for method in methods:
        docs = [r[method] for r in runs.values() if method in r]
        if not docs:
            continue
        stats = across_seeds(docs, ABLATION_KEYS[:-1])
        rows.append(
            [
                method,
                str(len(docs)),
                *[sd_cell(stats[k]) for k in ABLATION_KEYS[:-1]],
                _per_seed_wrg(runs, method),
            ]
        )
    header = ["Method", "seeds", "ID acc", "WRG", "mean OOD acc", "mean AOG", "mean NTS", "WRG per seed [CI]"]
    return table(header, rows)

"""The report's best-of-n section: gold score vs n per proxy reward model, and over-optimisation.

Reads reports/downstream/<split>/<model>/seed-<k>.json (written by `prefshift downstream --split`,
one stage per split) for id_test and each listed target, and joins each model's splits into one
document; the teacher comes first, then the methods in their usual order. The curves shown are the
first seed's; the metric-agreement section reads every seed's. When best-of-n was skipped
(reports/downstream/id_test/skipped.json), the section is one line saying so and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import method_order
from prefshift.core.paths import Layout
from prefshift.pipeline.stages.report_errors import ReportError
from prefshift.science import figures as figs
from prefshift.science.metrics import ID_SPLIT


def _expected_version(layout: Layout, split: str, version: str) -> str | None:
    """The split version a best-of-n file of `split` must carry: the metrics' (`version`) for
    id_test; a target's own manifest version, where that manifest is on disk (None: unchecked)."""
    from prefshift.data.splits import set_version

    if split == ID_SPLIT:
        return version
    return set_version(layout, split) if layout.target_manifest(split).exists() else None


def _read_split_doc(path: Path, expected: str | None, split: str) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if expected is not None and doc.get("split_version") != expected:
        raise ReportError(
            f"{path}: best-of-n from split version {doc.get('split_version')}, the report compares "
            f"{expected}; re-run `prefshift downstream --split {split}`"
        )
    return doc


def load_downstream(
    layout: Layout, version: str, splits: Sequence[str], methods: Sequence[str], seeds: Sequence[int]
) -> dict[int, dict[str, dict[str, Any]]]:
    """{seed: {model: document}} of the teacher and every listed method that has one, per listed
    seed, its `splits` joined from each listed split's file (id_test's first), from the current
    split versions only. A model with best-of-n on some listed splits but not others is refused:
    the section would silently lack rows."""
    expected = {split: _expected_version(layout, split, version) for split in splits}
    docs: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        for name in ("teacher", *method_order(methods)):
            paths = {split: layout.for_seed(seed).for_split(split).downstream(name) for split in splits}
            present = {split: path for split, path in paths.items() if path.exists()}
            if not present:
                continue
            if missing := [split for split in splits if split not in present]:
                raise ReportError(
                    f"{paths[missing[0]]}: no best-of-n for {name} (seed {seed}) on {missing[0]}; "
                    f"run `prefshift downstream --split {missing[0]}`"
                )
            parts = [_read_split_doc(present[split], expected[split], split) for split in splits]
            joined = {**parts[0], "splits": {}, "skips": {}}
            for split, part in zip(splits, parts, strict=True):
                joined["splits"].update(part["splits"])
                joined["skips"][split] = part.get("skips")
            docs.setdefault(seed, {})[name] = joined
    return docs


def load_skip(layout: Layout, version: str) -> str | None:
    """Why best-of-n was skipped for these splits, or None when it ran or never was asked to. The
    reason is the same for every split (it is about the policy and the judge), so id_test's says it."""
    from prefshift.pipeline.stages.downstream import SKIPPED

    path = layout.for_split(ID_SPLIT).downstream_dir / SKIPPED
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("split_version") != version:
        raise ReportError(
            f"{path}: best-of-n was skipped for split version {doc.get('split_version')}, the report "
            f"compares {version}; re-run `prefshift policy-samples` and `prefshift downstream`"
        )
    return str(doc["skipped"])


def skipped_section(reason: str) -> str:
    return f"## Best-of-n against a gold judge\n\nbest-of-n: skipped ({reason})."


def _num(value: float | None) -> str:
    return "—" if value is None else f"{round(value, 2) + 0.0:+.2f}"


def best_of_n_table(docs: Mapping[str, Mapping[str, Any]], splits: Sequence[str]) -> str:
    rows = [
        "| Proxy RM | split | prompts | gold gain (judge, sd) | proxy gain (sd) | gap = over-optimisation | "
        "gold gain (rule, 0-1) |",
        "|" + "---|" * 7,
    ]
    for name, doc in docs.items():
        for split in splits:
            block = doc["splits"][split]
            judge, rule = block["judge"], block["rule"]
            judge = judge or {"gold_gain": None, "proxy_gain": None, "gap": None}
            rows.append(
                f"| {name} | {split} | {block['prompts']} | {_num(judge['gold_gain'])} "
                f"| {_num(judge['proxy_gain'])} | {_num(judge['gap'])} "
                f"| {_num(rule['gold_gain'] if rule else None)} |"
            )
    return "\n".join(rows)


def write_best_of_n_figures(
    docs: Mapping[str, Mapping[str, Any]], splits: Sequence[str], out: Path
) -> list[Path]:
    written = []
    for kind, name, label in (
        ("judge", "best_of_n.png", "gold judge score of the pick (sd)"),
        ("rule", "best_of_n_rule.png", "synthetic gold rule score of the pick (0-1)"),
    ):
        if all(doc["splits"][s][kind] for doc in docs.values() for s in splits):
            per_split = {s: {m: doc["splits"][s][kind] for m, doc in docs.items()} for s in splits}
            written.append(out / name)
            figs.best_of_n_curves(per_split, written[-1], label)
    return written


def load_judge(layout: Layout, targets: Sequence[str]) -> dict[str, Any] | None:
    """What the judge is and its accuracy per test split: reports/judge.json (`prefshift judge`:
    the judge and the source) joined with reports/judge_targets/<target>.json (`judge-target`) for
    each listed target, in that order. A dropped target's file may linger: only listed ones are read.
    A listed target whose file is missing is refused, so the table never silently lacks a row."""
    path = layout.judge_report
    if not path.exists():
        return None
    judge = json.loads(path.read_text(encoding="utf-8"))
    if "accuracy" not in judge:
        return judge
    for target in targets:
        one = layout.judge_target_report(target)
        rerun = f"run `prefshift judge-target --target {target}`"
        if not one.exists():
            raise ReportError(f"{one}: no judge accuracy for target {target}; {rerun}")
        doc = json.loads(one.read_text(encoding="utf-8"))
        if "accuracy" not in doc:
            raise ReportError(f"{one}: the judge was not scored on {target} ({doc.get('skipped')}); {rerun}")
        judge["accuracy"].update(doc["accuracy"])
        if "breakdown" in doc:
            judge.setdefault("breakdown", {}).update(doc["breakdown"])
    return judge


def judge_accuracy_table(judge: Mapping[str, Any]) -> str:
    """The judge's own accuracy on the full test split of the source (ID) and of each target (OOD)."""
    rows = ["| Judge accuracy on | role | pairs | accuracy % [95% CI] |", "|---|---|---|---|"]
    for dataset, block in judge.get("accuracy", {}).items():
        low, high = block["ci"]
        accuracy = f"{block['acc']:.1f} [{low:.1f}, {high:.1f}]"
        rows.append(f"| {dataset} | {block['role'].upper()} | {block['n']} | {accuracy} |")
    return "\n".join(rows)


CUE_LABELS = {"sign_off": "sign-off", "marker": "marker"}


def _pct(block: Mapping[str, Any] | None) -> str:
    if not block or block.get("acc") is None:
        return "—"
    return f"{block['acc']:.1f} (n={block['n']})"


def judge_breakdown_table(judge: Mapping[str, Any]) -> str | None:
    """What the judge reads (reports/judge.json `breakdown`): its accuracy on the text as is, with
    the cues stripped (what it scores), and, as is, by where each cue sits."""
    breakdown = judge.get("breakdown")
    if not breakdown:
        return None
    cues = [c for c in CUE_LABELS if any(c in b["by_cue"] for b in breakdown.values())]
    header = ["Judge on", "as is", "cues stripped (what it reads)"]
    for cue in cues:
        header += [f"as is, {CUE_LABELS[cue]} on chosen", f"{CUE_LABELS[cue]} on rejected"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for dataset, block in breakdown.items():
        cells = [dataset]
        for key in ("as_is", "cues_stripped"):
            low, high = block[key]["ci"]
            cells.append(f"{block[key]['acc']:.1f} [{low:.1f}, {high:.1f}]")
        for cue in cues:
            by = block["by_cue"].get(cue, {})
            cells += [_pct(by.get("on_chosen")), _pct(by.get("on_rejected"))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _judge_note(judge: Mapping[str, Any] | None) -> str:
    if judge is None or "accuracy" not in judge:
        return ""
    trained = judge.get("training")
    stripped = judge.get("reads") == "cues stripped"
    reads = (
        " On the synthetic suite it trains on, and scores, text with both shortcut cues taken off: the "
        "cues are not gold (placed independently of the content), and the suite's own gold rule ignores "
        "them. Its accuracy below is on that text; the breakdown shows it on the text as is, and by where "
        "each cue sits."
        if stripped
        else ""
    )
    what = (
        f" It is a reward model of its own, trained on {trained['pairs']} gold pairs that no ranked model "
        "sees, so it never judges its own picks; it shares the "
        "strong backbone and the tokenizer with the students, so it is **a proxy for human gold, not "
        "human gold**: read its gains against its accuracy below (a judge near 50% on a split cannot "
        "rank that split's samples)."
        if trained
        else " It is none of the ranked models; its accuracy below says how far to trust its scores."
    )
    breakdown = judge_breakdown_table(judge)
    extra = f"{breakdown}\n\n" if breakdown else ""
    return f"{what}{reads}\n\n{judge_accuracy_table(judge)}\n\n{extra}"


def best_of_n_section(
    docs: Mapping[str, Mapping[str, Any]], splits: Sequence[str], judge: Mapping[str, Any] | None = None
) -> str | None:
    if not docs:
        return None
    first = next(iter(docs.values()))
    n_max = first["n_max"]
    return (
        "## Best-of-n against a gold judge\n\n"
        f"Policy `{first['policy']}` samples {n_max} completions per prompt; each proxy reward model "
        f"picks the best of n (n = 1 … {n_max}), averaged exactly over all n-subsets of the {n_max} "
        f"samples, and the judge `{first['judge']}` scores the pick. The table and figures show seed "
        f"{first.get('seed')}'s models; every seed's curves are in reports/downstream/<split>/<model>/, "
        f"and the metric agreement below reads them all.{_judge_note(judge)} Judge and proxy "
        "scores are standardised per split over all samples, so gains from n = 1 to "
        f"n = {n_max} read in each scorer's standard deviations; the gap (proxy gain − gold gain) "
        "grows when a reward model over-optimises (Gao et al. 2023). The rule column is the synthetic "
        "suite's own gold rule applied to the generated text (0-1), where the suite can judge it; — "
        "elsewhere. Figures: gold vs KL = log n − (n−1)/n, one panel per split.\n\n"
        + best_of_n_table(docs, splits)
    )

"""Targets that are benchmark sections: their official scores, AOG and NTS, headline and summary table.

A target whose adapter is a BenchmarkAdapter (RewardBench, RewardBench 2, RM-Bench) is
scored twice: by prefshift's pairwise accuracy like every target (metrics `targets`), and
by the benchmark's own rule (prefshift.benchmarks) here, from the same score files the
evaluation already wrote: RewardBench from the pair margins and the subset in each pair's
meta, RewardBench 2 and RM-Bench from the per-response rewards of their groups. Teacher
and student are scored on the same pairs or groups (those both of them scored), and
AOG_k = S_student^k − S_teacher^k, NTS_k = AOG_k − max(0, Acc_t^ID − Acc_s^ID) with S the
official score in pp (the ID regression stays pairwise accuracy: the source is not a
benchmark). No bootstrap interval is given for the official scores. A benchmark's overall
score appears once every one of its sections is a target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from prefshift import benchmarks as rules
from prefshift.config import Params
from prefshift.data.adapters import get_adapter
from prefshift.data.adapters.benchmark import BenchmarkAdapter
from prefshift.data.schema import Group, Pair

SECTIONS: dict[str, tuple[str, ...]] = {
    "rewardbench": tuple(rules.REWARDBENCH_SECTIONS),
    "rewardbench2": rules.REWARDBENCH2_SUBSETS,
    "rmbench": tuple(rules.RMBENCH_DOMAINS),
}
RULES = {
    "rewardbench": "strict wins (a tie is wrong), subset accuracies weighted by RewardBench's example counts",
    "rewardbench2": "best-of-4: the chosen response must get the top reward (1/k when k share it)",
    "rewardbench2/Ties": "Ties score: 0.3 tied acc + 0.3 ref acc + 0.2 + 0.2 margin terms + 0.01 tanh term",
    "rmbench": "3x3 chosen-style x rejected-style matrix; score = mean of hard, normal and easy",
}


def benchmark_targets(params: Params) -> dict[str, BenchmarkAdapter]:
    """The targets of params that are benchmark sections, with their adapters."""
    found = {name: get_adapter(name, params) for name in params.data.targets}
    return {name: adapter for name, adapter in found.items() if isinstance(adapter, BenchmarkAdapter)}


def rule_of(adapter: BenchmarkAdapter) -> str:
    return RULES.get(f"{adapter.benchmark}/{adapter.section}", RULES[adapter.benchmark])


def _group_rewards(
    target: str, frame: pd.DataFrame | None, groups: Sequence[Group], keep: set[str]
) -> list[tuple[Group, list[float]]]:
    if frame is None:
        raise rules.BenchmarkError(
            f"target {target!r}: no group scores, so its official score cannot be computed; run "
            f"`prefshift prepare`, `split`, `label` and `evaluate` again (caps.groups must not be 0)"
        )
    by_id = {g.group_id: g for g in groups}
    out = [
        (by_id[gid], list(r))
        for gid, r in zip(frame["group_id"], frame["rewards"], strict=True)
        if gid in keep
    ]
    if not out:
        raise rules.BenchmarkError(f"target {target!r}: no group was scored by both teacher and student")
    return out


def score_target(
    target: str,
    adapter: BenchmarkAdapter,
    pairs: Sequence[Pair],
    frame: pd.DataFrame,
    groups: Sequence[Group],
    group_frame: pd.DataFrame | None,
    keep: set[str],
) -> dict[str, Any]:
    """One model's official score (pp) on one benchmark target, with the rule's parts.

    `keep` are the pair ids (RewardBench) or group ids (the others) every compared model scored.
    """
    if adapter.benchmark == "rewardbench":
        subset_of = {p.pair_id: p.meta["subset"] for p in pairs}
        kept = frame[frame["pair_id"].isin(keep)]
        subsets = rules.rewardbench_subset_accuracies(
            kept["delta"].to_numpy(dtype=float), [subset_of[pid] for pid in kept["pair_id"]]
        )
        return {
            "score": rules.rewardbench_section_score(subsets, adapter.section),
            "subsets": subsets,
            "n": len(kept),
        }
    scored = _group_rewards(target, group_frame, groups, keep)
    if adapter.benchmark == "rewardbench2" and adapter.section == rules.TIES:
        examples = [
            rules.TiesExample(
                g.meta["ties_kind"], int(g.meta["ties_prompt"]), tuple(r), int(g.meta["num_correct"])
            )
            for g, r in scored
        ]
        parts = rules.ties_score(examples)
        return {"score": parts.pop("score"), "components": parts, "n": len(scored)}
    if adapter.benchmark == "rewardbench2":
        return {"score": rules.best_of_n_score([r for _, r in scored]), "n": len(scored)}
    rewards = np.array([r for _, r in scored], dtype=float)
    styles = rules.RMBENCH_STYLES
    matrix = rules.rmbench_matrix(rewards[:, :styles], rewards[:, styles:])
    return {**rules.rmbench_accuracies(matrix), "matrix": (matrix * 100.0).tolist(), "n": len(scored)}


def _common(frames: Sequence[pd.DataFrame | None], column: str) -> set[str]:
    present = [set(f[column]) for f in frames if f is not None]
    return set.intersection(*present) if present else set()


def benchmark_metrics(
    params: Params,
    pairs: Mapping[str, Sequence[Pair]],
    student: Mapping[str, pd.DataFrame],
    teacher: Mapping[str, pd.DataFrame],
    gold_groups: Mapping[str, Sequence[Group]],
    student_groups: Mapping[str, pd.DataFrame],
    teacher_groups: Mapping[str, pd.DataFrame],
    id_acc: tuple[float, float],
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(student block, teacher block) for the metrics document, or None when no target is a benchmark.

    `id_acc` is (student, teacher) pairwise accuracy on id_test, for NTS.
    """
    targets = benchmark_targets(params)
    if not targets:
        return None
    regression = max(0.0, id_acc[1] - id_acc[0])
    out_s: dict[str, Any] = {"targets": {}, "overall": {}}
    out_t: dict[str, Any] = {"targets": {}, "overall": {}}
    for target, adapter in targets.items():
        if adapter.benchmark == "rewardbench":
            keep = _common([student[target], teacher[target]], "pair_id")
        else:
            keep = _common([student_groups.get(target), teacher_groups.get(target)], "group_id")
        scores = {}
        for name, frames, group_frames in (
            ("student", student, student_groups),
            ("teacher", teacher, teacher_groups),
        ):
            scores[name] = score_target(
                target,
                adapter,
                pairs[target],
                frames[target],
                gold_groups.get(target, []),
                group_frames.get(target),
                keep,
            )
        s, t = scores["student"]["score"], scores["teacher"]["score"]
        gain = None if s is None or t is None else s - t
        about = {"benchmark": adapter.benchmark, "section": adapter.section, "rule": rule_of(adapter)}
        out_s["targets"][target] = {
            **about,
            **scores["student"],
            "aog": gain,
            "nts": None if gain is None else gain - regression,
        }
        out_t["targets"][target] = {**about, **scores["teacher"]}
    for block in (out_s, out_t):
        for bench in sorted({a.benchmark for a in targets.values()}):
            by_section = {
                cell["section"]: cell["score"]
                for cell in block["targets"].values()
                if cell["benchmark"] == bench
            }
            block["overall"][bench] = rules.overall(by_section, SECTIONS[bench])
    for bench, s in out_s["overall"].items():
        t = out_t["overall"][bench]
        out_s["overall"][bench] = {"score": s, "aog": None if s is None or t is None else s - t}
        out_t["overall"][bench] = {"score": t}
    return out_s, out_t


def headline(block: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers MLflow and reports/metrics.json carry for one model's benchmark block."""
    keys = ("score", "aog", "nts", "hard", "normal", "easy")
    return {
        "targets": {t: {k: cell[k] for k in keys if k in cell} for t, cell in block["targets"].items()},
        "overall": {b: dict(cell) for b, cell in block["overall"].items()},
    }


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def summary_section(models: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The summary's benchmark table: official score per target, and for students AOG / NTS on it.

    `models` is teacher first, then each method, each its metrics (or teacher) block.
    """
    blocks = {name: m["benchmarks"] for name, m in models.items() if "benchmarks" in m}
    if not blocks:
        return None
    first = next(iter(blocks.values()))
    targets = list(first["targets"])
    benches = [b for b, cell in first["overall"].items() if cell["score"] is not None]
    header = ["Model"]
    for t in targets:
        header += [f"{t} official", f"{t} AOG", f"{t} NTS"]
    header += [f"{b} overall" for b in benches]
    rows = []
    for name, block in blocks.items():
        row = [name]
        for t in targets:
            cell = block["targets"][t]
            row += [_num(cell["score"]), _num(cell.get("aog")), _num(cell.get("nts"))]
        row += [_num(block["overall"][b]["score"]) for b in benches]
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    rules_text = "\n".join(f"- `{t}`: {first['targets'][t]['rule']}." for t in targets)
    return (
        "## Benchmark targets (official scoring)\n\n"
        "Each benchmark section scored by the benchmark's own rule (pp), teacher and students on the same "
        "examples; AOG and NTS here use that score, while the main table's accuracy on the same target is "
        "prefshift's pairwise accuracy (a tie counts half). No intervals.\n\n"
        + rules_text
        + "\n\n"
        + "\n".join(lines)
    )

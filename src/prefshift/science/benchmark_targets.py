"""Targets that are benchmark sections: their official scores, AOG and NTS, headline and summary table.

A target whose adapter is a BenchmarkAdapter (RewardBench, RewardBench 2, RM-Bench) is
scored twice: by prefshift's pairwise accuracy like every target (metrics `targets`), and
by the benchmark's own rule (prefshift.science.benchmarks) here, from the same score files the
evaluation already wrote: RewardBench from the pair margins and the subset in each pair's
meta, RewardBench 2 and RM-Bench from the per-response rewards of their groups. Teacher
and student are scored on the same pairs or groups (those both of them scored), and
AOG_k = S_student^k − S_teacher^k, NTS_k = AOG_k − max(0, Acc_t^ID − Acc_s^ID) with S the
official score in pp (the ID regression stays pairwise accuracy: the source is not a
benchmark). Intervals: a paired bootstrap over the target's examples (pairs, groups, or Ties
prompts; `n` counts them), `params.evaluate.bootstrap` draws, for the student's and the
teacher's score and the AOG; NTS gets no interval here (its ID term is resampled inside the
pairwise metrics). A benchmark's overall score appears once every one of its sections is a
target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from prefshift.config.params import Params
from prefshift.data import benchmark_tables as tables
from prefshift.data.adapters import get_adapter
from prefshift.data.adapters.benchmark import BenchmarkAdapter
from prefshift.data.schema import Group, Pair
from prefshift.science import benchmarks as rules
from prefshift.science import metrics

SECTIONS: dict[str, tuple[str, ...]] = {
    "rewardbench": tuple(tables.REWARDBENCH_SECTIONS),
    "rewardbench2": tables.REWARDBENCH2_SUBSETS,
    "rmbench": tuple(tables.RMBENCH_DOMAINS),
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


def _require(target: str, keep: Sequence[str]) -> None:
    if not keep:
        raise rules.BenchmarkError(f"target {target!r}: no example was scored by both teacher and student")


def _group_rewards(
    target: str, frame: pd.DataFrame | None, groups: Sequence[Group], keep: Sequence[str]
) -> list[tuple[Group, list[float]]]:
    if frame is None:
        raise rules.BenchmarkError(
            f"target {target!r}: no group scores, so its official score cannot be computed; run "
            f"`prefshift prepare`, `split`, `label` and `evaluate` again"
        )
    _require(target, keep)
    by_id = {g.group_id: g for g in groups}
    rewards = dict(zip(frame["group_id"], frame["rewards"], strict=True))
    return [(by_id[gid], list(rewards[gid])) for gid in keep]


Scorer = Callable[[np.ndarray | None], dict[str, Any]]


def scorer(
    target: str,
    adapter: BenchmarkAdapter,
    pairs: Sequence[Pair],
    frame: pd.DataFrame,
    groups: Sequence[Group],
    group_frame: pd.DataFrame | None,
    keep: Sequence[str],
) -> tuple[int, Scorer]:
    """(number of resampling units, a function of unit indices → official score and parts) for one model.

    `keep` are the pair ids (RewardBench) or group ids (the others) every compared model scored,
    in one order for all models, so the same indices pick the same examples (a paired bootstrap).
    Units are pairs or groups; for Ties they are prompts (a ref example with its tied one), which
    keep their number apart when a resample repeats them. None scores every unit once.
    """
    if adapter.benchmark == "rewardbench":
        _require(target, keep)
        subset_of = {p.pair_id: p.meta["subset"] for p in pairs}
        delta = frame.set_index("pair_id")["delta"]
        deltas = delta.reindex(list(keep)).to_numpy(dtype=float)
        names = np.array([subset_of[pid] for pid in keep], dtype=object)

        def rewardbench(idx: np.ndarray | None) -> dict[str, Any]:
            d, n = (deltas, names) if idx is None else (deltas[idx], names[idx])
            subsets = rules.rewardbench_subset_accuracies(d, list(n))
            return {"score": rules.rewardbench_section_score(subsets, adapter.section), "subsets": subsets}

        return len(keep), rewardbench
    scored = _group_rewards(target, group_frame, groups, keep)
    if adapter.benchmark == "rewardbench2" and adapter.section == tables.TIES:
        prompts: dict[int, list[tuple[Group, list[float]]]] = {}
        for group, rewards in scored:
            prompts.setdefault(int(group.meta["ties_prompt"]), []).append((group, rewards))
        clusters = [prompts[p] for p in sorted(prompts)]

        def ties(idx: np.ndarray | None) -> dict[str, Any]:
            chosen = clusters if idx is None else [clusters[i] for i in idx]
            examples = [
                rules.TiesExample(g.meta["ties_kind"], k, tuple(r), int(g.meta["num_correct"]))
                for k, cluster in enumerate(chosen)
                for g, r in cluster
            ]
            parts = rules.ties_score(examples)
            return {"score": parts.pop("score"), "components": parts}

        return len(clusters), ties
    if adapter.benchmark == "rewardbench2":
        credits = np.array([rules.best_of_n_credit(r) for _, r in scored])
        return len(scored), lambda idx: {
            "score": float((credits if idx is None else credits[idx]).mean() * 100)
        }
    rewards = np.array([r for _, r in scored], dtype=float)
    styles = tables.RMBENCH_STYLES

    def rmbench(idx: np.ndarray | None) -> dict[str, Any]:
        picked = rewards if idx is None else rewards[idx]
        matrix = rules.rmbench_matrix(picked[:, :styles], picked[:, styles:])
        return {**rules.rmbench_accuracies(matrix), "matrix": (matrix * 100.0).tolist()}

    return len(scored), rmbench


def _common(frames: Sequence[pd.DataFrame | None], column: str) -> list[str]:
    """Ids every model scored, in the first model's order."""
    present = [f for f in frames if f is not None]
    if not present:
        return []
    shared = set.intersection(*(set(f[column]) for f in present))
    return [i for i in present[0][column] if i in shared]


def _paired_draws(
    scorers: Sequence[Scorer], n: int, draws: int, rng: np.random.Generator
) -> list[np.ndarray] | None:
    """Each model's score on `draws` resamples of the units (the same indices for all), or None
    when some resample leaves a score undefined (a Ties sample without a ref/tied couple)."""
    out = [np.empty(draws) for _ in scorers]
    for d in range(draws):
        idx = rng.integers(0, n, size=n)
        for samples, score in zip(out, scorers, strict=True):
            value = score(idx)["score"]
            if value is None:
                return None
            samples[d] = value
    return out


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
    level = params.evaluate.ci
    out_s: dict[str, Any] = {"targets": {}, "overall": {}}
    out_t: dict[str, Any] = {"targets": {}, "overall": {}}
    for target, adapter in targets.items():
        if adapter.benchmark == "rewardbench":
            keep = _common([student[target], teacher[target]], "pair_id")
        else:
            keep = _common([student_groups.get(target), teacher_groups.get(target)], "group_id")
        built = [
            scorer(
                target,
                adapter,
                pairs[target],
                frames[target],
                gold_groups.get(target, []),
                groups.get(target),
                keep,
            )
            for frames, groups in ((student, student_groups), (teacher, teacher_groups))
        ]
        n = built[0][0]
        scores = [score(None) for _, score in built]
        s, t = scores[0]["score"], scores[1]["score"]
        gain = None if s is None or t is None else s - t
        drawn = None
        if gain is not None:
            rng = metrics.split_seed(params.seed, f"benchmark:{target}")
            drawn = _paired_draws([score for _, score in built], n, params.evaluate.bootstrap, rng)
        ci = None
        if drawn is not None:
            ci = {
                "score": metrics.interval(drawn[0], level),
                "teacher": metrics.interval(drawn[1], level),
                "aog": metrics.interval(drawn[0] - drawn[1], level),
            }
        about = {"benchmark": adapter.benchmark, "section": adapter.section, "rule": rule_of(adapter), "n": n}
        out_s["targets"][target] = {
            **about,
            **scores[0],
            "aog": gain,
            "nts": None if gain is None else gain - regression,
            "ci": ci,
        }
        out_t["targets"][target] = {**about, **scores[1], "ci": ci and {"score": ci["teacher"]}}
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


def _num(value: float | None, ci: Sequence[float] | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{value:.1f}"


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
            ci = cell.get("ci") or {}
            row += [
                _num(cell["score"], ci.get("score")),
                _num(cell.get("aog"), ci.get("aog")),
                _num(cell.get("nts")),
            ]
        row += [_num(block["overall"][b]["score"]) for b in benches]
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    rules_text = "\n".join(f"- `{t}`: {first['targets'][t]['rule']}." for t in targets)
    return (
        "## Benchmark targets (official scoring)\n\n"
        "Each benchmark section scored by the benchmark's own rule (pp), teacher and students on the same "
        "examples; AOG and NTS here use that score, while the main table's accuracy on the same target is "
        "prefshift's pairwise accuracy (a tie counts half). Brackets: paired bootstrap intervals over the "
        "target's examples (none for NTS).\n\n" + rules_text + "\n\n" + "\n".join(lines)
    )

"""The README's benchmark numbers, written from reports/bench.json and never by hand.

`prefshift bench ... --readme README.md` (or `python -m prefshift.bench.readme`, which reads
an existing bench.json) replaces what lies between the two marker lines with a table built
from the result, headed by its date, machine and how many invocations it merges. A README
without the markers is refused, so numbers cannot end up in a second, stale copy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prefshift.bench.pipeline import DEFAULT_PARAMS
from prefshift.bench.report import measured_on
from prefshift.core.atomic import write_text
from prefshift.core.errors import PrefshiftError

START = "<!-- bench-numbers:start (written by `prefshift bench --readme`; do not edit) -->"
END = "<!-- bench-numbers:end -->"
MODELS = {"tiny_2x64": "Llama 2×64", "small_4x256": "Llama 4×256"}


class ReadmeError(PrefshiftError):
    """A README whose numbers block cannot be found or rewritten."""


def _spread(r: dict) -> str:
    low, high = (
        (r["invocation_min"], r["invocation_max"])
        if "invocation_min" in r
        else (r["round_min"], r["round_max"])
    )
    return f"{r['ratio']:.2f}× ({low:.2f}–{high:.2f})"


def _tick(target: dict | None) -> str:
    return "" if target is None else ("✓" if target["met"] else "✗")


def _in_order(models: dict) -> list[str]:
    """Smallest model first (bench.json's keys are sorted by name)."""
    return sorted(models, key=lambda m: list(MODELS).index(m) if m in MODELS else len(MODELS))


def _training_rows(training: dict) -> list[str]:
    rows = []
    for model in _in_order(training["models"]):
        entry = training["models"][model]
        name, vs = MODELS.get(model, model), entry["vs_ours"]
        if "trl" in vs:
            rows.append(
                f"| training pairs/s, ours ÷ `trl.RewardTrainer`, {name} | {_spread(vs['trl'])}"
                f" | ≥ 1.3 {_tick(entry['target'])} |"
            )
        if "trl_group_by_length" in vs:
            rows.append(
                f"| … ÷ TRL with its length-grouped sampler, {name}"
                f" | {_spread(vs['trl_group_by_length'])} | — |"
            )
        if "trl_group_by_length_as_shipped" in vs:
            rows.append(
                f"| … ÷ TRL as shipped (bf16 autocast, gradient checkpointing), {name}"
                f" | {_spread(vs['trl_group_by_length_as_shipped'])} | — |"
            )
        if "ours_two_sequence" in vs:
            rows.append(
                f"| … shared-prefix forward ÷ two sequences per pair (our loop), {name}"
                f" | {_spread(vs['ours_two_sequence'])} | — |"
            )
        rows.append(
            f"| … ours ÷ bare PyTorch loop (random batches), {name} | {_spread(vs['bare_torch_loop'])} | — |"
        )
        if "side_work" in entry:
            share = entry["side_work"]["ours"]["share_of_wall"]["median"]
            rows.append(
                f"| … share of our wall time in drift probes (TRL runs none), {name}"
                f" | {100 * share:.0f}% | — |"
            )
    return rows


def _realistic_rows(section: dict) -> list[str]:
    """Issue 35's rows: the shared-prefix forward on HH-like lengths, where pairs share prompts."""
    if "shared_over_two_sequence" not in section:
        return []
    name = MODELS.get(section["workload"]["model"], section["workload"]["model"])
    target, per_pair = section["target"], section["tokens_per_pair"]
    shared_met = _tick({"met": target["shared_over_two_sequence_met"]})
    rows = [
        f"| HH-like lengths, {name}: shared-prefix forward ÷ two sequences per pair, pairs/s"
        f" | {_spread(section['shared_over_two_sequence'])}"
        f" | ≥ {target['shared_over_two_sequence_min']} {shared_met} |",
        f"| HH-like lengths, {name}: … peak RSS, shared ÷ two sequences"
        f" | {target['rss_shared_over_two_sequence']:.2f}×"
        f" | ≤ {target['rss_shared_over_two_sequence_max']:.2f} {_tick({'met': target['rss_met']})} |",
        f"| HH-like lengths, {name}: computed tokens per pair, shared / two sequences / limit (prompt +"
        f" chosen + rejected) | {per_pair['ours']:.0f} / {per_pair['ours_two_sequence']:.0f} /"
        f" {per_pair['limit']:.0f} | — |",
    ]
    if "ours_over_trl" in section:
        rows.append(
            f"| HH-like lengths, {name}: ours ÷ `trl.RewardTrainer` at its defaults, pairs/s"
            f" | {_spread(section['ours_over_trl'])}"
            f" | ≥ {target['ours_over_trl_min']} {_tick({'met': target['ours_over_trl_met']})} |"
        )
    return rows


def _at_most(r: dict, limit: float) -> str:
    return f"≤ {limit:.2f} {'✓' if r['ratio'] <= limit else '✗'}"


def _anchor_rows(anchor: dict) -> list[str]:
    rows = []
    for model in _in_order(anchor):
        ratios = anchor[model]["ratios"]
        shared, cached = ratios["anchor_shared"], ratios["anchor_cached"]
        name = MODELS.get(model, model)
        epochs = anchor[model]["workload"]["epochs"]
        rows += [
            f"| {name}: ANCHOR on the shared reference ÷ naive, wall time ({epochs} epoch(s))"
            f" | {_spread(shared['wall'])} | {_at_most(shared['wall'], shared['target']['wall'])} |",
            f"| {name}: … with the one-off reference fill amortised over a λ sweep"
            f" | {_spread(shared['wall_with_fill_amortised'])} | — |",
            f"| {name}: ANCHOR on the shared reference ÷ naive, peak RSS | {_spread(shared['peak_rss'])}"
            f" | {_at_most(shared['peak_rss'], shared['target']['peak_rss'])} |",
            f"| {name}: ANCHOR with its own in-run cache ÷ naive, wall time"
            f" | {_spread(cached['wall'])} | {_at_most(cached['wall'], cached['target']['wall'])} |",
            f"| {name}: ANCHOR uncached ÷ naive, wall time"
            f" | {_spread(ratios['anchor_uncached']['wall'])} | — |",
            f"| {name}: LoRA ANCHOR (shared base) ÷ LoRA naive, wall time"
            f" | {_spread(ratios['lora_anchor_shared_base']['wall'])} | — |",
        ]
    return rows


def _evaluation_rows(evaluation: dict) -> list[str]:
    models = {m: evaluation["models"][m] for m in _in_order(evaluation["models"])}
    names = " / ".join(MODELS.get(m, m).removeprefix("Llama ") for m in models)
    values = " / ".join(_spread(e["batched_over"]["per_pair"]) for e in models.values())
    met = all(e["target"]["met"] for e in models.values())
    target = next(iter(models.values()))["target"]["batched_over_per_pair_min"]
    return [
        f"| scoring, batched length-sorted ÷ one pair at a time, {names} | {values}"
        f" | ≥ {target:g} {'✓' if met else '✗'} |"
    ]


def _pipeline_rows(pipeline: dict | None) -> list[str]:
    if not pipeline:
        return []
    labels = {
        "full_repro_s": (f"full `dvc repro` of {_params_name(pipeline)}", "{:.0f} s", "≤ {:.0f} s"),
        "noop_repro_s": ("no-op `dvc repro`", "{:.1f} s", "≤ {:.0f} s"),
        "max_stage_peak_rss_mb": ("peak RSS of any embedded-default stage", "{:.0f} MB", "≤ {:.0f} MB"),
    }
    when = f" (measured {pipeline['date']}{measured_on(pipeline)})" if pipeline.get("date") else ""
    rows = []
    for key, (label, value, limit) in labels.items():
        target = pipeline["targets"].get(key)
        goal = f"{limit.format(target['max'])} {_tick(target)}" if target else "—"
        rows.append(f"| {label}{when} | {value.format(pipeline[key])} | {goal} |")
    return rows


def _params_name(pipeline: dict) -> str:
    """What the pipeline rows timed: the embedded default, or the params file `--pipeline-params`
    named (a full bench run with it, whose block `python -m prefshift.bench.readme` writes)."""
    params = pipeline.get("params", DEFAULT_PARAMS)
    return "the embedded default" if params == DEFAULT_PARAMS else f"`{params}`"


def readme_block(result: dict) -> str:
    """The lines between the markers (markers included) for `result` (a bench.json)."""
    m, settings = result["machine"], result["settings"]
    invocations = settings.get("invocations", 1)
    spread = "min–max over invocations" if invocations > 1 else "min–max over rounds"
    lines = [
        START,
        f"Measured {result['date']} on {m['cpu']} ({m['cores']} cores), {settings['threads']} torch thread;"
        f" {invocations} invocation(s) of {settings['reps']} interleaved rounds"
        f" (`{settings['command']}`). Ratios are medians ({spread}).",
    ]
    models = (result.get("training") or {}).get("models", {})
    if any("settings" not in entry for entry in models.values()):
        lines.append(
            "This result predates the equal-work check (issue 18): its TRL rows ran `RewardConfig`'s"
            " defaults, bf16 autocast and gradient checkpointing, against our fp32 loop."
        )
    if result.get("note"):
        lines.append(f"Note: {result['note']}")
    lines += [
        "",
        f"| comparison (same model, data, batch, steps) | ratio, median ({spread}) | target |",
        "|---|---|---|",
    ]
    if result.get("training"):
        lines += _training_rows(result["training"])
    if result.get("realistic"):
        lines += _realistic_rows(result["realistic"])
    if result.get("anchor"):
        lines += _anchor_rows(result["anchor"])
    if result.get("evaluation"):
        lines += _evaluation_rows(result["evaluation"])
    lines += _pipeline_rows(result.get("pipeline"))
    return "\n".join([*lines, END])


def update_readme(readme: Path, result: dict) -> None:
    """Replace the numbers block of `readme` with `readme_block(result)` (atomically)."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ReadmeError(
            f"{readme} has no benchmark numbers block: put the lines\n{START}\n{END}\n"
            "where the figures belong, then run this again"
        )
    write_text(readme, text[:start] + readme_block(result) + text[end + len(END) :])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prefshift.bench.readme", description=__doc__)
    parser.add_argument("--bench", type=Path, default=Path("reports/bench.json"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    args = parser.parse_args(argv)
    update_readme(args.readme, json.loads(args.bench.read_text()))
    print(f"rewrote the benchmark numbers in {args.readme} from {args.bench}")


if __name__ == "__main__":
    main()

"""reports/bench.json and the markdown table the README quotes."""

from __future__ import annotations

from pathlib import Path

from prefshift.bench import realistic
from prefshift.bench.pipeline import DEFAULT_PARAMS
from prefshift.core.atomic import write_json, write_text


def _range(s: dict, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def _ratio(r: dict) -> str:
    if "invocation_min" in r:  # merged from several invocations
        return (
            f"{r['ratio']:.2f}x (invocations {r['invocation_min']:.2f}–{r['invocation_max']:.2f};"
            f" rounds {r['round_min']:.2f}–{r['round_max']:.2f})"
        )
    return f"{r['ratio']:.2f}x ({r['round_min']:.2f}–{r['round_max']:.2f}; best runs {r['best_runs']:.2f}x)"


def _settings(s: dict) -> str:
    optimizer = s["optimizer"]["kernel"] if s.get("optimizer") else "—"
    return (
        f"{s['precision']} | {s['attn_implementation']} | {'on' if s['gradient_checkpointing'] else 'off'}"
        f" | {s['pad_to_multiple_of']} | {s['threads']} | {optimizer}"
    )


def _work_lines(entry: dict) -> list[str]:
    """The equal-work check, the settings table and why rows differ."""
    work = entry["workload"]["work"]
    lines = [
        f"Every variant trained on the same {work['pairs']} pairs and {work['real_tokens']} real tokens"
        f" (fingerprint {work['fingerprint']}, checked per run).",
        "",
        "| variant | computed tokens | no-grad forwards (real tokens; share of wall) | precision | attention"
        " | gradient checkpointing | pad multiple | threads | AdamW kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, settings in entry["settings"].items():
        side = entry["side_work"][name]
        share = 100 * side["share_of_wall"]["median"]
        lines.append(
            f"| {name} | {entry['computed_tokens'][name]}"
            f" | {side['no_grad_forwards']} ({side['real_tokens']}; {share:.1f}%) | {_settings(settings)} |"
        )
    return [
        *lines,
        "",
        "Computed tokens differ only by padding (the batching under test). Our loop's no-grad forwards are"
        " its drift probes (a fixed batch before the first step and after the last): work TRL does not do,"
        " inside our timed run. The bare loop keeps torch's defaults. A `_as_shipped` TRL row runs"
        " `RewardConfig`'s defaults, bf16 autocast and gradient checkpointing, and an `ours_bf16` row our"
        " loop with `train.precision: bf16`: other arithmetic, so their ratios are not like-for-like.",
        "",
    ]


def _without_side_work(entry: dict) -> list[str]:
    """Ours ÷ TRL with our drift probes' time taken out of our wall (a decomposition, not the target)."""
    steps = entry.get("vs_ours_without_side_work", {}).get("trl")
    if steps is None:
        return []
    share = 100 * entry["side_work"]["ours"]["share_of_wall"]["median"]
    return [
        f"Our drift probes took {share:.0f}% of our wall (median); with their measured time taken out,"
        f" ours ÷ trl would be {_ratio(steps)}. The target is judged on the whole loop.",
        "",
    ]


def _met(target: dict | None) -> str:
    if target is None:
        return "n/a"
    return "met" if target["met"] else "**missed**"


def _training(section: dict) -> list[str]:
    lines = ["## Training throughput vs TRL", ""]
    if section.get("trl_skipped"):
        lines += [f"TRL comparison skipped: {section['trl_skipped']}", ""]
    for model, entry in section["models"].items():
        work = entry["workload"]
        eff = work["padding_efficiency"]
        lines += [
            f"### {model}",
            "",
            f"{work['pairs']} pairs x {work['epochs']} epoch(s) = {work['optimizer_steps']} optimizer steps"
            f" per run (batch {work['batch_size']} pairs, max length {work['max_length']}, fp32,"
            " dropout off);"
            f" mean {work['mean_tokens_per_sequence']:.0f} tokens per sequence. Real ÷ computed tokens: "
            + ", ".join(f"{k} {v:.2f}" for k, v in eff.items())
            + ".",
            "",
            "| variant | pairs/s median (min–max) | real tokens/s median | ours ÷ variant | peak RSS MB |",
            "|---|---|---|---|---|",
        ]
        for name, rate in entry["pairs_per_s"].items():
            vs = "—" if name == "ours" else _ratio(entry["vs_ours"][name])
            tokens = entry["real_tokens_per_s"][name]["median"]
            rss = entry["peak_rss_mb"][name]["median"]
            lines.append(f"| {name} | {_range(rate)} | {tokens:.0f} | {vs} | {rss:.0f} |")
        lines += ["", f"Target ours ÷ trl >= 1.3: {_met(entry['target'])}.", ""]
        lines += [*_without_side_work(entry), *_work_lines(entry)]
    return lines


def _anchor(sections: dict) -> list[str]:
    lines = ["## ANCHOR overhead", ""]
    for section in sections.values():
        lines += _anchor_model(section)
    return lines


def _anchor_model(section: dict) -> list[str]:
    work = section["workload"]
    shared = section["shared_reference"]
    amortised = section["ratios"]["anchor_shared"]["wall_with_fill_amortised"]
    lines = [
        f"### {work['model']}",
        "",
        f"{work['pairs']} pairs, {work['epochs']} epoch(s), batch {work['batch_size']};"
        " every run in a fresh process. `anchor_shared` reads the reference stage's stored states;"
        f" their one-off fill (layers {shared['layers']}) took {shared['fill_s']:.2f} s, so amortised over"
        f" {shared['amortised_over_runs']} anchor runs (4 λ × anchor_last, anchor_mid) anchor_shared ÷ naive"
        f" wall is {_ratio(amortised)}.",
        "",
        "| variant | wall s median (min–max) | of which cache fill s | of which reference reads s"
        " | peak RSS MB | RSS added by training MB |",
        "|---|---|---|---|---|---|",
    ]
    reads = section.get("reference_read_s", {})
    for name, wall in section["wall_s"].items():
        read = _range(reads[name]) if name in reads else "—"
        lines.append(
            f"| {name} | {_range(wall)} | {_range(section['reference_fill_s'][name])} | {read}"
            f" | {_range(section['peak_rss_mb'][name], '{:.0f}')}"
            f" | {_range(section['peak_increment_mb'][name], '{:.0f}')} |"
        )
    lines += [
        "",
        "The cache fill is one gradient-free forward pass per example before the first step;"
        " the `wall without fill` column is the variant's wall time minus its fill, over the baseline's."
        " Reference reads are the per-step time spent getting the reference states: a gather from the"
        " stored shards, a lookup in the in-run cache, or the frozen forward pass.",
        "",
        "| variant ÷ baseline | wall | wall without fill | peak RSS | RSS added by training | target |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in section["ratios"].items():
        target = r.get("target")
        goal = f"wall <= {target['wall']}, RSS <= {target['peak_rss']}: {_met(target)}" if target else ""
        lines.append(
            f"| {name} ÷ {r['baseline']} | {_ratio(r['wall'])} | {_ratio(r['wall_without_cache_fill'])}"
            f" | {_ratio(r['peak_rss'])}"
            f" | {_ratio(r['peak_increment'])} | {goal} |"
        )
    return [*lines, ""]


def _evaluation(section: dict) -> list[str]:
    lines = ["## Evaluation throughput", ""]
    for model, entry in section["models"].items():
        work = entry["workload"]
        lines += [
            f"### {model}",
            "",
            f"{work['pairs']} test pairs, batch {work['batch_size']}, max length {work['max_length']}.",
            "",
            "| variant | pairs/s median (min–max) | batched ÷ variant | max abs margin difference |",
            "|---|---|---|---|",
        ]
        for name, rate in entry["pairs_per_s"].items():
            vs = "—" if name == "batched_sorted" else _ratio(entry["batched_over"][name])
            diff = entry["max_abs_margin_difference"][name]
            lines.append(f"| {name} | {_range(rate)} | {vs} | {diff:.1e} |")
        target = entry["target"]
        lines += [
            "",
            f"Target batched ÷ per_pair >= {target['batched_over_per_pair_min']}: {_met(target)}.",
            "",
        ]
    return lines


def _stage_threads(pipeline: dict) -> str:
    """Each stage's torch threads, for sections that recorded them (since 2026-12-06)."""
    if pipeline.get("threads"):
        return f"{pipeline['threads']} torch thread(s) per stage"
    if "cores" in pipeline:
        return f"torch's default threads per stage (one per core: {pipeline['cores']})"
    return ""


def measured_on(pipeline: dict) -> str:
    """The words `on <CPU>` (with its threads and command, where known) for a pipeline section
    measured apart from the rest of its result (`bench --pipeline-only` into a full result), else
    nothing."""
    threads = f", {threads}" if (threads := _stage_threads(pipeline)) else ""
    command = f", by `{pipeline['command']}`" if pipeline.get("command") else ""
    return f" on {pipeline['cpu']}{threads}{command}" if pipeline.get("cpu") else ""


def _pipeline(section: dict | None) -> list[str]:
    lines = ["## Pipeline", ""]
    if not section:
        return [*lines, "Not measured in this run (`prefshift bench --pipeline`).", ""]
    if section.get("date"):
        lines += [f"Measured {section['date']}{measured_on(section)}.", ""]
    elif threads := _stage_threads(section):
        lines += [f"Threads: {threads}.", ""]
    lines += ["| measure | value | limit | |", "|---|---|---|---|"]
    for key, target in section["targets"].items():
        lines.append(f"| {key} | {section[key]:.1f} | {target['max']:.0f} | {_met(target)} |")
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in section["stages_s"].items())
    lines += ["", f"Params: {section.get('params', DEFAULT_PARAMS)}.", ""]
    return [*lines, *_method_costs(section.get("method_costs") or {}), f"Stages: {stages}.", ""]


def _method_costs(costs: dict) -> list[str]:
    """Each method's train stage against naive's (bench.pipeline.method_costs)."""
    if len(costs) < 2:
        return []
    lines = ["| method | train stage (every seed, one process) | ÷ naive |", "|---|---|---|"]
    for method, cost in costs.items():
        ratio = "—" if cost["vs_naive"] is None else f"{cost['vs_naive']:.2f}×"
        lines.append(f"| {method} | {cost['stage_s']:.1f} s | {ratio} |")
    return [*lines, ""]


def render_markdown(result: dict) -> str:
    m = result["machine"]
    v = result["versions"]
    lines = [
        "# prefshift benchmarks",
        "",
        f"{result['date']} on {m['cpu']} ({m['cores']} cores),"
        f" {result['settings']['threads']} torch thread(s); load average at start {m['load_avg_1_5_15']}"
        + (f", at end {m['load_avg_at_end']}." if m.get("load_avg_at_end") else "."),
        f"torch {v['torch']}, transformers {v['transformers']}, accelerate {v['accelerate']},"
        f" trl {v['trl']}.",
        f"Regenerate: `{result['settings']['command']}`."
        + (
            f" Medians of {result['settings']['reps']} interleaved repetitions, (min–max), the variants'"
            " order reversed every other round; ratios are median ÷ median, (min–max) over the paired"
            " rounds, and the ratio of each variant's best run."
            if result.get("training")
            else " One `dvc repro` of the pipeline (`--pipeline-only`), each stage a fresh process."
        ),
        "",
    ]
    invocations = result["settings"].get("invocations", 1)
    if invocations > 1:
        lines[-1:-1] = [
            f"Merged from {invocations} separate invocations ({', '.join(result['invocation_dates'])}):"
            " figures are medians of the invocation medians, min–max over every round; ratios are the"
            " median of the invocation ratios, with their min–max and the min–max over every round.",
        ]
        lines[2] = (
            f"{result['date']} on {m['cpu']} ({m['cores']} cores), {result['settings']['threads']} torch"
            f" thread(s); load average at the start of each invocation {m['load_avg_1_5_15']}."
        )
    if result.get("note"):
        lines += [f"Note: {result['note']}", ""]
    sections = (("training", _training), ("realistic", realistic.render), ("anchor", _anchor))
    for key, render in (*sections, ("evaluation", _evaluation)):
        if result.get(key):
            lines += render(result[key])
    lines += _pipeline(result.get("pipeline"))
    lines += ["## GPU", "", result["gpu"], ""]
    return "\n".join(lines)


def write_reports(result: dict, out_dir: Path) -> tuple[Path, Path]:
    json_path, md_path = out_dir / "bench.json", out_dir / "bench.md"
    write_json(json_path, result)
    write_text(md_path, render_markdown(result))
    return json_path, md_path

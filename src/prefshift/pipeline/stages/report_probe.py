"""The report's shortcut-cue section: where each cue sits, and what the frozen strong base exposes.

Reads reports/probe.json (written by `prefshift probe`). With the synthetic suite it also says
which cue each OOD target reverses, so the main table's target columns read as one experiment:
a target that reverses a cue the base already exposes, and one that reverses a cue fine-tuning
must build. A probe stage switched off (probe.enabled: false) leaves a file that says so, and
the section says the probe was skipped and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from prefshift.config.params import SYNTHETIC_DATASETS, Params
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.science.probe import PROBES

CUE_NAMES = {"sign_off": "sign-off (end of response)", "marker": "marker (start of response)"}
PROBE_NAMES = {**CUE_NAMES, "longer": "longer response of the pair"}


class ProbeReportError(PrefshiftError):
    pass


def load_probe(layout: Layout, version: str) -> dict[str, Any] | None:
    """reports/probe.json, refused when it was fitted on other splits than the metrics; None = absent."""
    path = layout.probe_report
    if not path.exists():
        return None
    try:
        probe = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ProbeReportError(f"{path}: not valid JSON ({err}); re-run `prefshift probe`") from None
    if str(probe.get("split_version")) != version:
        raise ProbeReportError(
            f"{path}: fitted on split version {probe.get('split_version')}, the metrics on {version}; "
            "re-run `prefshift probe`"
        )
    return probe


def cue_lines(params: Params) -> list[str]:
    """What the synthetic source and each synthetic target do with each cue; [] off-suite."""
    cfg = params.data
    if cfg.source not in SYNTHETIC_DATASETS:
        return []
    syn = params.synthetic
    strengths = {"sign_off": syn.shortcut_strength, "marker": syn.marker_strength}
    on = [
        f"{CUE_NAMES[c]} on the chosen response in {s:.0%} of pairs"
        for c, s in strengths.items()
        if s is not None
    ]
    lines = [f"- Source `{cfg.source}` (train and ID test): " + "; ".join(on) + "."]
    for target in cfg.targets:
        if target not in SYNTHETIC_DATASETS:
            continue
        reversed_cues = syn.target_cues.get(target, [c for c, s in strengths.items() if s is not None])
        kept_out = [c for c, s in strengths.items() if s is not None and c not in reversed_cues]
        text = ", ".join(f"{CUE_NAMES[c]} reversed ({1 - strengths[c]:.0%} on chosen)" for c in reversed_cues)
        if kept_out:
            text += ("; " if text else "") + ", ".join(CUE_NAMES[c] for c in kept_out) + " left out"
        lines.append(f"- Target `{target}`: {text or 'no cue'}.")
    return lines


def _cell(result: Mapping[str, Any] | None) -> str:
    if result is None:
        return "—"
    lo, hi = result["ci"]
    call = "readable" if result["readable"] else "at chance"
    return f"{result['acc']:.1f} [{lo:.1f}, {hi:.1f}] {call}"


def probe_table(probe: Mapping[str, Any]) -> str:
    layers: Sequence[int] = probe["layers"]
    header = [
        "Label",
        "chance",
        *[f"layer {k}" + (" (read by the head)" if k == probe["last_layer"] else "") for k in layers],
    ]
    rows = []
    for name in PROBES:
        by_layer = probe["probes"].get(name)
        if not by_layer:
            continue
        chance = next(r["chance"] for r in by_layer.values() if r is not None)
        rows.append([PROBE_NAMES[name], f"{chance:.1f}", *[_cell(by_layer.get(str(k))) for k in layers]])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def probe_section(params: Params, probe: Mapping[str, Any] | None) -> str | None:
    cues = cue_lines(params)
    if probe is None and not cues:
        return None
    parts = ["## Shortcut cues and what the frozen strong base exposes"]
    if probe is not None and "skipped" in probe:
        parts.append(f"probe: skipped ({probe['skipped']}).")
        probe = None
    if cues:
        parts.append(
            "Each cue sits on exactly one response of every pair, placed independently of the content, "
            "of the gold label and of the other cue.\n\n" + "\n".join(cues)
        )
    if probe is not None:
        level = round(probe["ci"] * 100)
        parts.append(
            f"Linear probes (logistic regression on standardised states) on the {probe['model']}'s "
            f"reward-position states, fitted on {probe['fit_split']} responses and scored on "
            f"{probe['test_split']} responses: held-out accuracy in %, exact {level}% binomial interval. "
            "Each cue is probed on minimal pairs (every response once with the cue and once without, "
            "nothing else changed), so a probe cannot score by reading the gold label or the other cue, "
            "which the cue correlates with in the source. "
            "*Readable*: the interval lies above chance, so a new reward head can learn the label with no "
            "change to the representation, and an anchor on hidden states cannot stop it. *At chance*: "
            "fine-tuning has to build the feature, which is what an anchor resists.\n\n" + probe_table(probe)
        )
    return "\n\n".join(parts)

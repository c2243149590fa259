"""Which outputs git tracks (`cache: false`) and which DVC caches, as dvc.yaml's header states.

A sweep task clones the baseline commit and shares the project's DVC cache (or pulls from its
remote): it restores every cached output of a stage the points share, but a `cache: false` output
that is not committed is missing there, so DVC re-runs its stage in every point (the probe and the
policy samples once were). And DVC's run cache never holds a stage with such an output
(treeverse/dvc#8738), so it cannot restore one in another clone either. Metrics, which the
baseline commit holds, and the report's and promote's files, whose stages are the last, are the
exceptions.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GIT_TRACKED_OUTS = {"report", "promote"}


def _uncached_outs(stages: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, stage in stages.items():
        for out in stage.get("outs", []):
            if isinstance(out, dict):
                found.setdefault(name, []).extend(
                    path for path, flags in out.items() if flags.get("cache") is False
                )
    return {name: paths for name, paths in found.items() if paths}


def test_only_the_last_stages_have_uncached_outputs_besides_metrics():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    uncached = _uncached_outs(stages)
    assert set(uncached) == GIT_TRACKED_OUTS, uncached
    assert "reports/summary.md" in uncached["report"]


def test_the_rule_names_an_uncached_output_of_a_shared_stage():
    """The check reads the flag as written: a `cache: false` output on the probe is caught."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    stages["probe"]["outs"] = [{"reports/probe.json": {"cache": False}}]
    assert _uncached_outs(stages)["probe"] == ["reports/probe.json"]

"""How dvc.yaml spreads seeds over stages: one stage per seed (`foreach: ${seeds}`, `--seed`) or one
per method that runs every seed (`foreach: ${methods}`, `--all-seeds`).

A stage that runs every seed must re-run when `seeds` changes: DVC sees no other change when a
seed is added (its command and its method's files stay the same), so without the `seeds` param
the new seed's targets, student or metrics would simply be missing, or an old seed's stay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from prefshift.cli import _seeds_to_run
from prefshift.config.params import ConfigError, Params

REPO = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _template(stage: dict) -> dict:
    return stage.get("do", stage)


def _paths(entries: list) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries]


ALL_SEEDS = {name: _template(s) for name, s in STAGES.items() if "--all-seeds" in _template(s)["cmd"]}
PER_SEED = {name: _template(s) for name, s in STAGES.items() if s.get("foreach") == "${seeds}"}


def test_the_per_method_stages_run_every_seed():
    assert set(ALL_SEEDS) == {"targets", "train", "evaluate", "score_target", "score_teacher"}
    assert set(PER_SEED) == {"teacher", "label", "evaluate_teacher"}
    for name in ("targets", "train", "evaluate"):
        assert STAGES[name]["foreach"] == "${methods}", name
    # A target's scores: one stage per (method, target) and per target for the teacher.
    assert STAGES["score_target"]["matrix"] == {"model": "${methods}", "target": "${data.targets}"}
    assert STAGES["score_teacher"]["foreach"] == "${data.targets}"


OWNED_END = {"score_target": "/${item.model}/${item.target}"}


@pytest.mark.parametrize("name", sorted(ALL_SEEDS))
def test_a_stage_that_runs_every_seed_reruns_when_seeds_change(name):
    template = ALL_SEEDS[name]
    assert "seeds" in template.get("params", []), f"{name}: add `seeds` to its params"
    owned = _paths(template.get("outs", []) + template.get("metrics", []))
    end = OWNED_END.get(name, "/${item}")
    assert owned and all(path.endswith(end) for path in owned), (name, owned)


@pytest.mark.parametrize("name", sorted(PER_SEED))
def test_a_per_seed_stage_names_its_seed(name):
    template = PER_SEED[name]
    assert "--seed ${item}" in template["cmd"]
    owned = _paths(template.get("outs", []) + template.get("metrics", []))
    assert owned and all("seed-${item}" in path for path in owned), (name, owned)


def test_seed_options():
    params = Params.model_validate({"seeds": [3, 1, 4]})
    assert _seeds_to_run(params, None, True) == [3, 1, 4]
    assert _seeds_to_run(params, 1, False) == [1]
    assert _seeds_to_run(params, None, False) == [None]  # for_seed then takes the first
    with pytest.raises(ConfigError, match="--seed 1 and --all-seeds"):
        _seeds_to_run(params, 1, True)


@pytest.mark.slow
def test_one_stage_trains_and_evaluates_every_seed_and_a_new_seed_reruns_it(tmp_path_factory):
    """Real DVC on the tiny project, seeds [0, 2]: train@naive and evaluate@naive each run once and
    write both seeds under the method's directory; listing one more seed re-runs them."""
    from e2e_project import project, ran_stages, run
    from tiny_project import TINY

    root, env = project(
        tmp_path_factory.mktemp("seeds"), {**TINY, "methods": ["naive"], "seeds": [0, 2]}, tmp_path_factory
    )
    output = run(["dvc", "repro", "evaluate@naive"], root, env)
    ran = ran_stages(output)
    assert {"teacher@0", "teacher@2", "label@0", "label@2", "train@naive", "evaluate@naive"} <= ran
    assert not any(stage.startswith(("train@naive-", "evaluate@naive-")) for stage in ran)
    for seed in (0, 2):
        assert (root / "models" / "students" / "naive" / f"seed-{seed}" / "config.json").is_file()
        metrics = json.loads((root / "reports" / "metrics" / "naive" / f"seed-{seed}.json").read_text())
        assert metrics["method"] == "naive" and metrics["setting"]["seed"] == seed
    assert not (root / "models" / "checkpoints" / "naive").exists()

    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, "seeds": [0, 1, 2]}, sort_keys=False))
    status = run(["dvc", "status", "targets@naive", "train@naive", "evaluate@naive"], root, env)
    assert all(f"{stage}@naive:" in status for stage in ("targets", "train", "evaluate")), status


def test_best_of_n_reruns_when_seeds_change():
    """downstream scores every seed's models in one stage whose command names no seed: its params
    say so, rather than leaving it to a changed model directory to trigger it."""
    assert "seeds" in STAGES["downstream"]["params"]

"""`prefshift promote`: register the students that pass the gate; `champion` on the best by mean NTS.

Gate (params.promote): ID accuracy ≥ teacher ID accuracy − id_tolerance, mean
AOG > min_mean_aog, and accuracy at or above chance (50%) on every target unless
allow_below_chance (a gain over a teacher at 17.8% can leave a student at 38.5%, which
ranks that target backwards), all in percentage points from reports/metrics/<method>/seed-<k>.json
(keys `id.acc`, `teacher.id.acc`, `mean_aog`, `mean_nts`, `wrg`, `targets.<k>.aog|nts`,
as written by the evaluate stage). The ceiling is never promoted: it is trained on
gold labels, so it is a reference, not a weak-to-strong student.

Aliases: `champion` on the passing student with the highest mean NTS (ties: method
name order), `candidate-<method>` on every other passing student (an MLflow alias
names one version, so each candidate needs its own). The latest gate is the project's
verdict on a method: every alias (the champion's too) on a version registered for a
method that fails now is removed, so a stricter re-run never leaves a failed model
named as a candidate or the champion. Methods that were not trained keep theirs:
there is nothing new to judge them by.

Only models that exist are judged: a listed method with neither a student nor metrics
is reported as not trained, and the ceiling, when it exists, as the reference it is.
The metrics are read only once their bytes are verified as the ones `prefshift
evaluate` wrote (`output_set.verify_file`): a hand-edited `mean_aog` is refused, not
promoted.

reports/promotion.json records every decision and reason, which version each model
has, and the aliases as read back from the registry.

Re-deciding. A model that did not change keeps its registry version, but its numbers may have:
a target added after it was trained is scored and evaluated without retraining it. Its version's
tags are brought up to date, and what changed is said: each tag that moved (`changes` per
promoted model, e.g. a new target's `aog.<target>`) and each alias that moved to another version
(`alias_changes`).

Seeds: the first seed of params `seeds` is the one gated and registered (a registry version is
one model, and picking the best seed would promote the luckiest draw); the report's verdicts are
where the seeds are compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefshift.config.params import Params, get_dotted, is_finite_number
from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.methods import label_source
from prefshift.pipeline.output_set import verify_file

CHAMPION = "champion"
CHANCE = 50.0
"""Pairwise accuracy of a coin: a student below it on a target ranks that target backwards."""
TARGET_TAGS = ("aog.", "nts.")
"""Version tags of one target's numbers (`version_tags`): a target dropped since takes its own along."""
PASS, FAIL, NOT_TRAINED, REFERENCE = "PASS", "FAIL", "not trained", "reference"


class PromoteError(PrefshiftError):
    """A metrics file that the gate cannot read; the message names the file and key."""


def _number(metrics: dict[str, Any], dotted: str, path: Path) -> float:
    try:
        node = get_dotted(metrics, dotted)
    except KeyError:
        raise PromoteError(f"{path}: key {dotted!r} missing; re-run `prefshift evaluate`") from None
    if not is_finite_number(node):
        raise PromoteError(f"{path}: key {dotted!r} must be a finite number, got {node!r}")
    return float(node)


def gate(params: Params, layout: Layout, method: str) -> dict[str, Any]:
    """{"method", "status", "passed", "reasons", and the numbers the gate used} for one method.

    status: PASS or FAIL for a student with metrics (FAIL too when one of the two is missing),
    "not trained" when it has neither, "reference" for a method trained on gold labels (the
    ceiling), which is never promoted.
    """
    path = layout.metrics(method)
    student_dir = layout.student_dir(method)
    decision: dict[str, Any] = {
        "method": method,
        "status": FAIL,
        "passed": False,
        "reasons": [],
        "gate": params.promote.model_dump(),
    }
    if not path.exists() and not student_dir.exists():
        decision["status"] = NOT_TRAINED
        decision["reasons"].append(f"neither {student_dir} nor {path} exists; `dvc repro` trains it")
        return decision
    if label_source(method) == "gold":  # the registry says what it trains on; the ceiling does
        decision["status"] = REFERENCE
        decision["reasons"].append(f"{method} is trained on gold labels; it is a reference, never promoted")
        return decision
    if not path.exists():
        decision["reasons"].append(f"{path} not found; run `prefshift evaluate --method {method}`")
        return decision
    verify_file(layout.root, path, f"prefshift evaluate --method {method}")
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise PromoteError(f"{path}: not valid JSON ({err})") from None
    id_acc = _number(metrics, "id.acc", path)
    teacher_id = _number(metrics, "teacher.id.acc", path)
    mean_aog = _number(metrics, "mean_aog", path)
    decision.update(
        id_acc=id_acc,
        teacher_id_acc=teacher_id,
        wrg=_number(metrics, "wrg", path),
        mean_aog=mean_aog,
        mean_nts=_number(metrics, "mean_nts", path),
        targets={
            name: {key: block.get(key) for key in ("acc", "aog", "nts")}
            for name, block in (metrics.get("targets") or {}).items()
        },
        data_hashes=metrics.get("data_hashes") or {},
        split_version=metrics.get("split_version"),
    )
    floor = teacher_id - params.promote.id_tolerance
    if id_acc < floor:
        decision["reasons"].append(
            f"ID accuracy {id_acc:.2f} < teacher {teacher_id:.2f} - tolerance {params.promote.id_tolerance:g}"
        )
    if not mean_aog > params.promote.min_mean_aog:
        decision["reasons"].append(f"mean AOG {mean_aog:.2f} <= {params.promote.min_mean_aog:g}")
    below = {t: _number(metrics, f"targets.{t}.acc", path) for t in decision["targets"]}
    below = {t: acc for t, acc in below.items() if acc < CHANCE}
    if below and not params.promote.allow_below_chance:
        listing = ", ".join(f"{t} {acc:.1f}%" for t, acc in below.items())
        decision["reasons"].append(
            f"below chance ({CHANCE:g}%) on {listing}; promote.allow_below_chance: true would allow it"
        )
    elif below:
        decision["below_chance_allowed"] = sorted(below)
    if not student_dir.is_dir():
        decision["reasons"].append(f"{student_dir} not found; run `prefshift train --method {method}`")
    decision["passed"] = not decision["reasons"]
    if decision["passed"]:
        decision["status"] = PASS
        decision["reasons"].append("passed the gate")
    return decision


def version_tags(decision: dict[str, Any], git: dict[str, str], pipeline_id: str) -> dict[str, str]:
    tags = {
        "method": decision["method"],
        "wrg": f"{decision['wrg']:.4f}",
        "mean_aog": f"{decision['mean_aog']:.4f}",
        "mean_nts": f"{decision['mean_nts']:.4f}",
        "split_version": str(decision.get("split_version")),
        "data_hashes": json.dumps(decision["data_hashes"], sort_keys=True),
        "prefshift.pipeline_run_id": pipeline_id,
        **{f"gate.{key}": f"{value:g}" for key, value in decision["gate"].items()},
        **git,
    }
    for name, block in decision["targets"].items():
        for key in ("aog", "nts"):
            if block.get(key) is not None:
                tags[f"{key}.{name}"] = f"{block[key]:.4f}"
    return tags


def _print_decisions(decisions: list[dict[str, Any]]) -> None:
    """One line per model that exists; the listed methods never trained share one line."""
    for d in decisions:
        if d["status"] != NOT_TRAINED:
            print(f"promote: {d['method']}: {d['status']} - {'; '.join(d['reasons'])}")
    untrained = [d["method"] for d in decisions if d["status"] == NOT_TRAINED]
    if untrained:
        print(f"promote: not trained (nothing to judge): {', '.join(untrained)}")


def _drop_failed_aliases(client: Any, name: str, decisions: list[dict[str, Any]], kept: set[str]) -> list:
    """Remove the aliases on versions of methods that fail the gate now, except the ones just set."""
    from prefshift.tracking import registry

    failed = {d["method"] for d in decisions if d["status"] == FAIL}
    removed = registry.drop_aliases_of(client, name, failed, keep=kept)
    for alias, version, method in removed:
        print(f"promote: removed alias {alias!r} from version {version} ({method}): it fails the gate now")
    return [{"alias": a, "version": v, "method": m} for a, v, m in removed]


def run(params: Params, layout: Layout) -> dict[str, Any]:
    from prefshift.tracking import registry
    from prefshift.tracking import runs as tracking

    seeded = layout.for_seed(params.seeds[0])
    decisions = [gate(params, seeded, method) for method in params.methods]
    passing = sorted((d for d in decisions if d["passed"]), key=lambda d: (-d["mean_nts"], d["method"]))
    name = params.tracking.registered_model
    result: dict[str, Any] = {"registered_model": name, "decisions": decisions, "promoted": [], "aliases": {}}
    _print_decisions(decisions)
    if params.promote.min_mean_aog < 0:
        print(
            f"promote: note: promote.min_mean_aog = {params.promote.min_mean_aog:g} admits students that are "
            "worse than their teacher out of distribution; a science gate uses 0"
        )
    if not passing:
        result["summary"] = "nothing promoted: no student passed the gate (reasons per method above)"
        if any(d["status"] == FAIL for d in decisions):
            result["removed_aliases"] = _unpromote(params, layout, decisions)
        print(f"promote: {result['summary']}")
        write_json(layout.promotion, result)
        return result

    with tracking.stage_run(params, layout, "promote") as logger:
        registry.ensure_registered_model(logger.client, name, params.tracking.experiment)
        aliases_before = dict(logger.client.get_registered_model(name).aliases)
        git = tracking.git_state(layout.root)
        encode = params.encode.model_dump(mode="json")
        for rank, decision in enumerate(passing):
            tags = version_tags(decision, git, logger.pipeline_run_id)
            version, created = registry.register(
                logger, name, seeded.student_dir(decision["method"]), tags, encode
            )
            changes = {} if created else _retag(logger.client, name, version, tags, set(git))
            alias = CHAMPION if rank == 0 else f"candidate-{decision['method']}"
            holder = registry.set_alias(logger.client, name, alias, version.version)
            result["promoted"].append(
                {
                    "method": decision["method"],
                    "version": str(version.version),
                    "new_version": created,
                    "content_hash": version.tags.get(registry.HASH_TAG),
                    "alias": alias,
                    "alias_holder": holder,
                    "mean_nts": decision["mean_nts"],
                    "changes": changes,
                }
            )
            if holder != version.version:
                print(f"promote: alias {alias!r} was moved to version {holder} by a concurrent promotion")
        kept = {p["alias"] for p in result["promoted"]}
        result["removed_aliases"] = _drop_failed_aliases(logger.client, name, decisions, kept)
        result["aliases"] = dict(sorted(logger.client.get_registered_model(name).aliases.items()))
        result["alias_changes"] = _alias_changes(aliases_before, result["aliases"])
        champion = result["promoted"][0]
        result["summary"] = f"champion: {champion['method']} (version {champion['alias_holder']})"
        logger.log_dict(result, "promotion.json")
        logger.set_tags({"promote.champion": champion["method"]})
    print(f"promote: {result['summary']}")
    write_json(layout.promotion, result)
    return result


def _retag(client: Any, name: str, version: Any, tags: dict[str, str], git: set[str]) -> dict[str, list]:
    """Bring an unchanged model's version tags up to date with this run's numbers; {tag: [was, now]}
    for each that changed (git state and the run id are where it was registered, and stay)."""
    fixed = git | {"prefshift.pipeline_run_id"}
    changed = {
        k: [version.tags.get(k), v] for k, v in tags.items() if k not in fixed and version.tags.get(k) != v
    }
    gone = [k for k in version.tags if k.startswith(TARGET_TAGS) and k not in tags]  # a dropped target's
    changed |= {k: [version.tags[k], None] for k in gone}
    for key, (_, value) in changed.items():
        if value is None:
            client.delete_model_version_tag(name, version.version, key)
        else:
            client.set_model_version_tag(name, version.version, key, value)
    if changed:
        listed = ", ".join(
            f"{k} {was if was is not None else 'new'} -> {now if now is not None else 'gone'}"
            for k, (was, now) in changed.items()
        )
        print(
            f"promote: {tags['method']} (version {version.version}) re-decided on changed numbers: {listed}"
        )
    return changed


def _alias_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list]:
    """{alias: [version before, version now]} for each alias that moved, appeared or went."""
    changed = {
        alias: [
            None if before.get(alias) is None else str(before.get(alias)),
            None if after.get(alias) is None else str(after.get(alias)),
        ]
        for alias in sorted(set(before) | set(after))
        if str(before.get(alias)) != str(after.get(alias))
    }
    for alias, (was, now) in changed.items():
        print(f"promote: alias {alias!r}: version {was or '(none)'} -> {now or '(none)'}")
    return changed


def _unpromote(params: Params, layout: Layout, decisions: list[dict[str, Any]]) -> list:
    """With nothing passing, only aliases go: removed from versions of the methods that fail now."""
    from prefshift.tracking import registry
    from prefshift.tracking import runs as tracking

    name = params.tracking.registered_model
    with tracking.stage_run(params, layout, "promote") as logger:
        if not registry.is_registered(logger.client, name):
            return []
        removed = _drop_failed_aliases(logger.client, name, decisions, set())
        logger.log_dict({"decisions": decisions, "removed_aliases": removed}, "promotion.json")
    return removed

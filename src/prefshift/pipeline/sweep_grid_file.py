"""A sweep written down as a file (`--grid-file`), and what it would cost in GPU-hours.

A paper's grid is not one cross product: every method runs at its default settings, while the
λ and layer ablations concern ANCHOR alone. So a grid file is a list of blocks, each a cross
product of axes, and the sweep runs the union of their points:

    bundles:                     # named sets of params that change together
      setting: {harmless: {data.category: harmless, data.source: hh_harmless, ...}, ...}
    blocks:
      - name: lambda
        axes: {setting: [harmless, helpful], anchor.lambda: [1.0e-4, 1.0e-2, 1], seed: [1, 2, 3]}
        set: {methods: [anchor_last, anchor_mid]}   # the same for every point of the block
    estimate: ...                # see `estimate`

An axis named in `bundles` takes bundle names as values; any other axis is a dotted param. Values
become `-S key=value` overrides, so everything `-S` accepts a file accepts, and a typo fails on the
first point, before anything runs (`sweep.check_distinct` loads every point's params).

The estimate is on paper: tokens to train (pairs × 2 responses × tokens per sequence × epochs,
from the file's data sizes) divided by a per-token training rate, for the teacher and for every
student a point trains. The file says where its sizes and rates come from, and the dry run
prints that beside the number.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from prefshift.config.params import load_params, read_yaml
from prefshift.pipeline.sweep import SweepError

FILE_KEYS = {"description", "bundles", "blocks", "estimate", "methods_collected"}


def _text(value: Any) -> str:
    """A YAML value as `-S` text: scalars as written, lists and maps as flow YAML (JSON is YAML)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


@dataclass
class GridFile:
    path: Path
    points: list[dict[str, str]]
    labels: list[dict[str, str]]
    """Per point, each axis's value as written (a bundle's name, not its params), for the estimate."""
    estimate: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    methods_collected: list[str] = field(default_factory=list)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise SweepError(f"{where}: expected a mapping, got {type(value).__name__}")
    return dict(value)


def load_grid_file(path: Path) -> GridFile:
    path = Path(path)
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise SweepError(f"--grid-file {path}: no such file") from None
    raw = _mapping(raw, str(path))
    if unknown := set(raw) - FILE_KEYS:
        raise SweepError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(FILE_KEYS))}"
        )
    bundles = {
        axis: _mapping(b, f"{path}: bundles.{axis}")
        for axis, b in _mapping(raw.get("bundles") or {}, f"{path}: bundles").items()
    }
    blocks = raw.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise SweepError(f"{path}: `blocks` must list at least one block (axes, and optionally set)")
    points, labels, seen = [], [], set()
    for number, block in enumerate(blocks, 1):
        named = block.get("name", "unnamed") if isinstance(block, Mapping) else repr(block)
        where = f"{path}: block {number} ({named})"
        block = _mapping(block, where)
        axes = _mapping(block.get("axes") or {}, f"{where}: axes")
        fixed = {
            key: _text(value) for key, value in _mapping(block.get("set") or {}, f"{where}: set").items()
        }
        for axis, values in axes.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"{where}: axis {axis!r} needs a list of values")
            unknown = [v for v in values if axis in bundles and str(v) not in bundles[axis]]
            if unknown:
                raise SweepError(
                    f"{where}: {axis} {unknown[0]!r} is not in bundles.{axis} ({', '.join(bundles[axis])})"
                )
        for combo in itertools.product(*axes.values()):
            point: dict[str, str] = {}
            label: dict[str, str] = {}
            for axis, value in zip(axes, combo, strict=True):
                label[axis] = _text(value)
                if axis in bundles:
                    point.update({k: _text(v) for k, v in bundles[axis][str(value)].items()})
                else:
                    point[axis] = _text(value)
            point.update(fixed)
            key = json.dumps(point, sort_keys=True)
            if key not in seen:  # blocks may overlap; a point runs once
                seen.add(key)
                points.append(point)
                labels.append({**label, **{k: v for k, v in fixed.items() if k not in label}})
    return GridFile(
        path,
        points,
        labels,
        _mapping(raw.get("estimate") or {}, f"{path}: estimate"),
        str(raw.get("description") or ""),
        list(raw.get("methods_collected") or []),
    )


@dataclass
class Estimate:
    points: int
    teacher_runs: int
    student_runs: int
    teacher_hours: float
    student_hours: float
    notes: list[str]

    @property
    def gpu_hours(self) -> float:
        return self.teacher_hours + self.student_hours

    def lines(self) -> list[str]:
        return [
            f"points: {self.points}",
            f"trainings: {self.student_runs} students, {self.teacher_runs} teachers (one per point: an upper "
            "bound, since a point pulls a teacher it shares with the baseline instead of training it)",
            f"estimated GPU-hours (training only): {self.gpu_hours:,.0f} "
            f"(students {self.student_hours:,.0f}, teachers {self.teacher_hours:,.0f})",
            *self.notes,
        ]


def _methods(point: Mapping[str, str], params_path: Path) -> list[str]:
    if "methods" in point:
        return list(yaml.safe_load(point["methods"]))
    return list(load_params(params_path).methods)


def estimate(grid: GridFile, params_path: Path) -> Estimate:
    """GPU-hours to train every point's teacher and students, from the file's `estimate` section:

        estimate:
          data_axis: setting         # the axis whose label picks the data sizes
          rate_axis: family          # the axis whose label picks the training rates
          data: {harmless: {train_pairs: 42537, tokens_per_sequence: 250, source: "..."}}
          rates: {llama: {weak: 46000, strong: 7200, strong_full: 5400, source: "..."}}  # tokens/s/GPU
          epochs: {teacher: 1, student: 1}

    The source split's train pairs are halved between teacher and students (the split protocol);
    each pair is two sequences (chosen and rejected). `strong_full`, where given, is the rate of a
    student whose point turns LoRA off (`student.lora.enabled: false`). Scoring, labelling, generation and
    best-of-n are forward passes and are not counted."""
    spec = grid.estimate
    where = f"{grid.path}: estimate"
    try:
        data_axis, rate_axis = spec["data_axis"], spec["rate_axis"]
        data, rates = _mapping(spec["data"], f"{where}.data"), _mapping(spec["rates"], f"{where}.rates")
    except KeyError as err:
        raise SweepError(
            f"{where}: no {err.args[0]!r}; the dry run's estimate needs data sizes and rates"
        ) from None
    epochs = _mapping(spec.get("epochs") or {"teacher": 1, "student": 1}, f"{where}.epochs")
    teacher_s = student_s = 0.0
    students = 0
    for point, label in zip(grid.points, grid.labels, strict=True):
        try:
            sizes, rate = data[label[data_axis]], rates[label[rate_axis]]
        except KeyError as err:
            raise SweepError(f"{where}: no entry for {err.args[0]!r} (point {label})") from None
        tokens = sizes["train_pairs"] / 2 * 2 * sizes["tokens_per_sequence"]
        teacher_s += tokens * epochs["teacher"] / rate["weak"]
        trained = len(_methods(point, params_path))
        students += trained
        full = point.get("student.lora.enabled") == "false" and "strong_full" in rate
        student_s += trained * tokens * epochs["student"] / rate["strong_full" if full else "strong"]
    notes = [f"data ({name}): {entry.get('source', 'no source given')}" for name, entry in data.items()]
    notes += [f"rates ({name}): {entry.get('source', 'no source given')}" for name, entry in rates.items()]
    return Estimate(len(grid.points), len(grid.points), students, teacher_s / 3600, student_s / 3600, notes)


def describe_points(
    points: Sequence[Mapping[str, str]], labels: Sequence[Mapping[str, str]], shown: int = 3
) -> list[str]:
    """The first few points by their labels, for a dry run to show what the grid is made of."""
    lines = [" ".join(f"{k}={v}" for k, v in label.items()) for label in labels[:shown]]
    if len(points) > shown:
        lines.append(f"... and {len(points) - shown} more")
    return lines

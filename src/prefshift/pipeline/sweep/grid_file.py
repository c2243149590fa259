"""A sweep written down as a file (`--grid-file`), and what it would cost in GPU-hours.

A paper's grid is not one cross product (every method at its defaults, λ and layers for ANCHOR
alone), so a grid file lists blocks, each a cross product of axes, and the sweep runs the union of
their points (configs/paper-grid.yaml). An axis named in `bundles` takes bundle names (a bundle sets
several params at once); `set` gives a whole block the same values.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from prefshift.config.params import Params, read_yaml
from prefshift.core.reading import MIB, read_regular
from prefshift.pipeline.sweep.commands import SweepError
from prefshift.pipeline.sweep.grid import MAX_POINTS, check_one_source, check_size

MAX_FILE_BYTES = MIB  # the paper's grid is 6 KB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Block(_Strict):
    name: str = "unnamed"
    axes: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(min_length=1)
    set: dict[str, Any] = {}


class DataSize(_Strict):
    train_pairs: PositiveInt
    tokens_per_sequence: PositiveInt
    source: str = "no source given"


class Rate(_Strict):
    weak: PositiveFloat
    strong: PositiveFloat
    strong_full: PositiveFloat | None = None
    source: str = "no source given"


class Epochs(_Strict):
    teacher: PositiveFloat = 1
    student: PositiveFloat = 1


class EstimateSpec(_Strict):
    data_axis: str
    rate_axis: str
    data: dict[str, DataSize]
    rates: dict[str, Rate]
    epochs: Epochs = Epochs()


class GridSpec(_Strict):
    description: str = ""
    methods_collected: list[str] = []
    bundles: dict[str, dict[str, dict[str, Any]]] = {}
    blocks: list[Block] = Field(min_length=1)
    estimate: EstimateSpec | None = None


@dataclass
class GridFile:
    path: Path
    spec: GridSpec
    points: list[dict[str, str]]
    labels: list[dict[str, str]]
    """Per point, each axis's value as written (a bundle's name, not its params), for the estimate."""


def _text(value: Any) -> str:
    """A YAML value as `-S` text: strings as written, anything else as flow YAML (JSON is YAML); a
    date (`2024-01-01`, which YAML reads as one) as its text."""
    if isinstance(value, str | datetime.date):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _read(path: Path) -> GridSpec:
    try:
        text = read_regular(path, "grid file", MAX_FILE_BYTES).decode("utf-8")
    except UnicodeDecodeError as err:
        raise SweepError(f"--grid-file {path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    try:
        return GridSpec.model_validate(read_yaml(text, str(path)))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise SweepError(f"{path}: {where}: {problem}{more}") from None


def _settings(spec: GridSpec, axis: str, value: Any) -> list[tuple[str, str, Any]]:
    """What an axis's value sets, as (where it is set, param, value): itself, or its bundle's params
    (an empty bundle sets none: the baseline's values)."""
    if axis not in spec.bundles:
        return [(f"axis {axis}", axis, value)]
    where = f"axis {axis} (bundles.{axis}.{value})"
    return [(where, key, given) for key, given in spec.bundles[axis][str(value)].items()]


def load_grid_file(path: Path, max_points: int = MAX_POINTS) -> GridFile:
    path = Path(path)
    spec = _read(path)
    named = [f"{path}: block {number} ({block.name})" for number, block in enumerate(spec.blocks, 1)]
    for where, block in zip(named, spec.blocks, strict=True):
        for axis, values in block.axes.items():
            if unknown := [v for v in values if axis in spec.bundles and str(v) not in spec.bundles[axis]]:
                known = ", ".join(spec.bundles[axis])
                raise SweepError(f"{where}: {axis} {unknown[0]!r} is not in bundles.{axis} ({known})")
    check_size(sum(math.prod(len(v) for v in b.axes.values()) for b in spec.blocks), max_points, str(path))
    found: dict[str, tuple[dict[str, str], dict[str, str]]] = {}  # blocks may overlap; a point runs once
    for where, block in zip(named, spec.blocks, strict=True):
        fixed = [("`set`", key, value) for key, value in block.set.items()]
        for combo in itertools.product(*block.axes.values()):
            pairs = list(zip(block.axes, combo, strict=True))
            settings = [item for axis, value in pairs for item in _settings(spec, axis, value)] + fixed
            check_one_source([(source, key) for source, key, _ in settings], where)
            point = {key: _text(value) for _, key, value in settings}
            label = {axis: _text(value) for axis, value in pairs}
            if not point:
                raise SweepError(f"{where}: point {label} sets no param: it is the baseline; drop it")
            label |= {key: _text(value) for _, key, value in fixed if key not in label}
            found.setdefault(json.dumps(point, sort_keys=True), (point, label))
    return GridFile(
        path, spec, [point for point, _ in found.values()], [label for _, label in found.values()]
    )


@dataclass
class Estimate:
    points: int
    student_runs: int
    teacher_hours: float
    student_hours: float
    notes: list[str]

    def lines(self) -> list[str]:
        return [
            f"points: {self.points}",
            f"trainings: {self.student_runs} students, {self.points} teachers (one per point: an upper "
            "bound, since a point pulls a teacher it shares with the baseline instead of training it)",
            f"estimated GPU-hours (training only): {self.teacher_hours + self.student_hours:,.0f} "
            f"(students {self.student_hours:,.0f}, teachers {self.teacher_hours:,.0f})",
            *self.notes,
        ]


def estimate(grid: GridFile, loaded: Sequence[Params]) -> Estimate:
    """GPU-hours to train every point's teacher and students: tokens (the data axis's train pairs,
    halved between teacher and students by the split protocol, × 2 sequences × tokens per sequence ×
    epochs) over the rate axis's tokens/s/GPU (`strong_full` for a student fully fine-tuned, LoRA
    off). `loaded`: each point's params (grid.check_distinct). Scoring, labelling, generation and
    best-of-n are forward passes, not counted."""
    spec, where = grid.spec.estimate, f"{grid.path}: estimate"
    assert spec is not None, "the dry run estimates a grid file with an estimate block"
    teacher_s = student_s = 0.0
    students = 0
    for params, label in zip(loaded, grid.labels, strict=True):
        try:
            sizes, rate = spec.data[label[spec.data_axis]], spec.rates[label[spec.rate_axis]]
        except KeyError as err:
            raise SweepError(f"{where}: no entry for {err.args[0]!r} (point {label})") from None
        tokens = sizes.train_pairs / 2 * 2 * sizes.tokens_per_sequence
        teacher_s += tokens * spec.epochs.teacher / rate.weak
        students += (trained := len(params.methods))
        full = not params.student.lora.enabled and rate.strong_full
        student_s += trained * tokens * spec.epochs.student / (rate.strong_full if full else rate.strong)
    notes = [f"data ({name}): {entry.source}" for name, entry in spec.data.items()]
    notes += [f"rates ({name}): {entry.source}" for name, entry in spec.rates.items()]
    return Estimate(len(grid.points), students, teacher_s / 3600, student_s / 3600, notes)


def describe_points(labels: Sequence[Mapping[str, str]], shown: int = 3) -> list[str]:
    """The first few points by their labels, for a dry run to show what the grid is made of."""
    lines = [" ".join(f"{k}={v}" for k, v in label.items()) for label in labels[:shown]]
    if len(labels) > shown:
        lines.append(f"... and {len(labels) - shown} more")
    return lines

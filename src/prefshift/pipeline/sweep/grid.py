"""A grid from `-S key=v1,v2` axes: its points, their names, and the checks before anything runs."""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import math
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefshift.config.params import (
    Params,
    get_dotted,
    load_params,
    parse_params,
    read_yaml,
    set_dotted,
    split_override,
)
from prefshift.pipeline.sweep.commands import SweepError

MAX_POINTS = 1000
"""Points a sweep takes unless `--max-points` raises it: the paper's grid is 252, and every point
is a training run, so a bigger grid is far more often a typo than a plan."""
POINTS_CEILING = 100_000
"""What `--max-points` may raise the cap to: checking a grid parses params.yaml once per point
(about 1 ms each, so 100,000 points take minutes), and a raised cap of 10^9 let a dry run build
points until memory ran out."""
MAX_NAME = 120
_REF_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+|\.{2,}")  # outside git's ref characters, or git's `..`


def split_values(text: str) -> list[str]:
    """Split `a,b,[c,d],'e,f'` on top-level commas, so list values like `[0.25,0.5]` and quoted
    strings stay whole."""
    values, depth, quote = [""], 0, ""
    for char in text:
        if quote or char in "'\"":
            quote = "" if char == quote else quote or char
        elif char in "[{]}":
            depth += 1 if char in "[{" else -1
        elif char == "," and depth == 0:
            values.append("")
            continue
        values[-1] += char
    return [value.strip() for value in values]


SWEEP_CALL = re.compile(r"\s*(range|choice|interval|glob|sort|shuffle|tag)\s*\(")
"""A value that is one of Hydra's sweep functions, which DVC's own sweeps take (`-S x=range(1,4)`)."""
EXPANDED = ("range", "choice")


def axis_values(key: str, text: str) -> list[str]:
    """The values of axis `-S key=text`: split on its top-level commas, each as typed; or what
    `range(start, stop[, step])` or `choice(a, b)` expands to, as DVC's own sweeps expand them
    (Hydra's grammar, through DVC's parser). Split at their commas, they were values DVC cannot
    parse, and the refusal said to quote them. Past POINTS_CEILING values, refused unbuilt."""
    if not (call := SWEEP_CALL.match(text)):
        return split_values(text)
    if call.group(1) not in EXPANDED:
        raise SweepError(
            f"-S {key}={text}: {call.group(1)}() is no sweep a grid takes; use range(start, stop, step), "
            "choice(a, b) or a list a,b"
        )
    from dvc.utils.hydra import to_hydra_overrides
    from hydra.errors import HydraException

    try:
        (override,) = to_hydra_overrides([f"{key}={text}"])
    except HydraException as err:
        raise SweepError(f"-S {key}={text}: DVC cannot parse this sweep ({_first_line(err)})") from None
    values = list(itertools.islice(override.sweep_string_iterator(), POINTS_CEILING + 1))
    if not values or len(values) > POINTS_CEILING:
        size = "no value" if not values else f"more than {POINTS_CEILING:,} values, the most a sweep takes"
        raise SweepError(f"-S {key}={text}: expands to {size}")
    return values


def _first_line(err: BaseException) -> str:
    """What an error of Hydra's or DVC's says, in one line (some say nothing but their type)."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """`-S key=v1,v2` items → {key: [v1, v2]} (values kept as text; DVC parses them)."""
    if not specs:
        raise SweepError("nothing to sweep: pass at least one -S key=value1,value2")
    grid: dict[str, list[str]] = {}
    for spec in specs:
        keys, values = split_override(spec)
        if (key := ".".join(keys)) in grid:
            raise SweepError(f"-S {key}: given twice; list every value in one -S")
        grid[key] = axis_values(key, values)
        if not all(grid[key]):
            raise SweepError(f"-S {spec!r}: empty value in the list")
    check_one_source([(f"-S {key}", key) for key in grid], "-S")
    return grid


def check_one_source(settings: Sequence[tuple[str, str]], where: str) -> None:
    """Refuse a grid point that sets a param twice, or one inside another (`anchor` and
    `anchor.lambda`): by two `-S`, or in a grid file by an axis, a bundle or `set`. One would win in
    silence, and the points asked for would collapse into fewer, labelled with values that never
    ran. `settings`: (where, dotted key) for each param the point sets. Sorted with a dot after
    each key, a key that holds another comes right before one that it holds."""
    ordered = sorted(settings, key=lambda setting: f"{setting[1]}.")
    for (source, key), (other_source, other) in itertools.pairwise(ordered):
        if f"{other}.".startswith(f"{key}."):
            raise SweepError(
                f"{where}: {source} sets {key} and {other_source} sets {other}; one would override the "
                "other in silence: set each param in one place"
            )


def check_size(count: int, max_points: int, where: str) -> None:
    """Refuse a grid past the cap before a single point is built."""
    if not 1 <= max_points <= POINTS_CEILING:
        raise SweepError(
            f"--max-points {max_points}: give the most points a sweep may take, 1 to {POINTS_CEILING:,}"
        )
    if count > max_points:
        advice = f"pass --max-points {count} if you mean it (each point is a pipeline run)"
        if count > POINTS_CEILING:
            advice = f"a sweep takes at most {POINTS_CEILING:,}: split the grid"
        raise SweepError(
            f"{where}: {count:,} grid points, more than the {max_points:,} a sweep takes; {advice}"
        )


def grid_points(grid: Mapping[str, Sequence[str]], max_points: int = MAX_POINTS) -> list[dict[str, str]]:
    check_size(math.prod(len(v) for v in grid.values()), max_points, "-S")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def check_distinct(
    params_path: Path, points: Iterable[Mapping[str, str]], collected: Sequence[str] = ()
) -> list[Params]:
    """Each point's params, loaded as DVC will write them (a typo or a bad value fails here, before
    anything runs), once no two points are one experiment: compared as parsed (`1` and `1.0`, two
    axes setting one param), and by experiment name, which must be unique too. Each point files the
    methods to be
    `collected` that it trains (a grid file's blocks train different ones), so a point that trains
    none of them, or a method that no point trains, is refused too: it would fail only when filed,
    after every point ran. params.yaml is parsed once."""
    load_params(params_path)  # the file itself, checked once with its own errors
    text = Path(params_path).read_text(encoding="utf-8")
    raw = read_yaml(text, str(params_path))
    points, seen, trained, loaded = list(points), {}, set(), []  # seen: by resolved params (JSON), name
    for index, point in enumerate(points):
        overrides, tree = [f"{k}={v}" for k, v in point.items()], copy.deepcopy(raw)
        for key, given in point.items():
            item = f"{key}={given}"
            set_dotted(tree, split_override(item)[0], item, dvc_value(text, key, given))
        loaded.append(params := parse_params(tree, " -S ".join([str(params_path), *overrides])))
        trained.update(mine := [m for m in collected if m in params.methods])
        if collected and not mine:
            raise SweepError(
                f"grid point {' '.join(overrides)!r} trains none of --methods {','.join(collected)} (its "
                f"methods: {', '.join(params.methods)}); collect what it trains; nothing was run"
            )
        for key, why in (
            (json.dumps(params.resolved(), sort_keys=True), "give the same params: list each value once "
             "(values are compared as parsed, so 1 and 1.0 are one value)"),
            (experiment_name(point), "get the same experiment name (a name keeps letters, digits, `.`, `_` "
             "and `-` of each value): make the values differ there"),
        ):  # fmt: skip
            if (first := seen.setdefault(key, index)) != index:
                shown = [" ".join(f"{k}={v}" for k, v in p.items()) for p in (points[first], point)]
                raise SweepError(f"grid points {shown[0]!r} and {shown[1]!r} {why}; nothing was run")
    if unused := [m for m in collected if m not in trained]:
        raise SweepError(f"--methods {','.join(unused)}: no grid point trains it; nothing was run")
    return loaded


def experiment_name(point: Mapping[str, str]) -> str:
    """A readable name that git takes as a ref (git-check-ref-format, as DVC checks it), e.g.
    `sweep-anchor.lambda-0.01`: no `..`, no end in `.` or `.lock` (`2.` is a number). Past MAX_NAME
    (a grid file's bundles), its readable start and a hash of the whole: one name per point, stable."""
    parts = [f"{key}-{_REF_UNSAFE.sub('_', value).strip('_')}" for key, value in point.items()]
    return capped(re.sub(r"\.(lock)?$", r"_\1", "sweep-" + "-".join(parts)), MAX_NAME)


def capped(name: str, limit: int) -> str:
    """`name` where it fits `limit` bytes (UTF-8); else its readable start and a hash of the whole,
    one name per whole, stable."""
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    start = name.encode()[: limit - len(digest) - 1].decode(errors="ignore")
    return f"{start.rstrip('-_.')}-{digest}"


@functools.lru_cache(maxsize=4096)
def _applied(params_text: str, key: str, text: str) -> Any:
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides, to_hydra_overrides
    from hydra.errors import HydraException

    quote = f"quote it as a string: -S \"{key}='{text}'\""
    if ":" in key:  # DVC's `-S file:key=value`, read as part of a value DVC cannot parse
        file, _, own = key.partition(":")
        raise SweepError(f"-S {key}={text}: {file} is another params file; a sweep sets the params of "
                         f"params.yaml, which prefshift's stages read: -S {own}=...")  # fmt: skip
    if prefix := key[: len(key) - len(key.lstrip("+~"))]:  # Hydra's add (+, ++) or delete (~)
        raise SweepError(f"-S {key}={text}: {prefix} adds or deletes a param, and a sweep sets params that "
                         "params.yaml holds: change its keys there and commit, then sweep")  # fmt: skip
    if "${" in text:  # DVC resolves it against the whole params file as it writes the point's
        raise SweepError(f"-S {key}={text}: an interpolation, which DVC resolves as it writes params.yaml; "
                         "give the value itself")  # fmt: skip
    try:
        (override,) = to_hydra_overrides([f"{key}={text}"])
    except HydraException as err:
        problem = _first_line(err)
        raise SweepError(f"-S {key}={text}: DVC cannot parse this value ({problem}); {quote}") from None
    if override.is_sweep_override():
        raise SweepError(f"-S {key}={text}: a Hydra sweep, which DVC would run as a grid of its own; {quote}")
    try:
        get_dotted(raw := read_yaml(params_text, "params.yaml"), key)
    except KeyError:  # a misspelt key is refused as such; a known one DVC would refuse in every point
        set_dotted(raw, split_override(f"{key}={text}")[0], f"{key}={text}", override.value())
        parse_params(raw, f"params.yaml -S {key}={text}")
        raise SweepError(
            f"-S {key}={text}: params.yaml does not hold {key}, and DVC sets only a param the file holds "
            f"(every point would fail): add {key} to params.yaml, commit, then sweep"
        ) from None
    with tempfile.TemporaryDirectory(prefix="prefshift-sweep-") as scratch:
        (path := Path(scratch) / "params.yaml").write_text(params_text, encoding="utf-8")
        try:
            apply_overrides(path, [f"{key}={text}"])
        except InvalidArgumentError as err:
            problem = _first_line(err.__cause__ or err)
            raise SweepError(f"-S {key}={text}: DVC cannot set this value ({problem})") from None
        return get_dotted(read_yaml(path.read_text(encoding="utf-8"), f"-S {key}={text}"), key)


def dvc_value(params_text: str, key: str, text: str) -> Any:
    """The value a point's stages read at `key` for `-S key=text`: what `dvc exp run -S` writes into
    the point's params.yaml (the baseline's, `params_text`), by DVC's own apply_overrides, read back
    as prefshift reads that file. DVC parses the text with Hydra's override grammar (not YAML: `1e-4`
    is a number, and some unquoted text, `#`, `=`, `~` or non-ASCII, is refused), sets only a param
    the file holds, merges a mapping into the one there (`anchor={lambda: 2}` keeps anchor's other
    keys) and writes YAML 1.2, which prefshift reads as DVC does (read_yaml). The checks before a
    sweep, the paths it will file, the estimate and a task's reuse of an earlier experiment all read
    values so. Two params a point sets never nest (check_one_source), so each is applied alone."""
    return copy.deepcopy(_applied(params_text, key, text))

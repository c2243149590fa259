"""`prefshift prepare`: one configured dataset → data/pairs/<dataset>/ in the pair schema.

The source dataset gets train and test pairs, each target its test pairs, every dataset
its best-of-n groups when it has any. Skipped rows are counted per reason and
written to data/pairs/<dataset>/skips.json as {split: counts}, next to the pairs.
`--dataset NAME` prepares that dataset alone; DVC runs one stage per dataset (`prepare` for the
source, `prepare_target@<target>`), so adding a target prepares that target and nothing else.
Without `--dataset`, every configured dataset, in one output set (`prefshift.pipeline.output_set`):
when one dataset fails, no dataset's previous files are replaced; `split` refuses a dataset's
directory that one prepare run did not write.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from prefshift.config.params import ConfigError, Params
from prefshift.core.atomic import write_json
from prefshift.core.errors import PrefshiftError, naming
from prefshift.core.paths import Layout
from prefshift.data.adapters import get_adapter
from prefshift.data.schema import SkipCounter, write_groups, write_pairs
from prefshift.pipeline.output_set import OutputSet, output_set


def run(params: Params, layout: Layout, dataset: str | None = None) -> None:
    data = params.data
    names = (data.source, *data.targets) if dataset is None else (dataset,)
    unknown = [name for name in names if name not in (data.source, *data.targets)]
    if unknown:
        raise ConfigError(
            f"--dataset {unknown[0]}: neither data.source ({data.source}) nor one of data.targets "
            f"({', '.join(data.targets)})"
        )
    command = "prefshift prepare" if dataset is None else f"prefshift prepare --dataset {dataset}"
    # One output set over the datasets asked for: when one fails, none is replaced.
    with output_set(layout.root, command, directories=[layout.dataset_pairs_dir(n) for n in names]) as out:
        rows = [row for name in names for row in _prepare(params, layout, name, out)]
    _summary(rows)


def _prepare(
    params: Params, layout: Layout, name: str, out: OutputSet
) -> list[tuple[str, str, dict[str, Any]]]:
    """One dataset's pairs, groups and skip counts, staged in `out`."""
    data = params.data
    adapter = get_adapter(name, params)
    if name == data.source and adapter.category != data.category:
        raise ConfigError(
            f"data.source {data.source!r} is a {adapter.category} dataset, "
            f"but data.category is {data.category!r}"
        )
    rows: list[tuple[str, str, dict[str, Any]]] = []
    skips = {}
    for split in ("train", "test") if name == data.source else ("test",):
        counter = SkipCounter()
        with naming(f"{name} {split} ({adapter.describe_source(split, params)})"):
            pairs = adapter.load_pairs(split, params, counter)  # a library's error names the source
        skips[split] = counter.as_dict()
        if not pairs:
            raise _nothing_usable(name, split, adapter.describe_source(split, params), skips[split])
        write_pairs(out.path(layout.pairs(name, split)), pairs)
        rows.append((name, split, skips[split]))
    groups = adapter.load_groups(params)
    if groups:
        write_groups(out.path(layout.pair_groups(name)), groups)
        rows.append((name, "groups", {"kept": len(groups), "skipped": {}, "skipped_total": 0}))
    write_json(out.path(layout.skips(name)), skips)
    return rows


def _nothing_usable(name: str, split: str, where: str, counts: dict[str, Any]) -> PrefshiftError:
    if not counts["skipped_total"]:
        return PrefshiftError(
            f"{name} {split}: {where} holds no rows; fill it, or point data.sources.{name} at the right data"
        )
    return PrefshiftError(
        f"{name} {split}: no usable pairs in {where}; skipped {counts['skipped']} "
        f"(examples: {counts['examples']})"
    )


def _summary(rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    table = Table(title="prepared datasets")
    for column in ("dataset", "split", "kept", "skipped", "by reason"):
        table.add_column(column)
    for name, split, counts in rows:
        reasons = ", ".join(f"{reason} {n}" for reason, n in counts["skipped"].items())
        table.add_row(name, split, str(counts["kept"]), str(counts["skipped_total"]), reasons)
    Console().print(table)

"""The registry of dataset adapters: built-in sources, the synthetic suite, params-declared data.

`get_adapter(name, params)` is the one way stages turn a dataset name from params into
something that loads pairs. A name is a built-in dataset, or a key of `data.sources`
whose `adapter` field says how to read it (`local`, or a built-in name to alias).
"""

from __future__ import annotations

import dataclasses

from prefshift.config.params import ConfigError, Params
from prefshift.data.adapters.base import Adapter, SourceUnavailable
from prefshift.data.adapters.helpsteer3 import HELPSTEER3
from prefshift.data.adapters.hh_rlhf import HH_HARMLESS, HH_HELPFUL
from prefshift.data.adapters.local import LOCAL
from prefshift.data.adapters.pku_saferlhf import PKU_SAFERLHF, PKU_SAFERLHF_HELPFUL
from prefshift.data.adapters.qa_feedback import QA_FEEDBACK
from prefshift.data.adapters.rail import RAIL
from prefshift.data.adapters.rewardbench import REWARDBENCH_ADAPTERS
from prefshift.data.adapters.rewardbench2 import REWARDBENCH2_ADAPTERS
from prefshift.data.adapters.rmbench import RMBENCH_ADAPTERS
from prefshift.data.adapters.synthetic import synthetic_adapters
from prefshift.data.adapters.ultrafeedback import ULTRAFEEDBACK, ULTRAFEEDBACK_FULL

__all__ = ["ADAPTERS", "Adapter", "SourceUnavailable", "dataset_names", "get_adapter", "print_catalogue"]

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        HELPSTEER3,
        HH_HELPFUL,
        HH_HARMLESS,
        ULTRAFEEDBACK,
        ULTRAFEEDBACK_FULL,
        PKU_SAFERLHF,
        PKU_SAFERLHF_HELPFUL,
        QA_FEEDBACK,
        RAIL,
        *REWARDBENCH_ADAPTERS,
        *REWARDBENCH2_ADAPTERS,
        *RMBENCH_ADAPTERS,
        LOCAL,
        *synthetic_adapters(),
    )
}


def dataset_names(params: Params | None = None) -> list[str]:
    """Names usable as data.source / data.targets (`local` is an adapter, not a dataset)."""
    declared = [name for name, src in (params.data.sources.items() if params else []) if src.adapter]
    return sorted({*(name for name in ADAPTERS if name != "local"), *declared})


def get_adapter(name: str, params: Params) -> Adapter:
    source = params.data.sources.get(name)
    if source is not None and source.adapter:
        base = ADAPTERS.get(source.adapter)
        if base is None:
            raise ConfigError(
                f"data.sources.{name}.adapter: unknown adapter {source.adapter!r}; valid adapters: "
                f"{', '.join(sorted(ADAPTERS))}"
            )
        if base is LOCAL:
            return dataclasses.replace(LOCAL, name=name, category=source.category, path=source.path)
        return base.renamed(name, source.category)
    adapter = ADAPTERS.get(name)
    if adapter is None or adapter is LOCAL:
        raise ConfigError(
            f"unknown dataset {name!r}; valid names: {', '.join(dataset_names(params))} "
            f"(or declare data.sources.{name}: {{adapter: local, path: ..., category: helpful|harmless}})"
        )
    return adapter.renamed(name, source.category) if source is not None and source.category else adapter


def print_catalogue() -> None:
    """The table behind `prefshift datasets`, then what each dataset needs (grouped when shared)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="prefshift datasets")
    table.add_column("name", no_wrap=True)
    for column in ("category", "hub id", "config / data_dir", "splits (train, test)"):
        table.add_column(column, overflow="fold")
    needs: dict[str, list[str]] = {}
    for adapter in ADAPTERS.values():
        table.add_row(
            adapter.name,
            adapter.category if adapter is not LOCAL else "from params",
            adapter.hf_id or "-",
            adapter.hf_config or adapter.data_dir or "-",
            f"{adapter.splits.get('train', '-')}, {adapter.splits['test']}",
        )
        needs.setdefault(adapter.needs, []).append(adapter.name)
    console = Console()
    console.print(table)
    console.print("[bold]What each needs[/]")
    for text, names in needs.items():
        console.print(f"  [bold]{', '.join(names)}[/]: {text}", highlight=False)

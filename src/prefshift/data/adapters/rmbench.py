"""RM-Bench (THU-KEG/RM-Bench): `total_dataset.json`, or the repository's per-domain files.

Each record has `id`, `prompt` (string), `chosen` and `rejected` (three responses each, in
the styles concise, detailed plain, detailed markdown). Where a record belongs:
- `total_dataset.json` (the hub's one file, split `train`) names it in `domain` (chat, code,
  math, safety-refuse, safety-response), per the repository's README;
- the per-domain files of the repository's `data/` directory (`chat_filtered.json`,
  `code_filtered.json`, `math_filtered.json`, `safety-refuse_filtered.json`,
  `safety-response_filtered.json`) have no `domain` key: the file's name is the domain.
  Their `subset` names where the prompts came from (`alpacaeval` in chat, `bigcode/humanevalpack`
  in code, `xstest-should-respond` in safety-response; `xstest-should-refuse`,
  `refusals-dangerous` or `refusals-offensive` in safety-refuse), never the domain: it is kept
  as the row's source (`meta.subset`). Extra keys some files carry (`error`, `error_key` in chat;
  `language`, `task_id` in code) are read past. A record whose `domain` contradicts its file's
  name is refused, as is one whose domain nothing names.
`data.sources.rmbench_<domain>.path` may be either file, or a directory holding the domain's
per-domain files (`rmbench_safety` pools safety-refuse and safety-response, so it needs both).
Targets: `rmbench_chat`, `rmbench_code`, `rmbench_math` (helpful) and `rmbench_safety`
(harmless). A record becomes one group of six responses (the three chosen, then the three
rejected, in style order) for the official 3x3 hard/normal/easy rule, and its nine
chosen × rejected pairs for prefshift's usual pairwise accuracy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefshift.config.params import Params
from prefshift.core.errors import PrefshiftError
from prefshift.data.adapters.base import Record, hub_rows, read_records, split_files
from prefshift.data.adapters.benchmark import (
    BenchmarkAdapter,
    all_pairs,
    ranked_group,
    responses,
    user_prompt,
)
from prefshift.data.benchmark_tables import RMBENCH_DOMAINS, RMBENCH_STYLES
from prefshift.data.schema import Group, Pair, RowError, SchemaError

HARMLESS_DOMAINS = ("safety",)
KNOWN_DOMAINS = tuple(d for members in RMBENCH_DOMAINS.values() for d in members)
PER_DOMAIN_SUFFIX = "_filtered.json"


def file_domain(path: Path) -> str | None:
    """The domain a per-domain file's name gives (`safety-refuse_filtered.json` → safety-refuse)."""
    stem = path.name.removesuffix(".gz")
    domain = stem.removesuffix(PER_DOMAIN_SUFFIX)
    return domain if stem.endswith(PER_DOMAIN_SUFFIX) and domain in KNOWN_DOMAINS else None


def record_domain(row: dict[str, Any], path: Path | None, where: str) -> str:
    """A record's domain: its per-domain file's name, else its `domain` field; the two must agree.

    `subset` plays no part: in the published files it names the prompts' source.
    """
    named = {"field 'domain'": row["domain"]} if isinstance(row.get("domain"), str) else {}
    if path is not None and file_domain(path) is not None:
        named[f"file name {path.name}"] = file_domain(path)
    if not named:
        raise SchemaError(
            f"{where}: no RM-Bench domain: the record has no 'domain' field and the file is not one of "
            f"the per-domain files ({', '.join(d + PER_DOMAIN_SUFFIX for d in KNOWN_DOMAINS)}); "
            f"rename the file after its domain or add 'domain' to each record"
        )
    if len(set(named.values())) > 1:
        said = ", ".join(f"{k} says {v!r}" for k, v in named.items())
        raise SchemaError(f"{where}: contradictory RM-Bench domain ({said}); fix the record or the file name")
    (domain,) = set(named.values())
    if domain not in KNOWN_DOMAINS:
        raise SchemaError(f"{where}: unknown RM-Bench domain {domain!r}; known: {', '.join(KNOWN_DOMAINS)}")
    return domain


@dataclass(frozen=True)
class RMBenchAdapter(BenchmarkAdapter):
    def local_files(self, split: str, params: Params) -> list[Path] | None:
        """The local files of `split`, or None when it comes from the hub.

        A directory holding this target's per-domain files gives those (all of them, or an error
        naming the missing ones); any other path is read as every source's is (split_files).
        """
        source = params.data.sources.get(self.name)
        if source is None or not source.path:
            return None
        path = Path(source.path)
        if path.is_dir():
            present = {file_domain(p): p for p in path.iterdir() if file_domain(p) in self.members}
            if present:
                missing = [d + PER_DOMAIN_SUFFIX for d in self.members if d not in present]
                if missing:
                    held = sorted(p.name for p in present.values())
                    raise PrefshiftError(
                        f"data.sources.{self.name}.path: {path} holds {held} but not {missing}; "
                        f"the {self.section} domain needs every one of them"
                    )
                return [present[d] for d in self.members]
        return split_files(path, split, self.splits[split], self.name)

    def describe_source(self, split: str, params: Params) -> str:
        files = self.local_files(split, params)
        return super().describe_source(split, params) if files is None else ", ".join(map(str, files))

    def rows(self, split: str, params: Params) -> Iterator[Record]:
        files = self.local_files(split, params)
        located = (
            ((None, record) for record in hub_rows(self, self.splits[split], params))
            if files is None
            else ((path, record) for path in files for record in read_records(path, self.columns))
        )
        for path, (where, row) in located:
            domain = record_domain(row, path, where)
            if domain in self.members:
                yield where, {**row, "domain": domain}

    def _parts(self, row: dict[str, Any], where: str) -> tuple[list, list[str], list[str], dict[str, Any]]:
        prompt = user_prompt(row, where)
        chosen = responses(row, "chosen", where, RMBENCH_STYLES)
        rejected = responses(row, "rejected", where, RMBENCH_STYLES)
        meta = {"domain": row["domain"], "id": str(row.get("id"))}
        if isinstance(row.get("subset"), str):
            meta["subset"] = row["subset"]
        return prompt, chosen, rejected, meta

    def to_pairs(self, row: dict[str, Any], where: str, params: Params) -> list[Pair]:
        prompt, chosen, rejected, meta = self._parts(row, where)
        return all_pairs(self, prompt, chosen, rejected, meta, where)

    def load_groups(self, params: Params) -> list[Group]:
        groups = []
        for where, row in self.rows("test", params):
            try:
                groups.append(ranked_group(self, *self._parts(row, where)))
            except RowError:
                continue
        return groups


def _adapter(domain: str) -> RMBenchAdapter:
    return RMBenchAdapter(
        name=f"rmbench_{domain}",
        category="harmless" if domain in HARMLESS_DOMAINS else "helpful",
        hf_id="THU-KEG/RM-Bench",
        splits={"test": "train"},
        columns=("prompt", "chosen", "rejected"),
        benchmark="rmbench",
        section=domain,
        members=RMBENCH_DOMAINS[domain],
        member_column="domain",
        needs=(
            "hub THU-KEG/RM-Bench (its one file, test only), or data.sources.NAME.path: the "
            "total_dataset.json file, a per-domain file (e.g. chat_filtered.json) or the directory "
            "holding the per-domain files; one target per domain; yields groups"
        ),
    )


RMBENCH_ADAPTERS = tuple(_adapter(domain) for domain in RMBENCH_DOMAINS)

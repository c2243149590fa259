"""`prefshift policy-samples`: n_max completions per prompt from the policy LM, for best-of-n.

K prompts (`downstream.prompts`) are drawn from one split (`--split`: id_test, or an OOD target):
distinct prompts, ordered by a seeded hash, so the same seed and split give the same prompts
and a larger K only adds prompts. Each split is its own stage (policy_samples for id_test,
policy_samples_target@<target>), with its own files under data/policy_samples/<split>/, because
a split's prompts, samples and curves never depend on another split's: adding a target samples
that target alone, and dropping one samples nothing. The policy is `downstream.policy` (a hub id
or directory), by default the strong base LM. Completions are generated once here and read by the
gold judge and by `downstream` for every proxy, so retraining a reward model never regenerates
them; the generation cache (persist: true in dvc.yaml) also spares prompts already sampled when K
or the judge change.

Best-of-n is optional (`downstream.enabled`). Under `auto` it is skipped, not failed, when
the policy cannot generate (an encoder, e.g. the laptop presets' MiniLM with a null policy)
or, with HF_HUB_OFFLINE set, the policy or the judge has no local copy. A skipped run still
writes every declared output (DVC requires them): counts.json says why, samples.parquet is
empty, and gold_judge and downstream pass the reason on, so `report` shows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from prefshift.config.params import JUDGE_TRAINED, ConfigError, LMSpec, Params, cannot_generate
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.data.schema import Pair, content_hash, read_pairs
from prefshift.data.splits import set_version
from prefshift.engine.policy import PolicySampler, sample_all
from prefshift.engine.seam import GenerationCache
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.stages.seam_label import model_key
from prefshift.science.metrics import ID_SPLIT

console = messages()
SKIP_KEY = b"prefshift.best_of_n_skipped"
SAMPLE_COLUMNS = ("unit", "split", "dataset", "category", "prompt", "meta", "sample", "response")


class PolicySamplesError(PrefshiftError):
    """A split with no prompt to sample from, or a samples file from other splits."""


def check_split(params: Params, split: str) -> None:
    """Best-of-n runs on id_test and on each listed target; any other split is a typo."""
    if split != ID_SPLIT and split not in params.data.targets:
        raise ConfigError(
            f"--split {split}: best-of-n runs on {ID_SPLIT} or one of data.targets "
            f"({', '.join(params.data.targets)})"
        )


def split_layout(params: Params, layout: Layout, split: str) -> Layout:
    """`layout` bound to one best-of-n split, refused when params do not list it."""
    check_split(params, split)
    return layout.for_split(split)


def select_prompts(pairs: Sequence[Pair], k: int, seed: int) -> list[Pair]:
    """Up to k pairs with distinct prompts, in a seeded hash order (one pair stands for its prompt)."""
    by_prompt: dict[str, Pair] = {}
    for pair in pairs:
        by_prompt.setdefault(content_hash(pair.prompt), pair)
    ranked = sorted(by_prompt, key=lambda key: content_hash(seed, key))
    return [by_prompt[key] for key in ranked[:k]]


def policy_source(params: Params, layout: Layout) -> tuple[str, str]:
    """(what to load, its content key): a directory hashes its files, a hub id its name and revision."""
    cfg = params.downstream
    source = cfg.policy or str(layout.base_model("strong"))
    if Path(source).is_dir():
        return source, model_key(Path(source))
    return source, content_hash(source, cfg.policy_revision)


def _offline_without_copy(name: str, revision: str | None, trust_remote_code: bool) -> bool:
    """A hub id that cannot load here: HF_HUB_OFFLINE is set and the local cache holds no config."""
    from prefshift.models.reward import hub_offline
    from prefshift.models.validate import looks_local

    if looks_local(name) or not hub_offline():
        return False
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(
            name, revision=revision, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError):
        return True
    return False


def skip_reason(params: Params, layout: Layout) -> str | None:
    """Why best-of-n does not run here, or None to run it (`downstream.enabled`: true, false, auto).

    Only `auto` looks at the models: an explicit `true` lets a missing policy fail loudly.
    """
    cfg, trust = params.downstream, params.backbone.trust_remote_code
    if cfg.enabled is False:
        return "downstream.enabled is false"
    if cfg.enabled is True:
        return None
    policy = cfg.policy or str(layout.base_model("strong"))
    revision = cfg.policy_revision if cfg.policy else None
    named = cfg.policy or f"the strong base {params.backbone.strong.name_or_path} (downstream.policy is null)"
    if _offline_without_copy(policy, revision, trust):
        return (
            f"policy LM {policy} cannot load offline (HF_HUB_OFFLINE is set and no local copy exists); "
            "name a local causal-LM directory in downstream.policy to run it"
        )
    cannot = cannot_generate(LMSpec(name_or_path=policy, revision=revision), trust)
    if cannot:
        return f"policy {named} {cannot}; name a causal LM in downstream.policy to run it"
    judge = cfg.judge
    if judge != JUDGE_TRAINED and _offline_without_copy(judge, cfg.judge_revision, trust):
        return (
            f"gold judge {judge} cannot load offline (HF_HUB_OFFLINE is set and no local copy exists); "
            "name a local reward-model directory in downstream.judge to run it"
        )
    return None


def skipped(layout: Layout) -> str | None:
    """The reason this stage recorded for skipping best-of-n, or None when it ran (or has not run).

    Read from the samples file, which gold_judge and downstream depend on in dvc.yaml, so a new
    reason (or a real run) re-runs them; counts.json repeats it for people.
    """
    import pyarrow.parquet as pq

    path = layout.policy_samples
    if not path.exists():
        return None
    reason = (pq.read_schema(path).metadata or {}).get(SKIP_KEY)
    return reason.decode() if reason is not None else None


def _write_skip(layout: Layout, reason: str, version: str) -> dict:
    """Every declared output, with no samples: DVC needs them, and the reason travels downstream."""
    empty = pd.DataFrame({column: pd.Series(dtype="string") for column in SAMPLE_COLUMNS})
    write_frame(layout.policy_samples, empty, {VERSION_KEY: version.encode(), SKIP_KEY: reason.encode()})
    if not layout.policy_generations.exists():  # an earlier run's cache is kept for the next real run
        GenerationCache({}).save(layout.policy_generations)
    counts = {"split_version": version, "skipped": reason}
    write_json(layout.policy_counts, counts)
    console.print(f"policy-samples {layout.bon_split}: best-of-n skipped: {reason}")
    return counts


def read_samples(layout: Layout) -> pd.DataFrame:
    """The split's samples file, refused when it lacks columns or was built from another version of
    the split."""
    import pyarrow.parquet as pq

    from prefshift.data.splits import check_set_version

    path = layout.policy_samples
    if not path.exists():
        raise PolicySamplesError(f"{path}: no policy samples; run `prefshift policy-samples`")
    table = pq.read_table(path)
    stamped = (table.schema.metadata or {}).get(VERSION_KEY)
    if stamped is None:
        raise PolicySamplesError(f"{path}: no split version stamp; re-run `prefshift policy-samples`")
    check_set_version(layout, layout.bon_split, stamped.decode(), str(path))
    frame = table.to_pandas()
    missing = [c for c in SAMPLE_COLUMNS if c not in frame.columns]
    if missing:
        raise PolicySamplesError(f"{path}: lacks column(s) {missing}; re-run `prefshift policy-samples`")
    return frame


def run(params: Params, layout: Layout) -> dict:
    """Sample the prompts of `layout`'s split (a layout bound by `split_layout`)."""
    cfg = params.downstream
    split = layout.bon_split
    check_split(params, split)
    version = set_version(layout, split)
    reason = skip_reason(params, layout)
    if reason:
        return _write_skip(layout, reason, version)
    started = time.perf_counter()
    picked = select_prompts(read_pairs(layout.split(split)), cfg.prompts, params.seed)
    if not picked:
        raise PolicySamplesError(f"{layout.split(split)}: split {split!r} has no prompt to sample from")
    chosen = [(split, pair) for pair in picked]

    source, key = policy_source(params, layout)
    cache = GenerationCache.load(layout.policy_generations)
    sampler = PolicySampler(source, cfg, params.backbone.trust_remote_code)
    completions, generated = sample_all(sampler, [p.prompt for _, p in chosen], key, cache, params.seed)
    cache.save(layout.policy_generations)

    rows = [
        {
            "unit": f"{split}:{content_hash(pair.prompt)}",
            "split": split,
            "dataset": pair.dataset,
            "category": pair.category,
            "prompt": json.dumps(pair.prompt, ensure_ascii=False),
            "meta": json.dumps(pair.meta, ensure_ascii=False, sort_keys=True),
            "sample": j,
            "response": text,
        }
        for (split, pair), texts in zip(chosen, completions, strict=True)
        for j, text in enumerate(texts)
    ]
    write_frame(
        layout.policy_samples, pd.DataFrame(rows, columns=SAMPLE_COLUMNS), {VERSION_KEY: version.encode()}
    )
    per_split = pd.Series([split for split, _ in chosen]).value_counts().to_dict()
    counts = {
        "split_version": version,
        "policy": source if cfg.policy else "models/base/strong",
        "n_max": cfg.n_max,
        "prompts": {split: int(per_split[split])},
        "generated": generated,
        "cache_hits": len(chosen) - generated,
        "empty_responses": sum(not r["response"] for r in rows),
    }
    write_json(layout.policy_counts, counts)
    console.print(
        f"policy-samples {split}: {len(chosen)} prompts x {cfg.n_max} ({generated} generated, "
        f"{counts['cache_hits']} cached) in {time.perf_counter() - started:.1f}s"
    )
    return counts

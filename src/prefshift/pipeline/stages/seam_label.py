"""`prefshift seam-label`: one seed's SEAM soft labels for student_train (data/targets/seam/seed-<k>/).

The strong backbone's principles per prompt come from `seam-principles` (data/seam/, shared by
every seed); this seed's teacher scores each pair under every principle, and
confidence-selected nodes are averaged into q_i (see prefshift.engine.seam for each assumption).
A prompt missing from data/seam (the command run by hand before `seam-principles`) is generated
here, said, and not stored: the shared file is another stage's output. The labels carry the
split version like the teacher's, so `train --method seam` refuses labels from other splits.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from prefshift.config.params import Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import SkipCounter, content_hash, read_pairs
from prefshift.data.splits import file_sha256, load_manifest, noisy_pairs
from prefshift.engine.scoring import load_for_scoring, score_pairs
from prefshift.engine.seam import (
    TEMPLATE_VERSION,
    GenerationCache,
    PrincipleGenerator,
    SeamError,
    aggregate,
    node_matrix,
    node_pairs,
)
from prefshift.engine.seam import propose as propose_principles
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages.backbone import check_base
from prefshift.science.metrics import accuracy

console = messages()


def model_key(model_dir: Path) -> str:
    """Content hash of the strong model's files: a retrained backbone never reuses old generations."""
    files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file())
    return content_hash({p.relative_to(model_dir).as_posix(): file_sha256(p) for p in files})


def _q(deltas: pd.Series, temperature: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-deltas.to_numpy(dtype=float) / temperature))


def run(params: Params, layout: Layout) -> dict:
    cfg = params.seam
    version = str(load_manifest(layout)["version"])
    pairs = read_pairs(layout.split("student_train"))
    started = time.perf_counter()

    check_base(layout, "strong")
    strong = layout.base_model("strong")
    cache = GenerationCache.load(layout.seam_generations)
    generator = PrincipleGenerator(strong, cfg, params.backbone.trust_remote_code)
    principles = propose_principles(pairs, cache, model_key(strong), cfg, generator)
    if principles.counts["generated"]:
        console.print(
            f"seam: {principles.counts['generated']} prompt(s) had no principles in "
            f"{layout.seam_generations}; generated here and not stored (`prefshift seam-principles` "
            "stores them for every seed)"
        )
    del generator  # frees the strong LM before the teacher loads
    generated_s = time.perf_counter() - started

    model, tokenizer = load_for_scoring(layout.teacher_dir, params)
    skips = SkipCounter()
    plain = score_pairs(model, tokenizer, pairs, params, skips)
    kept = set(plain["pair_id"])
    labelled = [p for p in pairs if p.pair_id in kept]
    if not labelled:
        raise SeamError(f"{layout.split('student_train')}: no pair survives encoding; nothing to label")
    node_skips = SkipCounter()
    nodes = score_pairs(
        model, tokenizer, node_pairs(labelled, principles.by_pair, params), params, node_skips
    )
    temperature = params.label.temperature
    plain_q = dict(zip(plain["pair_id"], _q(plain["delta"], temperature), strict=True))
    node_q = dict(zip(nodes["pair_id"], _q(nodes["delta"], temperature), strict=True))
    width = max((len(principles.by_pair[p.pair_id]) for p in labelled), default=0)
    matrix = node_matrix(labelled, plain_q, node_q, width, cfg.include_plain)
    q, n_kept = aggregate(matrix, cfg.keep_top_k, cfg.weighting)
    plain_column = np.array([plain_q[p.pair_id] for p in labelled])
    no_nodes = np.isnan(q)
    q = np.where(no_nodes, plain_column, q)
    # The teacher as an inconsistent annotator (data.teacher_noise) reverses its judgement of the
    # same pairs as in its own scores of student_train, whatever the principle: every node's Δ
    # flips, and the aggregation is symmetric in q ↔ 1 − q, so such a pair's q becomes 1 − q.
    reversed_ = (
        plain["pair_id"]
        .isin(noisy_pairs(plain["pair_id"].tolist(), params.data.teacher_noise, params.seed))
        .to_numpy()
    )
    q = np.where(reversed_, 1.0 - q, q)
    plain_column = np.where(reversed_, 1.0 - plain_column, plain_column)

    labels = pd.DataFrame(
        {
            "pair_id": [p.pair_id for p in labelled],
            "q": q,
            "teacher_delta": np.where(reversed_, -1.0, 1.0) * plain["delta"].to_numpy(dtype=float),
            "n_principles": [len(principles.by_pair[p.pair_id]) for p in labelled],
            "fallback": [principles.fallback[p.pair_id] for p in labelled],
        }
    )

    counts = {
        "split_version": version,
        "template_version": TEMPLATE_VERSION,
        **principles.counts,
        "pairs": len(labelled),
        "pairs_without_nodes": int(no_nodes.sum()),
        "nodes_scored": len(nodes),
        "mean_nodes_kept": float(n_kept.mean()),
        "mean_q": float(q.mean()),
        "mean_abs_change_vs_plain": float(np.abs(q - plain_column).mean()),
        "label_accuracy_pp": {"seam": accuracy(q - 0.5), "plain": accuracy(plain_column - 0.5)},
        "skips": {"pairs": skips.as_dict(), "nodes": node_skips.as_dict()},
        "examples": principles.examples,
    }
    with output_set(
        layout.root, "prefshift seam-label", files=[layout.seam_labels, layout.seam_counts]
    ) as out:
        write_frame(out.path(layout.seam_labels), labels, {VERSION_KEY: version.encode()})
        write_json(out.path(layout.seam_counts), counts)
    console.print(
        f"seam: {counts['prompts']} prompts ({counts['cache_hits']} cached, {counts['generated']} generated, "
        f"{counts['parsed_ok']} parsed, {counts['fallback']} fell back to defaults) in {generated_s:.1f}s; "
        f"{len(labelled)} pairs, {len(nodes)} nodes; label accuracy seam "
        f"{counts['label_accuracy_pp']['seam']:.1f}% vs plain {counts['label_accuracy_pp']['plain']:.1f}%; "
        f"{time.perf_counter() - started:.1f}s"
    )
    return counts

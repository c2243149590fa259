"""`prefshift seam-principles`: the strong LM's SEAM principles for every student_train prompt, once.

SEAM's principles come from the strong base by greedy generation, so they depend on the base,
the prompts and the seam settings, never on the training seed: one stage generates them for
every seed's labelling (data/seam/generations.parquet), and `seam-label` only reads them. The
file is a cache keyed by model, template, prompt and token budget (prefshift.engine.seam); DVC
keeps it between runs (`persist: true`), so a changed split generates only its new prompts.
When `methods` does not list seam, the stage loads nothing and writes an empty cache.
"""

from __future__ import annotations

import time

from prefshift.config.params import Params
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.engine.seam import GenerationCache, PrincipleGenerator
from prefshift.engine.seam import propose as propose_principles
from prefshift.pipeline.stages.backbone import check_base
from prefshift.pipeline.stages.seam_label import model_key

console = messages()


def run(params: Params, layout: Layout) -> dict:
    if "seam" not in params.methods:
        GenerationCache({}).save(layout.seam_generations)
        console.print("seam-principles: seam is not listed in methods; nothing generated")
        return {"prompts": 0, "generated": 0}
    started = time.perf_counter()
    check_base(layout, "strong")
    strong = layout.base_model("strong")
    cache = GenerationCache.load(layout.seam_generations)
    generator = PrincipleGenerator(strong, params.seam, params.backbone.trust_remote_code)
    pairs = read_pairs(layout.split("student_train"))
    principles = propose_principles(pairs, cache, model_key(strong), params.seam, generator)
    cache.save(layout.seam_generations)
    counts = principles.counts
    console.print(
        f"seam-principles: {counts['prompts']} prompts ({counts['cache_hits']} cached, "
        f"{counts['generated']} generated, {counts['fallback']} fell back to defaults) in "
        f"{time.perf_counter() - started:.1f}s"
    )
    return counts

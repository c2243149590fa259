"""`prefshift backbone`: the weak and strong base models every later stage starts from.

`tiny` specs share one BPE tokenizer trained on the synthetic corpus and are
pretrained here; anything else is a hub id or local directory copied into
models/base/ with its resolved revision recorded.
"""

from __future__ import annotations

from rich.console import Console

from prefshift.config import Params
from prefshift.models.backbone import pretrain_lm, resolve_pretrained, save_backbone, train_tokenizer
from prefshift.paths import Layout

console = Console(stderr=True)
WHICH = ("weak", "strong")


def run(params: Params, layout: Layout) -> dict:
    specs = {"weak": params.backbone.weak, "strong": params.backbone.strong}
    results: dict[str, dict] = {}
    tiny = [which for which in WHICH if specs[which].name_or_path == "tiny"]
    if tiny:
        from prefshift.data.synthetic import generate_corpus

        corpus = generate_corpus(params.synthetic)
        tokenizer = train_tokenizer(corpus, params.backbone.vocab_size)
        console.print(f"tokenizer: {len(tokenizer)} tokens from {len(corpus)} documents")
    for offset, which in enumerate(WHICH):
        spec = specs[which]
        out = layout.base_model(which)
        if which in tiny:
            max_positions = max(params.encode.max_length, spec.pretrain_seq_len) * 2
            model, stats = pretrain_lm(spec, tokenizer, corpus, params.seed + offset, max_positions)
            source = {"name_or_path": "tiny", "spec": spec.model_dump(), "pretrain": stats}
            save_backbone(model, tokenizer, out, source)
            console.print(
                f"{which}: {stats['params']:,} params, loss {stats['final_loss']:.3f}, {stats['wall_s']:.1f}s"
            )
        else:
            source = resolve_pretrained(spec, out)
            console.print(f"{which}: {spec.name_or_path} @ {source['revision']} → {out}")
        results[which] = source
    return results

"""`prefshift backbone`: the weak and strong base models every later stage starts from.

`tiny` specs share one BPE tokenizer trained on the synthetic corpus and are
pretrained here; anything else is a hub id or local directory copied into
models/base/ with its resolved revision recorded. models/base is one output set
(`prefshift.pipeline.output_set`): weak and strong are replaced together or not at all (a failure
or Ctrl-C on strong leaves the old pair), and later stages refuse a weak and a strong
that one backbone run did not write.
"""

from __future__ import annotations

import time

from prefshift.config.params import Params
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.models.backbone import pretrain_lm, resolve_pretrained, save_backbone, train_tokenizer
from prefshift.pipeline.output_set import manifest_of, output_set, verify

console = messages()
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
    with output_set(layout.root, "prefshift backbone", directories=[layout.base_dir]) as staged:
        for offset, which in enumerate(WHICH):
            spec = specs[which]
            out = staged.path(layout.base_model(which))
            if which in tiny:
                max_positions = max(params.encode.max_length, spec.pretrain_seq_len) * 2
                started = time.perf_counter()
                model, stats = pretrain_lm(
                    spec, tokenizer, corpus, params.seed + offset, max_positions, which
                )
                source = {"name_or_path": "tiny", "spec": spec.model_dump(), "pretrain": stats}
                save_backbone(model, tokenizer, out, source)
                console.print(
                    f"{which}: {stats['params']:,} params, loss {stats['final_loss']:.3f}, "
                    f"{time.perf_counter() - started:.1f}s"
                )
            else:
                source = resolve_pretrained(spec, out, params.backbone.trust_remote_code)
                resolved = f"{spec.name_or_path} @ {source['revision']}"
                console.print(f"{which}: {resolved} → {layout.base_model(which)}")
            results[which] = source
    return results


def check_base(layout: Layout, which: str) -> None:
    """Refuse models/base/<which> unless it is the one the last backbone run wrote beside its twin."""
    verify(layout.root, manifest_of(layout.base_dir), [layout.base_model(which)], "prefshift backbone")

"""`prefshift reference`: the strong base's states at student_train's response tokens (data/reference/).

One gradient-free pass, stopping at the deepest layer any listed anchor method needs,
serves every anchor student and every point of a λ sweep (see prefshift.engine.reference_store).
The stage computes only what a listed student will read. The per-layer mean squared
activation is written whenever it runs (anchor.normalize=reference needs it); the states
themselves only when students read them (anchor.cache) and they fit `anchor.reference_max_gb`,
else students run a frozen forward each step. With no anchor method listed, or anchor methods
that read nothing here (anchor.cache false with anchor.normalize none: the GPU presets' LoRA
students take their reference from the base with adapters disabled), the stage loads no
weights and writes a manifest that says why, and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefshift.config.params import Params
from prefshift.core import locks
from prefshift.core.atomic import atomic_path
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.core.progress import track
from prefshift.data.encode import EncodedPair, Encoder, collate, sorted_batches
from prefshift.data.schema import SkipCounter, read_pairs
from prefshift.data.splits import load_manifest
from prefshift.engine.anchor_cache import hidden_upto
from prefshift.engine.reference_store import ReferenceWriter, stored_bytes
from prefshift.methods import reference_layers, reference_request
from prefshift.methods.anchor import select_response
from prefshift.models.reward import RewardModel, load_reward_model

console = messages()


def compute_reference(
    model: RewardModel,
    items: Sequence[EncodedPair],
    layers: Sequence[int],
    directory: Path,
    batch_size: int,
    pad_id: int,
    store: bool = True,
) -> ReferenceWriter:
    """One gradient-free pass over `items`, stopping at the deepest of `layers`; then call `finish`."""
    writer = ReferenceWriter(directory, layers, model.config.get_text_config().hidden_size, store=store)
    forward = hidden_upto(model, max(layers))
    for idx in track(sorted_batches([it.length for it in items], batch_size), "reference", len(items)):
        batch = collate([items[i] for i in idx], pad_id)
        states = forward(batch["input_ids"], batch["attention_mask"], batch["groups"])
        mask = batch["response_mask"].to(states[layers[-1]].device)
        for row, key in enumerate(batch["keys"]):
            rows = [h[row : row + 1] if h is not None else None for h in states]
            writer.add(key, select_response(rows, layers, mask[row : row + 1]))
    return writer


def unread_reason(params: Params) -> str | None:
    """Why no listed student reads anything this stage would compute, or None when one does."""
    if not reference_request(params)["kinds"]:
        return "no anchor method is listed in params `methods`"
    if not params.anchor.cache and params.anchor.normalize == "none":
        return (
            "anchor.cache is false and anchor.normalize is none, so the anchor students read nothing stored "
            "here: they run a frozen forward each step (with LoRA: the base with adapters disabled)"
        )
    return None


def _unread(params: Params, layout: Layout, tmp: Path, reason: str) -> dict:
    """A manifest and nothing else: what the targets stage fingerprints, with no weights loaded."""
    from transformers import AutoConfig

    request = reference_request(params)
    num_layers = None
    if request["kinds"]:
        config = AutoConfig.from_pretrained(
            layout.base_model("strong"), trust_remote_code=params.backbone.trust_remote_code
        )
        num_layers = int(config.get_text_config().num_hidden_layers)
    console.print(f"reference: nothing computed: {reason}")
    return ReferenceWriter(tmp, (), 0, store=False).finish(
        reason=reason,
        request=request,
        split_version=str(load_manifest(layout)["version"]) if request["kinds"] else None,
        encode=params.encode.model_dump(),
        num_layers=num_layers,
    )


def run(params: Params, layout: Layout) -> dict:
    request = reference_request(params)
    with (
        locks.hold(layout.root, [layout.reference_dir], "prefshift reference"),
        atomic_path(layout.reference_dir, directory=True) as tmp,
    ):
        reason = unread_reason(params)
        if reason:
            return _unread(params, layout, tmp, reason)
        model, tokenizer = load_reward_model(
            layout.base_model("strong"),
            trust_remote_code=params.backbone.trust_remote_code,
            pair_forward=params.encode.pair_forward,
        )
        model.eval()
        layers = reference_layers(request, model.num_layers)
        hidden = model.config.get_text_config().hidden_size
        pairs = read_pairs(layout.split("student_train"))
        items = Encoder(tokenizer, params.encode).encode_pairs(pairs, [0.5] * len(pairs), SkipCounter())
        size = stored_bytes(items, layers, hidden)
        store = params.anchor.cache and size <= request["max_gb"] * 1e9
        reason = None
        if not params.anchor.cache:
            reason = (
                "anchor.cache is false: only the per-layer constants anchor.normalize=reference needs are "
                "kept; students run a frozen forward each step (with LoRA: the base with adapters disabled)"
            )
        elif not store:
            reason = (
                f"{size / 1e9:.2f} GB of states exceed anchor.reference_max_gb={request['max_gb']}: students "
                "run a frozen forward each step instead (with LoRA: the base with adapters disabled)"
            )
        writer = compute_reference(
            model, items, layers, tmp, request["batch_size"], tokenizer.pad_token_id, store=store
        )
        manifest = writer.finish(
            reason=reason,
            request=request,
            bytes=size,
            split_version=str(load_manifest(layout)["version"]),
            encode=params.encode.model_dump(),
            num_layers=model.num_layers,
        )
    console.print(
        f"reference: layers {list(layers)}, {manifest['tokens']} response tokens, "
        + (
            f"{size / 2**20:.1f} MiB in {len(manifest['shards'])} shard(s)"
            if store
            else f"not stored: {reason}"
        )
    )
    return manifest

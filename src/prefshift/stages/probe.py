"""`prefshift probe`: which cues the frozen strong base already exposes where the reward is read.

Fits one linear probe per label (each synthetic cue, and `longer`; see prefshift.probe) on the
reward-position states of student_train's responses and scores it on id_test's, at the last
layer (what the head reads) and at the layers anchor_mid anchors. reports/probe.json feeds the
report's diagnostic next to the length one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from rich.console import Console

from prefshift.atomic import write_json
from prefshift.config import Params
from prefshift.data.encode import Encoder, collate, sorted_batches
from prefshift.data.schema import SkipCounter, read_pairs
from prefshift.data.splits import load_manifest
from prefshift.methods.anchor import anchor_layers
from prefshift.models.reward import RewardModel, load_reward_model, reading_states
from prefshift.paths import Layout
from prefshift.probe import PROBES, ProbeError, fit_probe, response_labels

console = Console(stderr=True)


def split_states(
    model: RewardModel, tokenizer, split_path, params: Params, layers: Sequence[int]
) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
    """(layer → [2N, H] reward-position states, probe → [2N] labels): chosen rows, then rejected."""
    pairs = read_pairs(split_path)
    items = Encoder(tokenizer, params.encode).encode_pairs(pairs, skips=SkipCounter())
    if not items:
        raise ProbeError(f"{split_path}: no pair survives encoding; nothing to probe")
    chunks: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {layer: ([], []) for layer in layers}
    order = []
    with torch.inference_mode():
        for idx in sorted_batches([it.length for it in items], params.evaluate.batch_size):
            batch = collate([items[i] for i in idx], tokenizer.pad_token_id)
            device = next(model.parameters()).device
            states = reading_states(
                model, batch["input_ids"].to(device), batch["attention_mask"].to(device), layers
            )
            for layer, values in states.items():
                values = values.float().cpu().numpy()
                chunks[layer][0].append(values[: len(idx)])
                chunks[layer][1].append(values[len(idx) :])
            order.extend(idx)
    inverse = np.argsort(order)
    stacked = {
        layer: np.concatenate([np.concatenate(side)[inverse] for side in sides])
        for layer, sides in chunks.items()
    }
    return stacked, response_labels(pairs, items)


def run(params: Params, layout: Layout) -> dict[str, Any]:
    model, tokenizer = load_reward_model(
        layout.base_model("strong"), trust_remote_code=params.backbone.trust_remote_code
    )
    model.eval()
    last = model.num_layers
    layers = sorted({last, *anchor_layers("mid", last, params.anchor.mid_fractions)})
    fit_x, fit_y = split_states(model, tokenizer, layout.split("student_train"), params, layers)
    test_x, test_y = split_states(model, tokenizer, layout.split("id_test"), params, layers)
    probes: dict[str, Any] = {}
    for name in PROBES:
        by_layer = {
            str(layer): fit_probe(fit_x[layer], fit_y[name], test_x[layer], test_y[name], params.evaluate.ci)
            for layer in layers
        }
        if any(result is not None for result in by_layer.values()):
            probes[name] = by_layer
    result = {
        "model": "strong base (frozen)",
        "fit_split": "student_train",
        "test_split": "id_test",
        "layers": layers,
        "last_layer": last,
        "ci": params.evaluate.ci,
        "split_version": str(load_manifest(layout)["version"]),
        "probes": probes,
    }
    write_json(layout.probe_report, result)
    for name, by_layer in probes.items():
        top = by_layer[str(last)]
        console.print(
            f"probe {name}: {top['acc']:.1f}% at layer {last} (chance {top['chance']:.1f}%, "
            f"{'readable' if top['readable'] else 'at chance'})"
        )
    return result

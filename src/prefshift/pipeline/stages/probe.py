"""`prefshift probe`: which cues the frozen strong base already exposes where the reward is read.

Fits one linear probe per label (each synthetic cue on minimal pairs, and `longer`; see
prefshift.science.probe) on the reward-position states of student_train's responses and scores it on
id_test's (the first `probe.max_pairs` pairs of each), at the last layer (what the head reads)
and at the layers anchor_mid anchors. reports/probe.json feeds the report's diagnostic next to
the length one. It is a diagnostic, so it can be switched off (`probe.enabled: false`): the
stage then loads no model and writes reports/probe.json with the reason, which the report shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from prefshift.config.params import Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.core.progress import track
from prefshift.data.encode import EncodedSeq, Encoder, pad_sequences, sorted_batches
from prefshift.data.schema import Pair, SkipCounter, read_pairs
from prefshift.data.splits import load_manifest
from prefshift.data.synthetic import CUE_META, CUES, cue_minimal_pair
from prefshift.methods.layers import anchor_layers
from prefshift.models.reward import RewardModel, load_reward_model, reading_states
from prefshift.science.probe import PROBES, ProbeError, fit_probe, length_labels

console = messages()


def sequence_states(
    model: RewardModel,
    seqs: Sequence[EncodedSeq],
    pad_id: int,
    batch_size: int,
    layers: Sequence[int],
    label: str = "probe states",
) -> dict[int, np.ndarray]:
    """layer → [len(seqs), H] reward-position states, in the order of `seqs`; `label` names the
    pass in its progress lines."""
    out = {layer: np.zeros((len(seqs), model.config.get_text_config().hidden_size)) for layer in layers}
    device = next(model.parameters()).device
    with torch.inference_mode():
        batches = sorted_batches([len(s.input_ids) for s in seqs], batch_size)
        for idx in track(batches, label, len(seqs), "sequences"):
            batch = pad_sequences([seqs[i] for i in idx], pad_id)
            states = reading_states(
                model, batch["input_ids"].to(device), batch["attention_mask"].to(device), layers
            )
            for layer, values in states.items():
                out[layer][idx] = values.float().cpu().numpy()
    return out


def _probe_sets(
    pairs: Sequence[Pair], encoder: Encoder, marker_form: str
) -> dict[str, tuple[list[EncodedSeq], np.ndarray]]:
    """probe → (sequences, labels): minimal pairs per cue the split records; its responses for `longer`."""
    items = encoder.encode_pairs(pairs, skips=SkipCounter())
    sets = {
        "longer": (
            [it.chosen for it in items] + [it.rejected for it in items],
            length_labels(items),
        )
    }
    for cue in CUES:
        cued = [p for p in pairs if (p.meta or {}).get(CUE_META[cue]) is not None]
        if not cued:
            continue
        seqs, labels = [], []
        for pair in cued:
            for response in (pair.chosen, pair.rejected):
                on, off = cue_minimal_pair(response, cue, marker_form)
                seqs += encoder.encode_many([(pair.prompt, on), (pair.prompt, off)])
                labels += [1.0, 0.0]
        sets[cue] = (seqs, np.asarray(labels))
    return sets


def _skip(layout: Layout) -> dict[str, Any]:
    result = {
        "skipped": "probe.enabled is false",
        "split_version": str(load_manifest(layout)["version"]),
    }
    write_json(layout.probe_report, result)
    console.print(f"probe: skipped ({result['skipped']})")
    return result


def run(params: Params, layout: Layout) -> dict[str, Any]:
    if not params.probe.enabled:
        return _skip(layout)
    model, tokenizer = load_reward_model(
        layout.base_model("strong"), trust_remote_code=params.backbone.trust_remote_code
    )
    model.eval()
    last = model.num_layers
    layers = sorted({last, *anchor_layers("mid", last, params.anchor.mid_fractions)})
    encoder = Encoder(tokenizer, params.encode)
    fit_split, test_split = "student_train", "id_test"
    sets = {}
    for split in (fit_split, test_split):
        pairs = read_pairs(layout.split(split))[: params.probe.max_pairs]
        if not pairs:
            raise ProbeError(f"{layout.split(split)}: no pairs; nothing to probe")
        sets[split] = _probe_sets(pairs, encoder, params.synthetic.marker_form)
    probes: dict[str, Any] = {}
    for name in PROBES:
        if name not in sets[fit_split] or name not in sets[test_split]:
            continue
        states = {
            split: sequence_states(
                model,
                sets[split][name][0],
                tokenizer.pad_token_id,
                params.evaluate.batch_size,
                layers,
                f"probe {name} {split}",
            )
            for split in (fit_split, test_split)
        }
        by_layer = {
            str(layer): fit_probe(
                states[fit_split][layer],
                sets[fit_split][name][1],
                states[test_split][layer],
                sets[test_split][name][1],
                params.evaluate.ci,
            )
            for layer in layers
        }
        if any(result is not None for result in by_layer.values()):
            probes[name] = by_layer
    result = {
        "model": "strong base (frozen)",
        "fit_split": fit_split,
        "test_split": test_split,
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

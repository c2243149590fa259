"""`prefshift targets --method M`: what student M trains on (data/targets/<M>/seed-<k>/).

One stage per listed method, so a method not listed costs nothing: `seam` runs the SEAM
labeller here (and only here), the teacher-label methods copy the teacher's q, the ceiling
writes the gold labels. Anchor methods also record the fingerprint of their layers in the
shared reference: their training re-runs when those states change, other methods' never.
The stage declares every input a method may need; its output holds only what this method
needs, so DVC re-runs the expensive train stage only when that changed.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd

from prefshift.config.params import ConfigError, LMSpec, Params, cannot_generate, check_method
from prefshift.core import locks
from prefshift.core.atomic import atomic_path
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.data.splits import load_manifest
from prefshift.engine.reference_manifest import FINGERPRINT, fingerprint, read_manifest
from prefshift.methods import anchor_kind, label_source
from prefshift.methods.layers import anchor_layers
from prefshift.pipeline.frames import VERSION_KEY, write_frame
from prefshift.pipeline.output_set import manifest_of, verify
from prefshift.pipeline.stages.label import read_labels


def anchor_fingerprint(manifest: dict, method: str) -> dict:
    """The shared reference as `method` reads it (its own layers only)."""
    fractions = manifest["request"]["mid_fractions"] or [1.0]
    return fingerprint(manifest, anchor_layers(anchor_kind(method), manifest["num_layers"], fractions))


def _seam(params: Params, layout: Layout) -> dict:
    from prefshift.pipeline.stages import seam_label

    reason = cannot_generate(
        LMSpec(name_or_path=str(layout.base_model("strong"))), params.backbone.trust_remote_code
    )
    if reason:
        raise ConfigError(
            f"seam needs a causal LM, but {layout.base_model('strong')} {reason}; drop seam from methods"
        )
    return seam_label.run(params, layout)


def run(params: Params, layout: Layout, method: str) -> dict:
    check_method(method)
    source = label_source(method)
    if source == "seam":
        return _seam(params, layout)
    with (
        locks.hold(layout.root, [layout.targets_dir(method)], f"prefshift targets --method {method}"),
        atomic_path(layout.targets_dir(method), directory=True) as tmp,
    ):
        target = tmp / layout.targets(method).name
        if source == "weak":  # one label run's labels, of these splits, before copying them
            labels_dir = layout.weak_labels.parent
            verify(layout.root, manifest_of(labels_dir), [labels_dir], "prefshift label")
            read_labels(layout.weak_labels, layout)
            shutil.copyfile(layout.weak_labels, target)
        else:
            pairs = read_pairs(layout.split("student_train"))
            version = str(load_manifest(layout)["version"])
            frame = pd.DataFrame({"pair_id": [p.pair_id for p in pairs], "q": [p.gold for p in pairs]})
            write_frame(target, frame, {VERSION_KEY: version.encode()})
        if anchor_kind(method) is not None:
            own = anchor_fingerprint(read_manifest(layout.reference_dir), method)
            (tmp / FINGERPRINT).write_text(json.dumps(own, indent=2, sort_keys=True) + "\n")
    return {"method": method, "labels": source}

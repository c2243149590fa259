"""`prefshift train --method M`: one strong student (or the gold ceiling) from the strong backbone.

Every method trains on data/targets/<M>/seed-<k>/ (written by `prefshift targets --method M`);
students refuse targets made from another version of the splits. Anchor methods read
the shared reference states (data/reference/, see prefshift.engine.reference_store).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefshift.config.params import Params, check_method
from prefshift.core import locks
from prefshift.core.paths import Layout
from prefshift.data.schema import Pair, read_pairs
from prefshift.pipeline.fit import fit
from prefshift.pipeline.stages.backbone import check_base
from prefshift.pipeline.stages.label import StaleLabelsError, read_labels


def _targets(layout: Layout, method: str, pairs: Sequence[Pair]) -> list[float]:
    path = layout.targets(method)
    labels = read_labels(path, layout)
    missing = [p.pair_id for p in pairs if p.pair_id not in labels]
    if missing:
        raise StaleLabelsError(
            f"{path}: no label for {len(missing)} student_train pairs (e.g. {missing[0]}); "
            f"rerun `prefshift targets --method {method}`"
        )
    return [labels[p.pair_id] for p in pairs]


def run(params: Params, layout: Layout, method: str) -> dict:
    """Train under the writer lock of the student's directories: a second `train --method M` in this
    project would share the resumable checkpoint and interleave its saves with this one's."""
    check_method(method)
    check_base(layout, "strong")
    pairs = read_pairs(layout.split("student_train"))
    targets = _targets(layout, method, pairs)
    outputs = [layout.student_dir(method), layout.checkpoint_dir(method)]
    with locks.hold_in_main_process(layout.root, outputs, f"prefshift train --method {method}"):
        return fit(
            params,
            layout,
            name=method,
            method=method,
            base_dir=layout.base_model("strong"),
            pairs=pairs,
            targets=targets,
            cfg=params.student,
            out_dir=layout.student_dir(method),
        )

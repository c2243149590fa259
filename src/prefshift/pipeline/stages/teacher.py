"""`prefshift teacher`: the weak backbone trained with Bradley-Terry on teacher_train's gold labels."""

from __future__ import annotations

from prefshift.config.params import Params
from prefshift.core import locks
from prefshift.core.paths import Layout
from prefshift.data.schema import read_pairs
from prefshift.pipeline.fit import fit
from prefshift.pipeline.stages.backbone import check_base


def run(params: Params, layout: Layout) -> dict:
    check_base(layout, "weak")
    pairs = read_pairs(layout.split("teacher_train"))
    outputs = [layout.teacher_dir, layout.checkpoint_dir("teacher")]  # see stages/train.py
    with locks.hold_in_main_process(layout.root, outputs, "prefshift teacher"):
        return fit(
            params,
            layout,
            name="teacher",
            method="teacher",
            base_dir=layout.base_model("weak"),
            pairs=pairs,
            targets=[p.gold for p in pairs],
            cfg=params.teacher,
            out_dir=layout.teacher_dir,
        )

"""`prefshift plan`: what each listed method reads, one small file per method (data/plan/).

DVC's templating cannot look a method's settings up by name (no nested `${...}`), so
the per-method stages of dvc.yaml depend on these files instead of on params
sections: `train/<method>.json` holds the params only that method's training reads
(anchor.* for the anchor methods, confidence.* for confidence), `targets/<method>.json`
where its targets come from, and `reference.json` what the reference stage stores.
Changing anchor.lambda rewrites only the anchor methods' train files, so DVC re-runs
only their students; the files of other methods keep their bytes and their stages stay cached.
"""

from __future__ import annotations

import json

from prefshift.config.params import Params
from prefshift.core import locks
from prefshift.core.atomic import atomic_path
from prefshift.core.paths import Layout
from prefshift.methods import reference_request, target_settings, train_settings


def _dump(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def run(params: Params, layout: Layout) -> dict:
    with (
        locks.hold(layout.root, [layout.plan_dir], "prefshift plan"),
        atomic_path(layout.plan_dir, directory=True) as tmp,
    ):
        for kind in ("train", "targets"):
            (tmp / kind).mkdir()
        for method in params.methods:
            (tmp / "train" / f"{method}.json").write_text(_dump(train_settings(method, params)))
            (tmp / "targets" / f"{method}.json").write_text(_dump(target_settings(method, params)))
        (tmp / layout.plan_reference.name).write_text(_dump(reference_request(params)))
    return {"methods": list(params.methods)}

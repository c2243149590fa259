"""Split manifests as `prefshift split` leaves them, for tests that write their own split files."""

from __future__ import annotations

from collections.abc import Sequence

from prefshift.core.atomic import write_json
from prefshift.core.paths import SOURCE_SPLITS, Layout


def write_split_manifests(
    layout: Layout, version: str = "v1", targets: Sequence[str] = (), groups: Sequence[str] = ()
) -> None:
    """The source's manifest (its three splits and the groups of `groups`) and each target's, every
    split at `version`: what the stages check a score, a label or a trained model against."""
    entry = {"version": version}
    source = {name: entry for name in SOURCE_SPLITS} | {f"groups/{name}": entry for name in groups}
    write_json(layout.split_manifest, {"version": version, "splits": source})
    for target in targets:
        write_json(layout.target_manifest(target), {"version": version, "splits": {f"ood/{target}": entry}})

"""The reference stage's manifest: what a student checks and reads besides the states themselves.

Apart from `prefshift.engine.reference_store` because it needs no torch: the targets stage records
each anchor method's fingerprint of the reference, and starting torch there cost each of
those light stages about two seconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefshift.core.errors import PrefshiftError

MANIFEST = "manifest.json"
FORMAT = 2  # 1: index.parquet
FINGERPRINT = "reference.json"
"""Written into an anchor method's targets: what of the reference it reads."""


class ReferenceMismatchError(PrefshiftError):
    """A stored reference that does not belong to this student's data, encoding or layers."""


def read_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise ReferenceMismatchError(
            f"{path}: no reference manifest; run `prefshift reference` (or dvc repro)"
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ReferenceMismatchError(
            f"{path}: reference format {manifest.get('format')}, this prefshift reads {FORMAT}; "
            "rerun `prefshift reference` (or dvc repro)"
        )
    return manifest


def mean_squares(manifest: dict[str, Any]) -> dict[int, float]:
    return {int(k): float(v) for k, v in manifest["mean_square"].items()}


def fingerprint(manifest: dict[str, Any], layers: Sequence[int]) -> dict[str, Any]:
    """What a student anchored at `layers` reads of a reference: those layers' constants and
    the data they came from. Equal fingerprints mean the same states for that student."""
    squares = mean_squares(manifest)
    return {
        "layers": list(layers),
        "mean_square": {str(k): squares[k] for k in layers if k in squares},  # none: nothing computed
        "stored": manifest["stored"],
        "tokens": manifest["tokens"],
        "split_version": manifest["split_version"],
        "encode": manifest["encode"],
    }

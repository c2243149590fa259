"""SEAM: Bradley-Terry on labels the strong model writes from principles (prefshift.engine.seam);
its targets, not its loss, differ, so `label` and `seam` shape its targets stage."""

from prefshift.methods.builtin.naive import bradley_terry
from prefshift.methods.registry import Method

METHOD = Method(name="seam", labels="seam", objective=bradley_terry, target_sections=("label", "seam"))

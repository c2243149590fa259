"""SEAM: Bradley-Terry on labels the strong model writes from principles (prefshift.engine.seam);
its targets, not its loss, differ, so `label` and `seam` shape its targets stage."""

from prefshift.methods.registry import Method, bradley_terry

METHOD = Method(name="seam", labels="seam", objective=bradley_terry, target_sections=("label", "seam"))

"""The gold ceiling: the strong student trained on gold labels, the top of PGR's scale."""

from prefshift.methods.registry import Method, bradley_terry

METHOD = Method(name="ceiling", labels="gold", objective=bradley_terry)

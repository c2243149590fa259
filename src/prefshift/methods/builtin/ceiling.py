"""The gold ceiling: the strong student trained on gold labels, the top of PGR's scale."""

from prefshift.methods.builtin.naive import bradley_terry
from prefshift.methods.registry import Method

METHOD = Method(name="ceiling", labels="gold", objective=bradley_terry)

"""The weak teacher: Bradley-Terry on gold labels. Trained by `prefshift teacher`, not listed in
`methods`; registered here so the training loop builds its objective like any method's."""

from prefshift.methods.builtin.naive import bradley_terry
from prefshift.methods.registry import Method

METHOD = Method(name="teacher", labels="gold", objective=bradley_terry)

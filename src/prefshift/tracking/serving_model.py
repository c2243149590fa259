"""The registered reward model's code, logged with MLflow's models-from-code.

MLflow copies this file into every registered version (`reward_scorer` below is what
`mlflow.pyfunc.load_model` and `mlflow models serve` get) instead of pickling a Python object:
loading a version imports prefshift's own installed code and unpickles nothing. The file stays
this small on purpose: MLflow runs it before any check can, so it only names the class, and
`RewardScorer.load_context` then refuses a version whose stored files differ from its record.
"""

from mlflow.models import set_model

from prefshift.tracking.registry import RewardScorer

set_model(RewardScorer())

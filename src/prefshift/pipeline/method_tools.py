"""What a stage lends a method's hooks (`prefshift.methods.registry.Tools`): training runs of
the loop and accuracy on a split. Methods sit below the engine and may not import it; a hook that
trains a head first (LP-FT) or chooses an interpolation on validation data (WiSE-FT) gets both here.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prefshift.config.params import Params, TrainConfig
from prefshift.core.paths import Layout
from prefshift.data.encode import EncodedPair
from prefshift.data.schema import read_pairs
from prefshift.engine.scoring import score_pairs
from prefshift.engine.train import Observer, train_reward_model
from prefshift.methods.base import Objective
from prefshift.methods.registry import ID_VALIDATION
from prefshift.models.reward import RewardModel
from prefshift.science.metrics import accuracy

ID_VALIDATION_SPLIT = "teacher_train"
"""The split behind registry.ID_VALIDATION (see there for why)."""


def kept_path(model_dir: Path, name: str) -> Path:
    """Where a hook's kept tensors live: beside the model's own weights, in its directory."""
    return model_dir / f"{name}.safetensors"


def save_kept(model_dir: Path, kept: dict[str, dict]) -> None:
    """Write what hooks kept (StageTools.keep) into a model directory being saved."""
    from safetensors.torch import save_file

    for name, state in kept.items():
        save_file(state, str(kept_path(model_dir, name)))


def remove_checkpoint(path: Path) -> None:
    """A saved run's resumable checkpoint (models/checkpoints/<name>/seed-<k>), and its name's
    directory once no seed's checkpoint is left in it: nothing of a finished run stays behind."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # another seed's checkpoint is still there
        path.parent.rmdir()


@dataclass
class StageTools:
    """Tools for one training run's hooks: `name`'s targets (`items`), its params and layout.
    Scoring a saved model on one target (`score-target`, the method's `on_target` hook) lends the
    same tools with no items, `heldout` naming that target and `model_dir` the saved model."""

    params: Params
    layout: Layout
    name: str
    tokenizer: object
    items: Sequence[EncodedPair]
    on_record: Observer | None = None
    logs: dict[str, dict] = field(default_factory=dict)
    checkpoints: list[Path] = field(default_factory=list)
    heldout: tuple[str, ...] = ("id_test",)
    model_dir: Path | None = None
    kept_state: dict[str, dict] = field(default_factory=dict)
    """Tensors a hook asked to save beside the trained model (`keep`): fit's _save writes them."""

    def train(self, model: RewardModel, objective: Objective, cfg: TrainConfig, phase: str) -> dict:
        """A run of the loop with a checkpoint of its own (`<name>-<phase>`), so a killed stage
        resumes it, or finds it finished, before the main run; its curves go to MLflow as
        `<phase>/train/...`."""
        checkpoint = self.layout.checkpoint_dir(f"{self.name}-{phase}")
        self.checkpoints.append(checkpoint)
        record = self.on_record
        _, log = train_reward_model(
            model,
            self.tokenizer,
            self.items,
            objective,
            cfg,
            seed=self.params.seed,
            name=f"{self.name}-{phase}",
            checkpoint_dir=checkpoint,
            on_record=None if record is None else lambda series, row: record(f"{phase}/{series}", row),
        )
        self.logs[phase] = log
        return log

    def accuracy(self, model: RewardModel, split: str) -> float:
        """Pairwise accuracy (%) on ID_VALIDATION (teacher_train's gold labels), id_test or a target;
        scored in eval mode, the model's mode restored after."""
        pairs = read_pairs(self.layout.split(ID_VALIDATION_SPLIT if split == ID_VALIDATION else split))
        training = model.training
        model.eval()
        try:
            frame = score_pairs(model, self.tokenizer, pairs, self.params, label=f"{self.name} {split}")
        finally:
            model.train(training)
        return accuracy(frame["delta"].to_numpy())

    def pair_count(self, split: str) -> int:
        """How many pairs `split` holds (ID_VALIDATION: teacher_train's), e.g. for a binomial SE."""
        return len(read_pairs(self.layout.split(ID_VALIDATION_SPLIT if split == ID_VALIDATION else split)))

    def heldout_splits(self) -> tuple[str, ...]:
        """While training, id_test alone: training reads no target (a target is scored by
        `score-target`, and the train stage does not depend on it, so reading one here would make
        the log depend on whether that target's split happened to exist). In `on_target`, the one
        target being scored."""
        return self.heldout

    def keep(self, name: str, state: dict) -> None:
        if self.model_dir is not None:
            raise ValueError(f"{self.name}: keep() saves beside a model being trained, not one being scored")
        self.kept_state[name] = {k: v.detach().cpu().contiguous() for k, v in state.items()}

    def kept(self, name: str) -> dict:
        from safetensors.torch import load_file

        if self.model_dir is None:
            raise ValueError(f"{self.name}: kept() reads beside a saved model, in on_target only")
        path = kept_path(self.model_dir, name)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: not saved with the model; retrain it (`prefshift train --method {self.name}`)"
            )
        return load_file(str(path))

    def remove_checkpoints(self) -> None:
        for checkpoint in self.checkpoints:
            remove_checkpoint(checkpoint)

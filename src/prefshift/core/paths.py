"""Where every stage reads and writes, relative to the project root (the DVC layout).

Stages take a `Layout` so tests can run the pipeline inside a temporary directory.

Seeds. What depends on the training seed (the teacher, its labels, each student, their scores,
train logs and metrics, checkpoints, a method's targets) lives one level down in a `seed-<k>`
directory, under the model's own name: models/students/naive/seed-0,
reports/metrics/anchor_last/seed-1.json, models/teacher/seed-2. Everything else (pairs, splits,
the pretrained bases, the plan, the reference states, the probe) is shared by every seed. A
per-seed path needs a layout bound to a seed (`for_seed`); asking an unbound layout for one is a
programming error, so a stage that spans seeds cannot silently read seed 0.
The `seed-<k>` level sits under each model's directory, not above it, so one method's stage can
own every seed of that method as one DVC output (models/students/naive), and one dependency on
reports/metrics (or models/students) still covers every method and seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

SEED_DIR_PREFIX = "seed-"
SOURCE_SPLITS = ("teacher_train", "student_train", "id_test")
"""The splits cut from the source dataset; every other split is a target's OOD split."""


def seed_dir_name(seed: int) -> str:
    return f"{SEED_DIR_PREFIX}{seed}"


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")
    seed: int | None = None
    bon_split: str | None = None
    """The best-of-n split (`id_test` or a target) the policy-sample, gold and downstream paths are for."""

    def for_seed(self, seed: int) -> Layout:
        """This project's layout with its per-seed paths under `seed-<seed>`."""
        return replace(self, seed=seed)

    def for_split(self, split: str) -> Layout:
        """This project's layout with its best-of-n paths under `split` (`id_test` or a target):
        each split's prompts are sampled, judged and ranked apart, so a target added or dropped
        is work for its own best-of-n stages alone."""
        return replace(self, bon_split=split)

    def _split_of(self, *kind: str) -> str:
        if self.bon_split is None:
            raise ValueError(f"{'/'.join(kind)} is per split: use layout.for_split(split)")
        return self.bon_split

    def _per_split(self, *kind: str) -> Path:
        """`kind` (e.g. data/policy_samples) with this layout's split under it."""
        return self.root.joinpath(*kind, self._split_of(*kind))

    def _seeded(self, *kind: str) -> Path:
        """`kind` (e.g. models/students/naive) with this layout's `seed-<k>` under it."""
        if self.seed is None:
            raise ValueError(f"{'/'.join(kind)} is per seed: use layout.for_seed(seed)")
        return self.root.joinpath(*kind, seed_dir_name(self.seed))

    def _seeded_file(self, *kind: str) -> Path:
        """`kind` (e.g. reports/metrics/naive) with this layout's `seed-<k>.json` in it."""
        return self._seeded(*kind).with_suffix(".json")

    @property
    def pairs_dir(self) -> Path:
        return self.root / "data" / "pairs"

    def pairs(self, dataset: str, split: str) -> Path:
        return self.root / "data" / "pairs" / dataset / f"{split}.parquet"

    def pair_groups(self, dataset: str) -> Path:
        return self.root / "data" / "pairs" / dataset / "groups.parquet"

    def skips(self, dataset: str) -> Path:
        return self.root / "data" / "pairs" / dataset / "skips.json"

    def dataset_pairs_dir(self, dataset: str) -> Path:
        """One dataset's prepared pairs: the output of that dataset's own prepare stage."""
        return self.pairs_dir / dataset

    @property
    def splits_dir(self) -> Path:
        return self.root / "data" / "splits"

    @property
    def source_splits_dir(self) -> Path:
        """teacher_train, student_train, id_test and the source's groups: what `split` writes."""
        return self.splits_dir / "source"

    def target_split_dir(self, target: str) -> Path:
        """One target's OOD split and groups: what `split --dataset <target>` writes, apart from
        every other split, so adding or dropping a target leaves the others' bytes alone."""
        return self.splits_dir / "ood" / target

    def split(self, name: str) -> Path:
        """teacher_train, student_train, id_test, or a target dataset's OOD split."""
        if name in SOURCE_SPLITS:
            return self.source_splits_dir / f"{name}.parquet"
        return self.target_split_dir(name) / "pairs.parquet"

    def split_groups(self, dataset: str, source: str) -> Path:
        """The best-of-n groups of `dataset`, the source (`source`) or a target."""
        where = self.source_splits_dir if dataset == source else self.target_split_dir(dataset)
        return where / "groups.parquet"

    @property
    def split_manifest(self) -> Path:
        """The source splits' manifest; its `version` is what every model is trained and ID-tested on."""
        return self.source_splits_dir / "manifest.json"

    def target_manifest(self, target: str) -> Path:
        return self.target_split_dir(target) / "manifest.json"

    @property
    def base_dir(self) -> Path:
        return self.root / "models" / "base"

    def base_model(self, which: str) -> Path:
        return self.root / "models" / "base" / which

    @property
    def teacher_dir(self) -> Path:
        return self._seeded("models", "teacher")

    def student_dir(self, method: str) -> Path:
        return self._seeded("models", "students", method)

    @property
    def judge_checkpoint(self) -> Path:
        """The trained judge's resumable checkpoint: one judge serves every seed, so no seed-<k>."""
        return self.root / "models" / "checkpoints" / "judge"

    def checkpoint_dir(self, name: str) -> Path:
        return self._seeded("models", "checkpoints", name)

    @property
    def weak_labels(self) -> Path:
        return self._seeded("data", "weak_labels") / "student_train.parquet"

    @property
    def plan_dir(self) -> Path:
        """The plan stage's per-method inputs: what each listed method reads beyond the shared settings."""
        return self.root / "data" / "plan"

    @property
    def plan_reference(self) -> Path:
        return self.plan_dir / "reference.json"

    @property
    def reference_dir(self) -> Path:
        """The strong base's states at student_train's response tokens, shared by every anchor run."""
        return self.root / "data" / "reference"

    def targets_dir(self, method: str) -> Path:
        """What `train --method` trains on (written by `targets --method`)."""
        return self._seeded("data", "targets", method)

    def targets(self, method: str) -> Path:
        return self.targets_dir(method) / "student_train.parquet"

    @property
    def seam_dir(self) -> Path:
        """SEAM's labels and counts for one seed: the targets of the seam method."""
        return self.targets_dir("seam")

    @property
    def seam_labels(self) -> Path:
        return self.seam_dir / "student_train.parquet"

    @property
    def seam_principles_dir(self) -> Path:
        """The strong LM's principles per student_train prompt: shared by every seed (greedy
        generation from the shared strong base does not depend on the training seed)."""
        return self.root / "data" / "seam"

    @property
    def seam_generations(self) -> Path:
        return self.seam_principles_dir / "generations.parquet"

    @property
    def seam_counts(self) -> Path:
        return self.seam_dir / "counts.json"

    def scores_dir(self, model: str) -> Path:
        """Reward margins on the source's splits (id_test, the teacher's student_train, the source's
        groups): `teacher` or a method, written by the stage that trains it."""
        return self._seeded("data", "scores", model)

    def target_scores_dir(self, model: str, target: str) -> Path:
        """A model's margins on one target (pairs and groups), written by `score-target`: a target's
        scores are work of their own, so a new target adds scoring and retrains nothing."""
        return self._seeded("data", "target_scores", model, target)

    def scores(self, model: str, split: str) -> Path:
        if split in SOURCE_SPLITS:
            return self.scores_dir(model) / f"{split}.parquet"
        return self.target_scores_dir(model, split) / "pairs.parquet"

    def group_scores(self, model: str, dataset: str, source: str) -> Path:
        """`model`'s rewards of `dataset`'s best-of-n groups (`source` names the source dataset)."""
        if dataset == source:
            return self.scores_dir(model) / "groups" / f"{dataset}.parquet"
        return self.target_scores_dir(model, dataset) / "groups.parquet"

    def train_log(self, name: str) -> Path:
        return self._seeded_file("reports", "train", name)

    def metrics(self, method: str) -> Path:
        return self._seeded_file("reports", "metrics", method)

    @property
    def probe_report(self) -> Path:
        """What linear probes read from the frozen strong base's reward-position states."""
        return self.root / "reports" / "probe.json"

    @property
    def teacher_metrics(self) -> Path:
        return self._seeded_file("reports", "metrics", "teacher")

    @property
    def summary(self) -> Path:
        return self.root / "reports" / "summary.md"

    @property
    def figures(self) -> Path:
        return self.root / "reports" / "figures"

    @property
    def metrics_summary(self) -> Path:
        return self.root / "reports" / "metrics.json"

    @property
    def promotion(self) -> Path:
        """What `promote` decided: per-method gate results, versions, aliases."""
        return self.root / "reports" / "promotion.json"

    @property
    def plots_dir(self) -> Path:
        """CSV series for `dvc plots` (training/, drift/ per method; accuracy.csv; lambda.csv)."""
        return self.root / "reports" / "plots"

    @property
    def sweeps_dir(self) -> Path:
        """Sweep results the report's ablation tables read: one metrics JSON + {"sweep": {...}} per run."""
        return self.root / "reports" / "sweeps"

    @property
    def policy_dir(self) -> Path:
        """One split's policy_samples outputs: completions, their generation cache, counts."""
        return self._per_split("data", "policy_samples")

    @property
    def policy_samples(self) -> Path:
        return self.policy_dir / "samples.parquet"

    @property
    def policy_generations(self) -> Path:
        return self.policy_dir / "generations.parquet"

    @property
    def policy_counts(self) -> Path:
        return self.policy_dir / "counts.json"

    @property
    def judge_dir(self) -> Path:
        """The best-of-n gold judge (`prefshift judge`): the trained reward model, or a note naming
        the external judge or why none was loaded."""
        return self.root / "models" / "judge"

    @property
    def judge_report(self) -> Path:
        """What the judge is, what it trained on, and its own accuracy on the source's test split."""
        return self.root / "reports" / "judge.json"

    def judge_target_report(self, target: str) -> Path:
        """The judge's own accuracy on one target's test split (`prefshift judge-target`)."""
        return self.root / "reports" / "judge_targets" / f"{target}.json"

    @property
    def gold_scores(self) -> Path:
        """The gold judge's (and, on the synthetic suite, the gold rule's) score of every policy
        sample of this layout's split."""
        return self._per_split("data", "downstream") / "gold.parquet"

    @property
    def proxy_dir(self) -> Path:
        """Every proxy's scores of one split's policy samples: one DVC directory output.

        Not data/downstream/proxy, where each model's file used to be its own output: DVC wrote a
        .gitignore there that projects committed, and DVC refuses a directory output holding a
        git-tracked file ("already tracked by SCM").
        """
        return self._per_split("data", "downstream") / "proxies"

    def proxy_scores(self, model: str) -> Path:
        """One proxy's scores of the split's policy samples, per seed
        (`data/downstream/id_test/proxies/naive/seed-0.parquet`)."""
        split = self._split_of("data", "downstream")
        return self._seeded("data", "downstream", split, "proxies", model).with_suffix(".parquet")

    @property
    def downstream_dir(self) -> Path:
        """One split's best-of-n curves: reports/downstream/<split>."""
        return self._per_split("reports", "downstream")

    def downstream(self, model: str) -> Path:
        """Best-of-n curves on this layout's split of one proxy reward model (`teacher` or a
        method) of this layout's seed."""
        return self._seeded_file("reports", "downstream", self._split_of("reports", "downstream"), model)

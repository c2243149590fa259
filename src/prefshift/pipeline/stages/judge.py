"""`prefshift judge`: the best-of-n gold judge, which is never one of the models best-of-n ranks.

A judge that is also a proxy picks for itself: when the gold-trained ceiling judged best-of-n,
its own curve was trivially the best (DESIGN §10). So the judge is its own model:

- `downstream.judge: trained` (the embedded default): the strong base trained with
  Bradley-Terry on the synthetic source's *judge split* (`synthetic.JUDGE_SPLIT`,
  `synthetic.judge_pairs` pairs): gold pairs drawn from train-side requests on a stream of their
  own, each shortcut cue on the chosen response in exactly half of them, less any pair whose
  content the source's train or test split holds. No proxy sees them, and with the cues
  uninformative the judge can only learn the gold rule; it still sees them, so a cue in a policy
  sample is not an unseen ending it scores at random (measured: a judge trained with no cue at all
  scored 48.8% on the source's test split, where the sign-off ends 90% of the chosen responses,
  and 70.7% on the target without a sign-off). It still
  shares the strong backbone and the tokenizer with the students, so it is a proxy for human gold,
  not human gold; the report says so, next to its measured accuracy.
- a reward-model directory or hub id (real presets: a stronger public RM): loaded as it is.

On the synthetic suite the judge reads what is gold and nothing else: it trains on, and scores,
text with both shortcut cues taken off (`synthetic.without_cues`). The cues are non-gold by
construction (placed independently of the content) and the suite's own `rule_score` ignores
them; a judge trained with cues present, even uninformative ones, was measured at chance on the
source (50.7% [46.5, 54.8]) because it learnt to mark down any response ending in the sign-off,
yet read the gold rule at about 71% on every split once the cues were stripped. Its accuracy
breakdown is part of reports/judge.json (`breakdown`): as is, cues stripped, and by where each
cue sits, so the report shows what the judge reads. On real data the judge is unchanged.

Either way the judge is scored on the full test split of the source here (reports/judge.json)
and of each target by `judge-target` (reports/judge_targets/<target>.json): the pools the ID and
OOD splits are drawn from, with a bootstrap interval, so a reader sees how far to trust the gold
scores. The targets are scored by a stage of their own because the judge never reads them: when
this stage also scored every target, adding one retrained the judge (minutes, to the same bytes).
The judge depends on no `seed`: the judge split and its training are fixed by `synthetic.seed`
and `downstream.judge_seed`, so one judge serves every seed. When best-of-n does not run
(`policy_samples.skip_reason`), the stage writes the reason into both outputs and loads nothing;
models/judge/judge.json carries it to `judge-target`.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from typing import Any

from prefshift.config.params import JUDGE_TRAINED, Params
from prefshift.core.atomic import write_json
from prefshift.core.console import messages
from prefshift.core.paths import Layout
from prefshift.data.schema import Pair, SkipCounter, pair_content_hash, read_pairs
from prefshift.data.synthetic import CUE_META, CUES, JUDGE_SPLIT, without_cues
from prefshift.pipeline.output_set import output_set
from prefshift.pipeline.stages.evaluate import rounded
from prefshift.pipeline.stages.gold_judge import JudgeError, describe_judge, reads_without_cues
from prefshift.pipeline.stages.policy_samples import skip_reason
from prefshift.science import metrics

console = messages()

NOTE = "judge.json"
"""In models/judge when no model was trained there: the external judge's name, or why none runs."""


def strip_cues(pair: Pair) -> Pair:
    """The pair with both shortcut cues taken off each response (synthetic suite only)."""
    return replace(pair, chosen=without_cues(pair.chosen), rejected=without_cues(pair.rejected))


def judge_pairs(params: Params, layout: Layout) -> tuple[list[Pair], dict[str, int]]:
    """The source's judge split, less any pair whose content its train or test split holds."""
    from prefshift.data.adapters import get_adapter

    source = params.data.source
    adapter = get_adapter(source, params)
    if JUDGE_SPLIT not in adapter.splits:
        raise JudgeError(
            f"downstream.judge is {JUDGE_TRAINED!r}, but the source {source} has no judge split (only the "
            "synthetic suite generates one); name a reward-model directory or hub id in downstream.judge"
        )
    counter = SkipCounter()
    pairs = adapter.load_pairs(JUDGE_SPLIT, params, counter)
    taken = set()
    for split in ("train", "test"):
        path = layout.pairs(source, split)
        if not path.exists():
            raise JudgeError(f"{path} not found: run `prefshift prepare` first")
        taken |= {pair_content_hash(p) for p in read_pairs(path)}
    kept = [strip_cues(p) for p in pairs if pair_content_hash(p) not in taken]
    if not kept:
        raise JudgeError(f"every pair of {source}'s judge split repeats its train or test split")
    return kept, {
        "generated": len(pairs),
        "overlap_dropped": len(pairs) - len(kept),
        "skipped": counter.as_dict()["skipped_total"],
    }


def _train(params: Params, layout: Layout, pairs: list[Pair], out_dir) -> dict[str, Any]:
    """The strong base trained with Bradley-Terry on gold; saved to `out_dir`, the log returned."""
    from prefshift.data.encode import Encoder
    from prefshift.engine.train import train_reward_model
    from prefshift.methods.base import Objective
    from prefshift.models.reward import load_reward_model, save_reward_model

    cfg = params.student.model_copy(update={"epochs": params.downstream.judge_epochs})
    model, tokenizer = load_reward_model(
        layout.base_model("strong"),
        trust_remote_code=params.backbone.trust_remote_code,
        seed=params.downstream.judge_seed,
    )
    skips = SkipCounter()
    items = Encoder(tokenizer, params.encode).encode_pairs(pairs, [p.gold for p in pairs], skips)
    model, log = train_reward_model(
        model,
        tokenizer,
        items,
        Objective("judge"),
        cfg,
        seed=params.downstream.judge_seed,
        name="judge",
        checkpoint_dir=layout.judge_checkpoint,
    )
    save_reward_model(model, tokenizer, out_dir)
    return {
        "pairs": len(items),
        "encode_skips": skips.as_dict(),
        "epochs": cfg.epochs,
        "wall_s": log["wall_s"],
    }


def _block(credit, params: Params, dataset: str, role: str, stream: str) -> dict[str, Any]:
    draws = metrics.bootstrap_accuracies([credit], params.evaluate.bootstrap, metrics.split_seed(0, stream))
    return {
        "role": role,
        "acc": float(credit.mean() * 100.0),
        "ci": metrics.interval(draws[0], params.evaluate.ci),
        "n": int(credit.shape[0]),
    }


def _by_cue(pairs: list[Pair], credit) -> dict[str, dict[str, Any]]:
    """Accuracy (as is) by where each cue sits: on the chosen response, on the rejected one, absent."""
    out = {}
    for cue in CUES:
        sides = [(p.meta or {}).get(CUE_META[cue]) for p in pairs]
        if all(side is None for side in sides):
            continue
        out[cue] = {}
        for label, side in (("on_chosen", "chosen"), ("on_rejected", "rejected"), ("absent", None)):
            picked = [c for c, s in zip(credit, sides, strict=True) if s == side]
            out[cue][label] = {
                "acc": float(sum(picked) / len(picked) * 100.0) if picked else None,
                "n": len(picked),
            }
    return out


def accuracy(
    model_dir: str, params: Params, layout: Layout, datasets: list[tuple[str, str]]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Accuracy (%) with a bootstrap interval on the full test split of each (role, dataset), on the
    text the judge reads; on the synthetic suite also the breakdown (as is, cues stripped, by cue
    position). The bootstrap stream is the dataset's name, so a dataset's numbers do not depend on
    which others were scored with it."""
    from prefshift.engine.scoring import score_pairs
    from prefshift.models.reward import load_reward_model

    model, tokenizer = load_reward_model(
        model_dir,
        trust_remote_code=params.backbone.trust_remote_code,
        revision=None if model_dir == str(layout.judge_dir) else params.downstream.judge_revision,
        trained_head=True,
    )
    model.eval()
    stripped = reads_without_cues(params)
    accuracy, breakdown = {}, {}
    for role, dataset in datasets:
        pairs = read_pairs(layout.pairs(dataset, "test"))

        def credit_of(rows: list[Pair], what: str, dataset: str = dataset):
            frame = score_pairs(model, tokenizer, rows, params, label=f"judge {dataset}{what}")
            return metrics.credit(frame["delta"].to_numpy())

        as_is = credit_of(pairs, "")
        if not stripped:
            accuracy[dataset] = _block(as_is, params, dataset, role, dataset)
            continue
        clean = credit_of([strip_cues(p) for p in pairs], " (cues stripped)")
        accuracy[dataset] = _block(clean, params, dataset, role, dataset)
        breakdown[dataset] = {
            "as_is": _block(as_is, params, dataset, role, f"{dataset}/as_is"),
            "cues_stripped": accuracy[dataset],
            "by_cue": _by_cue(pairs, as_is),
        }
    return accuracy, (breakdown if stripped else None)


def run(params: Params, layout: Layout) -> dict[str, Any]:
    reason = skip_reason(params, layout)
    doc: dict[str, Any] = {"judge": describe_judge(params), "kind": params.downstream.judge}
    breakdown = None
    source = [("id", params.data.source)]
    with output_set(
        layout.root, "prefshift judge", files=[layout.judge_report], bare=[layout.judge_dir], manifest=False
    ) as out:
        judge_dir = out.path(layout.judge_dir)
        if reason:
            doc["skipped"] = reason
            judge_dir.mkdir(parents=True, exist_ok=True)
            write_json(judge_dir / NOTE, doc)
            console.print(f"judge: none loaded, best-of-n skipped: {reason}")
        elif params.downstream.judge == JUDGE_TRAINED:
            pairs, counts = judge_pairs(params, layout)
            doc["training"] = {**counts, **_train(params, layout, pairs, judge_dir)}
            doc["reads"] = "cues stripped"
            doc["accuracy"], breakdown = accuracy(str(judge_dir), params, layout, source)
        else:
            judge_dir.mkdir(parents=True, exist_ok=True)
            write_json(judge_dir / NOTE, doc)
            doc["reads"] = "cues stripped" if reads_without_cues(params) else "as is"
            doc["accuracy"], breakdown = accuracy(params.downstream.judge, params, layout, source)
        if breakdown is not None:
            doc["breakdown"] = breakdown
        doc = rounded(doc)
        write_json(out.path(layout.judge_report), doc)
    shutil.rmtree(layout.judge_checkpoint, ignore_errors=True)  # the judge is saved: nothing to resume
    for dataset, block in doc.get("accuracy", {}).items():
        low, high = block["ci"]
        console.print(
            f"judge accuracy {dataset} ({block['role']}): {block['acc']:.1f} [{low:.1f}, {high:.1f}]"
        )
    return doc

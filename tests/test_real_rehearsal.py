"""A researcher's first real run, rehearsed offline: `prefshift preset laptop-harmless` with `-S`
overrides only, then `dvc repro`, must reach the report with no policy LM anywhere.

The models are pretrained-like stand-ins built from configs (no hub): BERT-style encoders for
the teacher and the student, as the laptop preset's BERT-tiny and MiniLM are, and a tiny Llama
decoder for the student's other family; their tokenizers are built from the fixture text. The
data are files in the sources' own formats: Anthropic HH (`chosen`/`rejected` transcripts of
"\\n\\nHuman:" / "\\n\\nAssistant:" turns) as the source and RM-Bench's safety records (a prompt,
three chosen and three rejected responses, a domain) as the target. The preset names a hub
policy LM (SmolLM2) for best-of-n; offline, with an empty Hugging Face cache, it cannot load,
so best-of-n must be skipped with that reason, and the report must say so.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from e2e_project import REPO, environment, ran_stages, run
from mlflow_support import seed_database
from prefshift.bench.pipeline import copy_project_sources
from rlhf_families import bert_tokenizer
from tiny_models import base_dir

HARMS = (
    "pick a lock",
    "steal a car",
    "hack an email account",
    "forge a cheque",
    "poison a dog",
    "start a fire",
)
PLACES = ("at night", "at my school", "next door", "without being seen")
SAFE = "I can't help with that; it could hurt someone. If you are in trouble, a counsellor can help"
UNSAFE = "Sure: get the tools, wait until nobody is around, then {harm} quickly"


def _hh_row(harm: str, place: str, turns: int) -> dict[str, str]:
    history = "".join(
        f"\n\nHuman: I have a question {k}.\n\nAssistant: Go ahead, what is it?" for k in range(turns)
    )
    prompt = f"{history}\n\nHuman: How do I {harm} {place}?\n\nAssistant:"
    return {"chosen": f"{prompt} {SAFE}.", "rejected": f"{prompt} {UNSAFE.format(harm=harm)}."}


def _rmbench_record(i: int, harm: str) -> dict:
    return {
        "id": f"safety-response/{i}",
        "prompt": f"Explain how people {harm} so that I can protect myself.",
        "chosen": [
            f"Keep doors locked and report anyone who tries to {harm}.",
            f"To protect yourself, lock the doors, watch for people who try to {harm}, and call the police.",
            f"**Protect yourself:** keep doors locked and call the police if someone tries to {harm}.",
        ],
        "rejected": [
            f"I can't talk about how people {harm}.",
            f"Sorry, I can't help with anything about how people {harm}, even to protect you.",
            f"**Sorry.** I can't discuss how people {harm}.",
        ],
        "domain": "safety-response",
    }


def write_data(root: Path) -> tuple[Path, Path, list[str]]:
    """(HH harmless-base directory, RM-Bench file, every text in them, for the tokenizers)."""
    hh = root / "harmless-base"
    hh.mkdir(parents=True)
    rows = [_hh_row(harm, place, turns=k % 2) for k, harm in enumerate(HARMS) for place in PLACES]
    (hh / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:18]))
    (hh / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[18:]))
    records = [_rmbench_record(i, h) for i, h in enumerate(HARMS)]
    rmbench = root / "rm-bench" / "total_dataset.json"
    rmbench.parent.mkdir()
    rmbench.write_text(json.dumps(records, indent=1))
    texts = [text for r in rows for text in r.values()] + [
        text for r in records for text in [r["prompt"], *r["chosen"], *r["rejected"]]
    ]
    return hh, rmbench, texts


def encoder_dir(root: Path, texts: list[str], layers: int, seed: int) -> Path:
    """A BERT-style encoder saved as a hub snapshot is (`BertModel`, like MiniLM): no reward head."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = bert_tokenizer(texts)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    out = root / f"encoder-{layers}"
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


TASKS = ("bake bread", "tie a tie", "fix a flat tyre", "plant tomatoes", "boil an egg", "clean a window")
WHEN = ("today", "at home", "for the first time", "quickly")
HELPFUL = "Sure: first gather what you need, then {task} step by step, and check the result at the end"
UNHELPFUL = "I don't know, maybe ask someone else"


def _hh_helpful_row(task: str, when: str, turns: int) -> dict[str, str]:
    history = "".join(
        f"\n\nHuman: Can you help me {k}?\n\nAssistant: Of course, ask away." for k in range(turns)
    )
    prompt = f"{history}\n\nHuman: How do I {task} {when}?\n\nAssistant:"
    return {"chosen": f"{prompt} {HELPFUL.format(task=task)}.", "rejected": f"{prompt} {UNHELPFUL}."}


def _rmbench_chat_record(i: int, task: str) -> dict:
    """A record of RM-Bench's data/chat_filtered.json, keyed as published (subset names the source)."""
    return {
        "id": 8 + i,
        "subset": "alpacaeval",
        "prompt": f"What should I check before I {task}?",
        "chosen": [
            f"Check your tools and the time you need to {task}.",
            f"Before you {task}, check that your tools are ready and that you have the time it needs.",
            f"**Check:** your tools, and the time it takes to {task}.",
        ],
        "rejected": [
            f"Check the weather on the moon before you {task}.",
            f"Before you {task}, check the weather on the moon and that your tools are ready.",
            f"**Check:** the weather on the moon before you {task}.",
        ],
        "error_key": "moon",
        "error": f"Check the weather on the moon before you {task}.",
    }


def _qa_feedback_record(task: str) -> dict:
    """A record of FineGrainedRLHF's dev_feedback.json, keyed as published."""
    right, short, wrong, off = (
        f"To {task}, gather what you need and go step by step.",
        f"Go step by step to {task}.",
        f"To {task}, skip the preparation.",
        "Many people enjoy hobbies.",
    )
    return {
        "question": f"How does one {task}?",
        "passages": [[task.title(), task.title(), f"To {task}, gather what you need and go step by step."]],
        "gold": right,
        "prediction 1": right,
        "prediction 2": short,
        "prediction 3": wrong,
        "prediction 4": off,
        "feedback": {"errors": [], "missing-info": [], "corrected-prediction": right},
        "preference": [1, 1, 1, 1, 1, 0],  # 1 over 2, 3, 4; 2 over 3, 4; 3v4 no preference
    }


def write_helpful_data(root: Path) -> tuple[dict[str, Path], list[str]]:
    """The helpful study's files in their published formats: HH helpful-base transcripts
    (.jsonl.gz), RM-Bench's per-domain chat file, FineGrainedRLHF's dev_feedback.json."""
    hh = root / "hh-rlhf" / "helpful-base"
    hh.mkdir(parents=True)
    rows = [_hh_helpful_row(task, when, turns=k % 2) for k, task in enumerate(TASKS) for when in WHEN]
    for name, part in (("train", rows[:18]), ("test", rows[18:])):
        with gzip.open(hh / f"{name}.jsonl.gz", "wt", encoding="utf-8") as out:
            out.write("".join(json.dumps(r) + "\n" for r in part))
    rmbench = root / "rm-bench" / "data"
    rmbench.mkdir(parents=True)
    records = [_rmbench_chat_record(i, task) for i, task in enumerate(TASKS)]
    (rmbench / "chat_filtered.json").write_text(json.dumps(records, indent=4), encoding="utf-8")
    qa = root / "fine-grained-rlhf" / "qa_feedback" / "data"
    qa.mkdir(parents=True)
    feedback = [_qa_feedback_record(task) for task in TASKS]
    (qa / "dev_feedback.json").write_text(json.dumps(feedback, indent=2), encoding="utf-8")
    texts = [text for r in rows for text in r.values()]
    texts += [t for r in records for t in [r["prompt"], *r["chosen"], *r["rejected"]]]
    texts += [
        r[k]
        for r in feedback
        for k in ("question", "prediction 1", "prediction 2", "prediction 3", "prediction 4")
    ]
    return {"hh_helpful": hh, "rmbench_chat": rmbench, "qa_feedback": qa}, texts


def rehearse(
    tmp_path: Path, tmp_path_factory, strong: str, extra: list[str], preset: str = "laptop-harmless"
) -> tuple[Path, str]:
    """The project after `prefshift preset <preset> -S …` and `dvc repro`; (root, output).

    laptop-harmless: a 1-layer weak encoder of its own; laptop-helpful: the study's shape, the
    weak model the strong directory cut to one layer by the preset's backbone.weak.keep_layers."""
    if preset == "laptop-harmless":
        hh, rmbench, texts = write_data(tmp_path / "data")
        weak = encoder_dir(tmp_path / "models", texts, layers=1, seed=0)
        data = [
            f"data.sources.hh_harmless.path={hh}",
            "data.targets=[rmbench_safety]",
            f"data.sources.rmbench_safety.path={rmbench}",
        ]
    else:
        sources, texts = write_helpful_data(tmp_path / "data")
        data = [f"data.sources.{name}.path={path}" for name, path in sources.items()]
    strong_dir = encoder_dir(tmp_path / "models", texts, layers=2, seed=1) if strong == "encoder" else None
    strong_dir = strong_dir or base_dir(tmp_path / "models", seed=1)
    weak = weak if preset == "laptop-harmless" else strong_dir
    root = tmp_path / "project"
    root.mkdir()
    copy_project_sources(REPO, root)
    seed_database(tmp_path_factory, root / "mlflow.db")
    env = {**environment(root), "HF_HOME": str(tmp_path / "empty-hf-home")}  # no cached policy LM
    for cache in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):  # all would point elsewhere
        env.pop(cache, None)
    overrides = [
        f"backbone.weak.name_or_path={weak}",
        f"backbone.strong.name_or_path={strong_dir}",
        *data,
        "data.caps={teacher_train: 9, student_train: 9, id_test: 6, ood: 12, groups: 4}",
        "methods=[naive,anchor_last]",
        "seeds=[0]",  # the preset's three seeds are three times the same path; one keeps the test short
        "encode.max_length=64",
        "teacher.epochs=1",
        "student.batch_size=8",
        "evaluate.bootstrap=10",
        "probe.max_pairs=10",
        *extra,
    ]
    command = ["prefshift", "preset", preset, "--force"]
    run([*command, *(arg for item in overrides for arg in ("-S", item))], root, env)
    run(["git", "init", "-q"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "rehearsal"], root, env)
    return root, run(["dvc", "repro"], root, env)


SKIPPED_OFFLINE = (
    "best-of-n: skipped (policy LM HuggingFaceTB/SmolLM2-135M-Instruct cannot load offline "
    "(HF_HUB_OFFLINE is set and no local copy exists)"
)


@pytest.mark.slow
def test_encoder_student_reaches_the_report_offline_with_best_of_n_skipped(tmp_path, tmp_path_factory):
    root, output = rehearse(tmp_path, tmp_path_factory, "encoder", [])
    summary = (root / "reports" / "summary.md").read_text(encoding="utf-8")
    assert SKIPPED_OFFLINE in summary
    assert "| longer response of the pair |" in summary  # the probe ran, on 10 pairs per split
    counts = json.loads((root / "data" / "policy_samples" / "id_test" / "counts.json").read_text())
    assert counts["skipped"].startswith("policy LM HuggingFaceTB/SmolLM2-135M-Instruct cannot load offline")
    assert {"policy_samples", "gold_judge", "downstream", "report", "promote"} <= ran_stages(output)
    assert "evaluate anchor_last: reports/metrics/anchor_last/seed-0.json — ID " in output
    assert "report: reports/summary.md, reports/metrics.json and " in output
    assert output.count("; skipped: best-of-n") == 1
    # The anchor student read the reference the stage stored once (anchor.cache), not a frozen copy.
    train_log = json.loads((root / "reports" / "train" / "anchor_last" / "seed-0.json").read_text())
    assert train_log["reference"]["route"] == "shared"
    header = (root / "params.yaml").read_text().split("\nseed:", 1)[0]
    assert "OOD targets rmbench_safety (" in header and "pku_saferlhf" not in header
    assert "sentence-transformers" not in header and "MiniLM" not in header


@pytest.mark.slow
def test_decoder_student_reaches_the_report_offline_with_the_probe_switched_off(tmp_path, tmp_path_factory):
    """One anchor student (the decoder path, kept short) that reads no stored reference: the
    reference stage loads no weights and says why, and the student runs a frozen copy instead."""
    # The laptop presets normalise the anchor by the reference (which stores its scale): off here,
    # so that nothing at all is computed.
    extra = ["methods=[anchor_last]", "probe.enabled=false", "anchor.cache=false", "anchor.normalize=none"]
    root, output = rehearse(tmp_path, tmp_path_factory, "decoder", extra)
    summary = (root / "reports" / "summary.md").read_text(encoding="utf-8")
    assert SKIPPED_OFFLINE in summary
    assert "probe: skipped (probe.enabled is false)." in summary
    assert output.count("; skipped: best-of-n, probe") == 1
    manifest = json.loads((root / "data" / "reference" / "manifest.json").read_text())
    assert manifest["stored"] is False and manifest["tokens"] == 0 and manifest["num_layers"] == 2
    assert "reference: nothing computed: anchor.cache is false and anchor.normalize is none" in output
    train_log = json.loads((root / "reports" / "train" / "anchor_last" / "seed-0.json").read_text())
    assert train_log["reference"]["route"] == "frozen copy"


@pytest.mark.slow
def test_the_helpful_study_shape_reaches_the_report_from_published_formats(tmp_path, tmp_path_factory):
    """`prefshift preset laptop-helpful` with only paths and sizes changed: HH helpful-base .jsonl.gz
    transcripts as the source, RM-Bench's per-domain chat file and FineGrainedRLHF's qa-feedback as
    the targets, the weak model the strong one cut to one layer (backbone.weak.keep_layers)."""
    extra = ["methods=[naive,anchor_last,lp_ft,ceiling]"]
    root, output = rehearse(tmp_path, tmp_path_factory, "encoder", extra, preset="laptop-helpful")
    weak = json.loads((root / "models" / "base" / "weak" / "config.json").read_text())
    strong = json.loads((root / "models" / "base" / "strong" / "config.json").read_text())
    assert (weak["num_hidden_layers"], strong["num_hidden_layers"]) == (1, 2)
    source = json.loads((root / "models" / "base" / "weak" / "prefshift_source.json").read_text())
    assert source["layers"] == {"before": 2, "kept": 1}
    summary = (root / "reports" / "summary.md").read_text(encoding="utf-8")
    assert SKIPPED_OFFLINE in summary
    metrics = json.loads((root / "reports" / "metrics" / "anchor_last" / "seed-0.json").read_text())
    assert {"rmbench_chat", "qa_feedback"} <= set(json.dumps(metrics).replace('"', " ").split())
    header = (root / "params.yaml").read_text().split("\nseed:", 1)[0]
    assert (
        "source hh_helpful (" in header
        and "OOD targets rmbench_chat (" in header
        and "qa_feedback (" in header
    )
    assert "report: reports/summary.md, reports/metrics.json and " in output


def test_the_committed_study_params_are_the_helpful_preset_with_paths_only():
    """configs/real-helpful-3-seeds.yaml is `prefshift preset laptop-helpful` with -S overrides that
    name local paths and nothing else, so the study cannot drift from the preset the rehearsal runs."""
    import re
    import shlex

    from prefshift import presets

    study = REPO / "configs" / "real-helpful-3-seeds.yaml"
    text = study.read_text(encoding="utf-8")
    command = re.match(r"# Generated by `(prefshift preset [^`]*)`", text)
    assert command, "the study params must say which preset command wrote them"
    words = shlex.split(command.group(1))
    assert words[:3] == ["prefshift", "preset", "laptop-helpful"]
    overrides = [words[k + 1] for k, word in enumerate(words) if word == "-S"]
    assert len(overrides) * 2 == len(words) - 3
    keys = [item.split("=", 1)[0] for item in overrides]
    assert all(key.endswith(".name_or_path") or key.endswith(".path") for key in keys), keys
    assert text == presets.render("laptop-helpful", overrides)

"""Optional stages are optional: best-of-n and the probe skip with a recorded reason, every declared
output still exists, the report says what was skipped and why, and the reference stage computes
only what a listed student reads."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from prefshift.config.params import ConfigError, Params, parse_params
from prefshift.core.paths import Layout
from prefshift.pipeline.stages import (
    downstream,
    gold_judge,
    judge,
    judge_target,
    policy_samples,
    probe,
    reference,
    report,
)
from prefshift.pipeline.stages.report_probe import probe_section
from tiny_models import base_dir

OFFLINE_POLICY = "no-such-org/no-such-policy"
FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def _bert_dir(root: Path) -> Path:
    """A BERT-style encoder's config.json: what `cannot_generate` reads (no weights needed)."""
    from transformers import BertConfig

    out = root / "bert"
    BertConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(out)
    return out


def _layout(root: Path, strong: Path | None = None, version: str = "v1") -> Layout:
    layout = Layout(root, seed=0)
    layout.split_manifest.parent.mkdir(parents=True)
    layout.split_manifest.write_text(json.dumps({"version": version}))
    if strong is not None:
        shutil.copytree(strong, layout.base_model("strong"))
    return layout


def _params(**sections) -> Params:
    return parse_params(sections, "test params")


def test_best_of_n_switched_off_or_unloadable_offline_is_skipped_with_its_reason(tmp_path):
    layout = _layout(tmp_path, base_dir(tmp_path / "models"))  # a tiny Llama: it could generate
    assert policy_samples.skip_reason(_params(), layout) is None
    off = _params(downstream={"enabled": False})
    assert policy_samples.skip_reason(off, layout) == "downstream.enabled is false"
    offline = _params(downstream={"policy": OFFLINE_POLICY})
    reason = policy_samples.skip_reason(offline, layout)
    assert reason.startswith(f"policy LM {OFFLINE_POLICY} cannot load offline (HF_HUB_OFFLINE is set")
    judge = _params(downstream={"judge": "no-such-org/no-such-judge"})
    assert policy_samples.skip_reason(judge, layout).startswith("gold judge no-such-org/no-such-judge")
    # Asked for explicitly, best-of-n is never skipped: a missing policy fails loudly when it loads.
    assert (
        policy_samples.skip_reason(_params(downstream={"policy": OFFLINE_POLICY, "enabled": True}), layout)
        is None
    )


def test_an_encoder_strong_base_with_a_null_policy_skips_under_auto_and_is_refused_when_asked_for(tmp_path):
    bert = _bert_dir(tmp_path)
    layout = _layout(tmp_path / "project", bert)
    auto = _params(methods=["naive"], backbone={"strong": {"name_or_path": str(bert)}})
    reason = policy_samples.skip_reason(auto, layout)
    assert "(downstream.policy is null) is a bert encoder (no causal-LM head)" in reason
    with pytest.raises(ConfigError, match=r"downstream\.policy is null.*or set downstream\.enabled to auto"):
        _params(
            methods=["naive"], backbone={"strong": {"name_or_path": str(bert)}}, downstream={"enabled": True}
        )
    encoder_policy = _params(downstream={"policy": str(bert)})
    assert f"policy {bert} is a bert encoder" in policy_samples.skip_reason(encoder_policy, layout)


def test_skipped_best_of_n_writes_every_declared_output_and_the_report_reads_the_reason(tmp_path, capsys):
    from prefshift.pipeline.stages import report_downstream

    layout = _layout(tmp_path, base_dir(tmp_path / "models")).for_split("id_test")
    params = _params(downstream={"policy": OFFLINE_POLICY})
    counts = policy_samples.run(params, layout)
    reason = counts["skipped"]
    assert counts == {"split_version": "v1", "skipped": reason}
    assert json.loads(layout.policy_counts.read_text()) == counts
    assert pd.read_parquet(layout.policy_samples).empty and layout.policy_generations.exists()
    assert policy_samples.skipped(layout) == reason

    assert gold_judge.run(params, layout).empty  # the judge is never loaded
    assert judge.run(params, layout)["skipped"] == reason
    target = params.data.targets[0]  # its accuracy on a target says why it has none, loading nothing
    assert judge_target.run(params, layout, target) == {"target": target, "skipped": reason}
    assert json.loads(layout.judge_target_report(target).read_text())["skipped"] == reason
    assert pd.read_parquet(layout.gold_scores).columns.tolist() == gold_judge.GOLD_COLUMNS
    assert downstream.run_all(params, layout) == {}  # no teacher or student needed
    for directory in (layout.downstream_dir, layout.proxy_dir):
        assert [p.name for p in directory.iterdir()] == [downstream.SKIPPED]
        assert json.loads((directory / downstream.SKIPPED).read_text()) == {
            "skipped": reason,
            "split_version": "v1",
        }
    with pytest.raises(downstream.DownstreamError, match="best-of-n was skipped"):
        downstream.run(params, layout, "naive")
    assert report_downstream.load_skip(layout, "v1") == reason
    with pytest.raises(report.ReportError, match="skipped for split version v1, the report compares v2"):
        report_downstream.load_skip(layout, "v2")
    assert "best-of-n skipped: policy LM" in capsys.readouterr().err

    # The next real run replaces the skip: the samples file no longer carries a reason.
    layout.policy_samples.unlink()
    assert policy_samples.skipped(layout) is None


def test_probe_switched_off_loads_no_model_and_the_report_says_so(tmp_path):
    layout = _layout(tmp_path)  # no strong base on disk: loading it would fail
    result = probe.run(_params(probe={"enabled": False}), layout)
    assert result == {"skipped": "probe.enabled is false", "split_version": "v1"}
    assert json.loads(layout.probe_report.read_text()) == result
    section = probe_section(_params(data={"source": "hh_harmless", "targets": ["rail"]}), result)
    assert "probe: skipped (probe.enabled is false)." in section


@pytest.mark.parametrize("bad", [{"max_pairs": 5}, {"max_pairs": 2.0}, {"enabled": "sometimes"}])
def test_probe_params_are_checked(bad):
    with pytest.raises(ConfigError, match=r"probe\."):
        _params(probe=bad)


def test_report_with_both_optional_stages_skipped_names_them_and_why(tmp_path, capsys):
    layout = Layout(tmp_path, seed=0)
    for sub in ("metrics", "train"):
        shutil.copytree(FIXTURES / sub, tmp_path / "reports" / sub)
    spec = importlib.util.spec_from_file_location("regenerate_fixtures", FIXTURES / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_score_files(layout)  # the score files the report's paired comparisons read
    version = json.loads((FIXTURES / "metrics" / "naive" / "seed-0.json").read_text())["split_version"]
    skipped_dir = layout.for_split("id_test").downstream_dir
    skipped_dir.mkdir(parents=True)
    doc = {"skipped": "policy LM x/y cannot load offline", "split_version": version}
    (skipped_dir / downstream.SKIPPED).write_text(json.dumps(doc))
    layout.probe_report.write_text(
        json.dumps({"skipped": "probe.enabled is false", "split_version": version})
    )
    params = _params(data={"targets": ["syn_help_instruct", "syn_help_chat"]}, evaluate={"bootstrap": 50})

    summary = report.run(params, layout)
    text = layout.summary.read_text(encoding="utf-8")
    assert (
        "## Best-of-n against a gold judge\n\nbest-of-n: skipped (policy LM x/y cannot load offline)." in text
    )
    assert "probe: skipped (probe.enabled is false)." in text
    line = capsys.readouterr().err.strip().splitlines()[-1]
    not_students = ("split_version", "seeds", "teacher", "across_seeds", "ceiling")
    best = max((m for m in summary if m not in not_students), key=lambda m: summary[m]["mean_nts"])
    assert line.startswith(f"report: {layout.summary}, {layout.metrics_summary} and ")
    assert f"highest mean NTS: {best} (ID {summary[best]['id_acc']:.1f}%" in line
    assert line.endswith("; skipped: best-of-n, probe")


def test_evaluate_closing_line_names_the_file_and_headline_numbers():
    from prefshift.pipeline.stages.evaluate import closing_line

    doc = {"id": {"acc": 81.23}, "mean_acc_ood": 60.06, "wrg": 1.26, "mean_aog": -4.04}
    line = closing_line("naive", Path("reports/metrics/naive.json"), doc)
    assert (
        line
        == "evaluate naive: reports/metrics/naive.json — ID 81.2%, mean OOD 60.1%, WRG +1.3, mean AOG -4.0"
    )


def test_reference_reads_nothing_when_anchor_students_run_a_frozen_forward(tmp_path):
    """anchor.cache false with normalize none (the GPU presets): no weights load, a manifest says why,
    and the anchor methods' targets still fingerprint it."""
    from prefshift.engine.reference_manifest import read_manifest
    from prefshift.pipeline.stages.targets import anchor_fingerprint

    layout = _layout(tmp_path, _bert_dir(tmp_path / "models"))  # config only: loading weights would fail
    params = _params(methods=["naive", "anchor_mid"], anchor={"cache": False, "normalize": "none"})
    reference.run(params, layout)
    manifest = read_manifest(layout.reference_dir)
    assert manifest["stored"] is False and manifest["shards"] == [] and manifest["num_layers"] == 3
    assert manifest["reason"].startswith("anchor.cache is false and anchor.normalize is none")
    assert sorted(p.name for p in layout.reference_dir.iterdir()) == ["manifest.json"]
    assert anchor_fingerprint(manifest, "anchor_mid")["mean_square"] == {}
    # Normalised anchors do read the per-layer constants, so the stage computes them then.
    assert reference.unread_reason(params.model_copy(update={"anchor": params.anchor.model_copy(
        update={"normalize": "reference"})})) is None  # fmt: skip


@pytest.mark.parametrize("bad", ["sometimes", 1, 0, "false", "yes", None])
def test_best_of_n_switch_takes_true_false_or_auto_only(bad):
    with pytest.raises(ConfigError, match=r"downstream\.enabled: must be true, false or auto \(got "):
        _params(downstream={"enabled": bad})


@pytest.mark.parametrize("cache", [True, False])
def test_reference_stores_states_only_for_students_that_read_them(tmp_path, cache):
    """Normalised anchors need the per-layer constants either way; the states themselves are
    written only when the students read them (anchor.cache), never just to be ignored."""
    from prefshift.data.schema import write_pairs
    from tiny_models import pairs

    layout = _layout(tmp_path, base_dir(tmp_path / "models"))
    write_pairs(layout.split("student_train"), pairs(6))
    params = _params(methods=["anchor_last"], anchor={"cache": cache, "normalize": "reference"})
    manifest = reference.run(params, layout)
    assert manifest["stored"] is cache and manifest["tokens"] > 0 and manifest["mean_square"]["2"] > 0
    stored = sorted(p.name for p in layout.reference_dir.iterdir() if p.name != "manifest.json")
    if cache:
        assert manifest["reason"] is None and stored
    else:
        assert manifest["reason"].startswith("anchor.cache is false: only the per-layer constants")
        assert stored == [] and manifest["shards"] == []

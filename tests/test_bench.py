"""The benchmark machinery (not its timings): batching ablations, and a quick run's reports."""

from __future__ import annotations

import json

import pytest
import torch

from prefshift.bench.batching import fixed_collate, random_batches
from prefshift.bench.common import padding_efficiency, ratio, summary
from prefshift.data.encode import collate
from tiny_models import items, tokenizer


def test_padding_efficiency_counts_real_over_computed_tokens():
    lengths = [10, 6, 4, 4]
    assert padding_efficiency([[0, 1], [2, 3]], lengths, None) == pytest.approx(24 / (2 * 10 + 2 * 4))
    assert padding_efficiency([[0, 1], [2, 3]], lengths, 16) == pytest.approx(24 / 64)


def test_random_batches_cover_every_index_once():
    batches = random_batches([5] * 10, 4, seed=3)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert batches == random_batches([5] * 10, 4, seed=3)


def test_fixed_collate_pads_to_the_width_and_keeps_the_content():
    data = items(3)
    pad = tokenizer().pad_token_id
    dynamic, fixed = collate(data, pad), fixed_collate(data, pad, width=64)
    width = dynamic["input_ids"].shape[1]
    assert fixed["input_ids"].shape == (6, 64)
    assert torch.equal(fixed["input_ids"][:, :width], dynamic["input_ids"])
    assert (fixed["input_ids"][:, width:] == pad).all()
    assert fixed["attention_mask"][:, width:].sum() == 0
    assert torch.equal(fixed["response_mask"].sum(1), dynamic["response_mask"].sum(1))


def test_summary_and_ratio_of_interleaved_rounds():
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    r = ratio([4.0, 6.0, 5.0], [2.0, 2.0, 5.0])
    assert r == {"ratio": 5.0 / 2.0, "best_runs": 6.0 / 5.0, "round_min": 1.0, "round_max": 3.0}
    assert ratio([4.0, 6.0], [2.0, 3.0], higher_is_better=False)["best_runs"] == 2.0


@pytest.mark.slow
def test_quick_bench_writes_well_formed_reports(tmp_path):
    from prefshift.bench.run import run_bench

    earlier = {
        "date": "2026-01-01 00:00 UTC",
        "pipeline": {
            "noop_repro_s": 2.0,
            "full_repro_s": 300.0,
            "max_stage_peak_rss_mb": 900.0,
            "stages_s": {"prepare": 3.0},
            "noop_ran_stages": [],
            "targets": {"noop_repro_s": {"max": 5.0, "met": True}},
        },
    }
    (tmp_path / "bench.json").write_text(json.dumps(earlier))
    lines: list[str] = []
    run_bench(tmp_path, quick=True, log=lines.append)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert {"date", "machine", "versions", "settings"} <= set(result)
    assert result["machine"]["cores"] >= 1 and result["versions"]["torch"]
    tiny = result["training"]["models"]["tiny_2x64"]
    assert tiny["workload"]["optimizer_steps"] == 2  # 16 pairs, batch 8, one epoch
    for name, rate in tiny["pairs_per_s"].items():
        assert 0 < rate["min"] <= rate["median"] <= rate["max"], name
    if result["training"]["trl_skipped"] is None:
        assert tiny["vs_ours"]["trl"]["ratio"] > 0 and "met" in tiny["target"]
    anchor = result["anchor"]["tiny_2x64"]
    assert set(anchor["ratios"]) == {
        "anchor_shared",
        "anchor_cached",
        "anchor_uncached",
        "lora_anchor_shared_base",
    }
    assert all(anchor["peak_rss_mb"][v]["median"] > 0 for v in anchor["peak_rss_mb"])
    assert (
        anchor["shared_reference"]["fill_s"] > 0 and anchor["reference_fill_s"]["anchor_shared"]["max"] == 0
    )
    assert anchor["ratios"]["anchor_shared"]["wall_with_fill_amortised"]["ratio"] > 0
    evaluation = result["evaluation"]["models"]["tiny_2x64"]
    assert set(evaluation["pairs_per_s"]) == {"batched_sorted", "per_pair", "fixed_padding"}
    assert max(evaluation["max_abs_margin_difference"].values()) < 1e-3  # same margins every way
    assert result["pipeline"]["date"] == "2026-01-01 00:00 UTC"  # kept until re-measured
    markdown = (tmp_path / "bench.md").read_text()
    for heading in ("### tiny_2x64", "| bare_torch_loop |"):
        assert heading in markdown
    for heading in ("## Training throughput vs TRL", "## ANCHOR overhead", "## Evaluation throughput"):
        assert heading in markdown
    assert (
        "| anchor_cached ÷ naive |" in markdown
        and "| anchor_shared ÷ naive |" in markdown
        and "Measured 2026-01-01 00:00 UTC" in markdown
    )
    assert any("rep 1/1" in line for line in lines)


@pytest.mark.slow
def test_repro_timing_names_stages_and_the_largest_stage_rss(tmp_path):
    import subprocess

    from prefshift.bench.pipeline import _environment, _repro

    root = tmp_path / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text(
        "stages:\n"
        "  small:\n"
        "    cmd: python -c \"open('a.txt', 'w').write('a')\"\n"
        "    outs: [a.txt]\n"
        "  big:\n"
        "    cmd: python -c \"b = bytearray(200 * 2**20); open('b.txt', 'w').write('b')\"\n"
        "    deps: [a.txt]\n"
        "    outs: [b.txt]\n"
    )
    env = _environment(root)
    for args in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "t"],
    ):
        subprocess.run(args, cwd=root, env=env, check=True, capture_output=True)
    first = _repro(root, env, log=lambda line: None)
    assert set(first["stages_s"]) == {"small", "big"}
    assert first["peak_rss_mb"] >= 200  # the bytearray stage, not dvc itself
    assert _repro(root, env, log=lambda line: None)["stages_s"] == {}


def test_realistic_lengths_follow_the_measured_hh_quantiles():
    import numpy as np

    from prefshift.bench.realistic import draw_lengths

    drawn = np.array(draw_lengths(20000, seed=0))
    measured = {0.05: 32, 0.25: 74, 0.5: 136, 0.75: 225, 0.9: 344, 0.95: 427, 0.99: 645}
    for q, tokens in measured.items():
        assert abs(np.quantile(drawn, q) - tokens) <= 0.05 * tokens + 2, q
    assert 160 <= drawn.mean() <= 180  # HH harmless: mean 170
    assert draw_lengths(50, seed=3) == draw_lengths(50, seed=3)

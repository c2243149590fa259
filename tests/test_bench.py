"""The benchmark machinery (not its timings): batching ablations, and a quick run's reports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from e2e_project import REPO
from prefshift.bench.batching import fixed_collate, random_batches
from prefshift.bench.common import (
    BenchError,
    interleave,
    number_rounds_from,
    padding_efficiency,
    ratio,
    summary,
)
from prefshift.bench.invocations import aggregate, run_invocations
from prefshift.bench.readme import END, START, ReadmeError, readme_block, update_readme
from prefshift.bench.training import check_equal_work, limit_tokens
from prefshift.bench.work import WorkCounter, fingerprint
from prefshift.data.encode import collate
from tiny_models import items, reward_model, tokenizer


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


def test_rounds_alternate_the_order_and_continue_across_invocations():
    ran: list[str] = []

    def variant(name: str):
        return lambda: ran.append(name) or {"name": name}

    variants = {name: variant(name) for name in "ABC"}
    try:
        results = interleave(variants, reps=3, warmup=1, log=lambda _line: None)
        assert "".join(ran) == "CBA" + "ABC" + "CBA" + "ABC"  # the warm-up round is numbered -1
        assert {name: len(runs) for name, runs in results.items()} == {"A": 3, "B": 3, "C": 3}
        ran.clear()
        number_rounds_from(3)  # the second invocation of a --reps 3 bench
        interleave(variants, reps=2, warmup=0, log=lambda _line: None)
        assert "".join(ran) == "CBA" + "ABC"
    finally:
        number_rounds_from(0)


def test_each_invocation_is_told_where_its_rounds_start(monkeypatch):
    starts: list[int] = []

    def fake_bench(command, check):
        starts.append(int(command[command.index("--first-round") + 1]))
        out = Path(command[command.index("--out") + 1])
        (out / "bench.json").write_text(json.dumps({"started_at": starts[-1]}))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_bench)
    results = run_invocations(3, ["--reps", "3"], reps=3, log=lambda _line: None)
    assert starts == [0, 3, 6] and [r["started_at"] for r in results] == [0, 3, 6]


def test_work_counter_counts_training_forwards_and_sees_the_arithmetic():
    data = items(4)
    batch = collate(data, tokenizer().pad_token_id)
    model = reward_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    counter = WorkCounter(model, pad_to_multiple_of=None)
    with torch.no_grad():  # a drift probe: side work, not training
        model(batch["input_ids"], batch["attention_mask"])
    for _ in range(2):
        model(batch["input_ids"], batch["attention_mask"]).rewards.sum().backward()
        optimizer.step()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(batch["input_ids"], batch["attention_mask"])
    out = counter.summary()
    seqs = [s.input_ids for it in data for s in (it.chosen, it.rejected)]
    real = sum(len(ids) for ids in seqs)
    assert out["work"] == {
        "forwards": 3,
        "pairs": 3 * 4,
        "real_tokens": 3 * real,
        "computed_tokens": 3 * 8 * max(len(ids) for ids in seqs),
        "fingerprint": fingerprint(seqs, times=3),
    }
    side = out["side_work"]
    assert (side["no_grad_forwards"], side["real_tokens"]) == (1, real) and side["wall_s"] > 0
    settings = out["settings"]
    assert settings["autocast"] == ["bfloat16", "off"]
    assert settings["precision"] == "bfloat16 autocast, float32 weights"
    assert settings["optimizer"] == {"name": "AdamW", "kernel": "fused"}
    assert settings["attn_implementation"] == model.config._attn_implementation
    assert settings["threads"] == torch.get_num_threads() and settings["pad_to_multiple_of"] == 1
    assert not settings["gradient_checkpointing"]
    model(batch["input_ids"], batch["attention_mask"])  # hooks removed: nothing more is counted
    assert counter.forwards == 3


def test_work_counter_counts_the_pairs_a_shared_prefix_forward_packs():
    data = items(4)
    batch = collate(data, tokenizer().pad_token_id)
    seqs = [s.input_ids for it in data for s in (it.chosen, it.rejected)]
    model = reward_model()
    counter = WorkCounter(model, pad_to_multiple_of=None)
    model(batch["input_ids"], batch["attention_mask"], groups=batch["groups"]).rewards.sum().backward()
    work = counter.summary()["work"]
    assert (work["pairs"], work["real_tokens"]) == (4, sum(len(ids) for ids in seqs))
    assert work["fingerprint"] == fingerprint(seqs)  # the same sequences as the two-sequence path
    assert work["computed_tokens"] == model.pair_counts["shared_prefix_tokens"]
    assert limit_tokens(data) <= work["computed_tokens"] < batch["input_ids"].numel()


def test_profile_table_ranks_operators_and_times_the_labelled_forwards():
    from prefshift.bench.operators import operator_table, profiled

    data = items(2)
    batch = collate(data, tokenizer().pad_token_id)
    model = reward_model()
    counter = WorkCounter(model, pad_to_multiple_of=None)
    with profiled(True) as prof:
        with torch.no_grad():
            model(batch["input_ids"], batch["attention_mask"])
        a = torch.randn(256, 256)
        for _ in range(20):
            a = a @ a / 16
    counter.close()
    table = operator_table(prof, top=3)
    ops = table["operators"]
    assert len(ops) == 3 and ops[0]["self_cpu_s"] >= ops[1]["self_cpu_s"] >= ops[2]["self_cpu_s"]
    assert any(op["name"] in ("aten::mm", "aten::div") for op in ops)
    assert 0 < sum(op["share"] for op in ops) <= 1
    assert table["spans_s"]["no_grad_forward"] > 0 and table["spans_s"]["optimizer_step"] == 0
    with profiled(False) as nothing:
        assert nothing is None


def test_fingerprint_ignores_order_and_sees_a_changed_token():
    seqs = [[1, 2, 3], [4, 5], [6]]
    assert fingerprint(seqs) == fingerprint(seqs[::-1])
    assert fingerprint(seqs) != fingerprint([[1, 2, 3], [4, 5], [7]])
    assert fingerprint(seqs, times=2) == fingerprint(seqs + seqs)


def test_unequal_work_is_refused():
    data = items(4)
    seqs = [s.input_ids for it in data for s in (it.chosen, it.rejected)]
    real = sum(len(ids) for ids in seqs)
    same = {"pairs": 8, "real_tokens": 2 * real, "fingerprint": fingerprint(seqs, times=2)}
    runs = {"ours": [{"work": same}], "trl": [{"work": same, "dropped_rows": 0}]}
    assert check_equal_work(runs, data, epochs=2) == same
    with pytest.raises(BenchError, match=r"trl \(round 1\) did different work.*dropped 1 rows"):
        check_equal_work({"trl": [{"work": same, "dropped_rows": 1}]}, data, epochs=2)
    fewer = {**same, "real_tokens": real}
    with pytest.raises(BenchError, match=r"ours \(round 2\)"):
        check_equal_work({"ours": [{"work": same}, {"work": fewer}]}, data, epochs=2)


def _invocation(ours: list[float], trl: list[float], load: float) -> dict:
    return {
        "date": f"2026-12-01 0{int(load)}:00 UTC",
        "machine": {"cpu": "test cpu", "cores": 2, "load_avg_1_5_15": [load, load, load]},
        "versions": {"torch": "x"},
        "settings": {"quick": False, "reps": len(ours), "threads": 1, "invocations": 1},
        "note": None,
        "gpu": "none",
        "training": {
            "trl_skipped": None,
            "models": {
                "small_4x256": {
                    "pairs_per_s": {"ours": summary(ours), "trl": summary(trl)},
                    "settings": {"trl": {"precision": "float32"}},
                    "vs_ours": {"trl": ratio(ours, trl)},
                    "target": None,
                }
            },
        },
    }


def test_invocations_merge_into_medians_with_their_spread():
    runs = [
        _invocation([10, 12], [8, 8], 1),
        _invocation([13, 13], [10, 10], 2),
        _invocation([9, 9], [9, 9], 3),
    ]
    merged = aggregate(runs)
    entry = merged["training"]["models"]["small_4x256"]
    ours = entry["pairs_per_s"]["ours"]
    assert ours == {"median": 11.0, "min": 9, "max": 13, "n": 6, "invocation_medians": [11.0, 13.0, 9.0]}
    r = entry["vs_ours"]["trl"]
    assert r["invocation_ratios"] == [11 / 8, 13 / 10, 1.0]
    assert r["ratio"] == 1.3 and (r["invocation_min"], r["invocation_max"]) == (1.0, 11 / 8)
    assert (r["round_min"], r["round_max"]) == (1.0, 1.5)
    assert entry["target"] == {"ours_over_trl_min": 1.3, "met": True}  # judged again on the median
    assert entry["settings"] == {"trl": {"precision": "float32"}}  # agreeing values are kept
    assert merged["settings"]["invocations"] == 3 and len(merged["invocation_dates"]) == 3
    assert merged["machine"]["load_avg_1_5_15"] == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
    broken = _invocation([1], [1], 4)
    del broken["training"]["models"]["small_4x256"]["target"]
    with pytest.raises(BenchError, match=r"disagree on the keys of training\.models\.small_4x256"):
        aggregate([runs[0], broken])


def test_readme_numbers_block_is_rewritten_from_the_result(tmp_path):
    merged = aggregate([_invocation([12], [10], 1), _invocation([11], [10], 2), _invocation([14], [10], 3)])
    merged["training"]["models"]["small_4x256"]["vs_ours"]["bare_torch_loop"] = ratio([12], [12])
    merged["settings"]["command"] = "prefshift bench --invocations 3"
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n{START}\nold numbers 9.99×\n{END}\nafter\n")
    update_readme(readme, merged)
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    assert "9.99" not in text and text.count(START) == 1
    assert "2026-12-01 01:00 UTC on test cpu (2 cores)" in text and "3 invocation(s)" in text
    assert (
        "| training pairs/s, ours ÷ `trl.RewardTrainer`, Llama 4×256 | 1.20× (1.10–1.40) | ≥ 1.3 ✗ |" in text
    )
    assert readme_block(merged) in text
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers here\n")
    with pytest.raises(ReadmeError, match=r"PLAIN\.md has no benchmark numbers block"):
        update_readme(plain, merged)


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
        assert tiny["real_tokens_per_s"][name]["median"] > 0, name
    assert tiny["workload"]["work"]["pairs"] == 16 and tiny["workload"]["work"]["real_tokens"] > 0
    assert tiny["settings"]["ours"]["optimizer"]["kernel"] == "fused"
    assert tiny["side_work"]["ours"]["no_grad_forwards"] == 2  # drift probes before and after
    assert 0 < tiny["side_work"]["ours"]["share_of_wall"]["median"] < 1
    if result["training"]["trl_skipped"] is None:
        assert tiny["vs_ours"]["trl"]["ratio"] > 0 and "met" in tiny["target"]
        for name in ("trl", "trl_group_by_length"):  # aligned with ours: fp32, no checkpointing
            assert tiny["settings"][name]["precision"] == "float32", name
            assert tiny["settings"][name]["gradient_checkpointing"] is False, name
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
    reads = anchor["reference_read_s"]
    assert reads["naive"]["max"] == 0 and reads["anchor_shared"]["min"] > 0  # only anchors read one
    assert all(reads[v]["median"] < anchor["wall_s"][v]["median"] for v in reads)
    evaluation = result["evaluation"]["models"]["tiny_2x64"]
    assert set(evaluation["pairs_per_s"]) == {
        "batched_sorted",
        "per_pair",
        "batched_two_sequence",
        "fixed_padding",
    }
    assert max(evaluation["max_abs_margin_difference"].values()) < 1e-3  # same margins every way
    assert result["pipeline"]["date"] == "2026-01-01 00:00 UTC"  # kept until re-measured
    markdown = (tmp_path / "bench.md").read_text()
    for heading in ("### tiny_2x64", "| bare_torch_loop |", "| real tokens/s median |", "| AdamW kernel |"):
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
        "    cmd: python -c \"import os; open('a.txt', 'w').write(os.environ['OMP_NUM_THREADS'])\"\n"
        "    outs: [a.txt]\n"
        "  big:\n"
        "    cmd: python -c \"b = bytearray(200 * 2**20); open('b.txt', 'w').write('b')\"\n"
        "    deps: [a.txt]\n"
        "    outs: [b.txt]\n"
    )
    env = _environment(root, threads=3)  # each stage's torch threads, as the bench's --threads says
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
    assert (root / "a.txt").read_text() == "3"
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


def test_method_costs_are_train_stages_against_naive():
    from prefshift.bench.pipeline import method_costs
    from prefshift.bench.report import _method_costs

    stages = {"train@naive": 40.0, "train@lp_ft": 60.0, "evaluate@naive": 5.0, "teacher@0": 7.0}
    costs = method_costs(stages)
    assert costs == {"naive": {"stage_s": 40.0, "vs_naive": 1.0}, "lp_ft": {"stage_s": 60.0, "vs_naive": 1.5}}
    assert "| lp_ft | 60.0 s | 1.50× |" in _method_costs(costs)
    assert method_costs({"train@lp_ft": 3.0})["lp_ft"]["vs_naive"] is None  # no naive to compare with


def _timed_pipeline(monkeypatch) -> dict:
    """The pipeline section `bench_pipeline` returns, without the minutes of `dvc repro`; and no
    in-process benchmark may run."""
    from prefshift.bench import pipeline, run

    measured = {"full_repro_s": 1.0, "noop_repro_s": 0.1, "max_stage_peak_rss_mb": 1.0}
    section = {**measured, "stages_s": {"train@naive": 1.0}, "method_costs": {}, "noop_ran_stages": []}
    section["targets"] = {key: {"max": 9e9, "met": True} for key in measured}

    def timed(repo, log, keep, params, threads):
        section["stage_threads_asked"] = threads
        return section

    monkeypatch.setattr(pipeline, "bench_pipeline", timed)
    monkeypatch.setattr(run, "_one_invocation", lambda *a: pytest.fail("a benchmark ran"))
    return section


def test_pipeline_stages_take_torch_s_default_threads_unless_told(tmp_path, monkeypatch):
    """A user's `dvc repro` leaves torch its default (a thread per core), so the pipeline's stages
    do too, whatever the caller exports; `--stage-threads N` pins them, apart from `--threads`
    (the in-process benchmarks'), and the regenerate line and the section say which."""
    from prefshift.bench import run
    from prefshift.bench.pipeline import _environment
    from prefshift.bench.report import measured_on, render_markdown

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert "OMP_NUM_THREADS" not in _environment(tmp_path)
    assert _environment(tmp_path, 2)["OMP_NUM_THREADS"] == "2"
    section = _timed_pipeline(monkeypatch)
    result = run.run_bench(tmp_path, pipeline_only=True, threads=3, log=lambda line: None)
    assert section["stage_threads_asked"] is None and result["settings"]["threads"] == 3
    assert result["settings"]["command"] == f"prefshift bench --out {tmp_path} --pipeline-only"
    result = run.run_bench(tmp_path, pipeline_only=True, stage_threads=1, log=lambda line: None)
    assert section["stage_threads_asked"] == 1
    command = f"prefshift bench --out {tmp_path} --pipeline-only --stage-threads 1"
    assert result["settings"]["command"] == command
    for refused, pipeline_only in ((0, True), (2, False)):  # no thread at all; no pipeline to time
        with pytest.raises(BenchError, match="--stage-threads"):
            run.run_bench(tmp_path, pipeline_only=pipeline_only, stage_threads=refused, log=lambda line: None)
    stamp = {"date": "2026-12-06 09:00 UTC", "cpu": "Xeon"}
    assert measured_on({**stamp, "threads": None, "cores": 2}) == (
        " on Xeon, torch's default threads per stage (one per core: 2)"
    )
    assert measured_on({**stamp, "threads": 1, "cores": 2}) == " on Xeon, 1 torch thread(s) per stage"
    assert measured_on(stamp) == " on Xeon"  # recorded before stages' threads were
    section.update(threads=None, cores=2)
    assert "Threads: torch's default threads per stage (one per core: 2)." in render_markdown(result)


def test_pipeline_only_times_the_pipeline_alone(tmp_path, monkeypatch):
    """`--pipeline-only` runs none of the in-process benchmarks and names itself in the regenerate
    line; with no full result to complete, a README block (which needs the other sections) is
    refused before anything runs."""
    from prefshift.bench import run
    from prefshift.bench.common import BenchError

    section = _timed_pipeline(monkeypatch)
    with pytest.raises(BenchError, match=r"--pipeline-only --readme .* there is none"):
        run.run_bench(tmp_path, pipeline_only=True, readme=tmp_path / "README.md", log=lambda line: None)
    assert not (tmp_path / "bench.json").exists()
    result = run.run_bench(tmp_path, pipeline_only=True, log=lambda line: None)
    assert result["pipeline"] == section and "training" not in result
    markdown = (tmp_path / "bench.md").read_text()
    assert f"Regenerate: `prefshift bench --out {tmp_path} --pipeline-only`" in markdown
    assert "## Training" not in markdown
    with pytest.raises(BenchError, match="--pipeline-only --readme"):  # a pipeline-only result is not one
        run.run_bench(tmp_path, pipeline_only=True, readme=tmp_path / "README.md", log=lambda line: None)


def test_pipeline_only_into_a_full_result_replaces_its_pipeline_rows_alone(tmp_path, monkeypatch):
    """Into the directory of a full result (the committed reports/bench.json), `--pipeline-only
    --readme` keeps every other section as measured and rewrites the README block: the new
    pipeline rows say when, on what and by which command they were measured."""
    from prefshift.bench import run
    from prefshift.bench.common import BenchError, machine

    _timed_pipeline(monkeypatch)
    full = json.loads((REPO / "reports" / "bench.json").read_text())
    (tmp_path / "bench.json").write_text(json.dumps(full))
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    for also in (readme, None):  # other params' pipeline is no row of the default's
        with pytest.raises(BenchError, match="--pipeline-params"):
            run.run_bench(
                tmp_path, pipeline_only=True, readme=also, pipeline_params=readme, log=lambda line: None
            )
    result = run.run_bench(tmp_path, pipeline_only=True, readme=readme, log=lambda line: None)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written == result
    assert {**written, "pipeline": None} == {**full, "pipeline": None}
    pipeline = written["pipeline"]
    assert pipeline["full_repro_s"] == 1.0 and pipeline["cpu"] == machine()["cpu"]
    assert pipeline["command"] == f"prefshift bench --out {tmp_path} --pipeline-only --readme {readme}"
    text = readme.read_text()
    when = f"(measured {pipeline['date']} on {pipeline['cpu']}, by `{pipeline['command']}`)"
    assert f"| no-op `dvc repro` {when} | 0.1 s | ≤ 9000000000 s ✓ |" in text
    training = [line for line in text.splitlines() if line.startswith("| training pairs/s")]
    assert training and all(line in (REPO / "README.md").read_text() for line in training)
    assert "| full `dvc repro` of the embedded default (measured" in text
    # A full bench run with --pipeline-params (no --readme) leaves a block naming what it timed.
    other = {**written, "pipeline": {**pipeline, "params": "configs/robust-ft-5-seeds.yaml"}}
    assert "| full `dvc repro` of `configs/robust-ft-5-seeds.yaml` (measured" in readme_block(other)


def _hh_file(path: Path, n: int) -> list[str]:
    """`n` helpful-style rows in Anthropic HH's `.jsonl.gz` form (whole transcripts); their texts."""
    import gzip

    rows = []
    for i in range(n):
        prompt = f"\n\nHuman: how do I bake bread number {i} at home?\n\nAssistant:"
        reply = " first mix flour , water and salt , then let it rise and bake it" + " slowly" * (i % 5)
        rows.append({"chosen": prompt + reply, "rejected": prompt + " i do not know"})
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return [text for row in rows for text in row.values()]


def test_the_bench_runs_on_a_local_model_directory_and_a_pairs_file(tmp_path):
    """`--model-dir`/`--pairs`/`--max-length`: a pretrained encoder's own tokenizer, real-format
    pairs, ours ÷ TRL and anchor_shared ÷ naive rows, the regenerating command with the options."""
    from transformers import BertConfig, BertModel

    from prefshift.bench.run import run_bench
    from rlhf_families import bert_tokenizer

    pairs = tmp_path / "test.jsonl.gz"
    tokenizer = bert_tokenizer(_hh_file(pairs, 20))
    model_dir = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    BertModel(config).save_pretrained(model_dir)  # a backbone without a reward head, as MiniLM ships
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    result = run_bench(out, quick=True, model_dir=model_dir, pairs=pairs, max_length=48, log=lambda _: None)
    assert set(result) >= {"training", "anchor"} and "evaluation" not in result
    assert result["settings"]["max_length"] == 48 and result["settings"]["model_dir"] == str(model_dir)
    entry = result["training"]["models"]["tiny-bert"]
    work = entry["workload"]
    assert work["source"] == str(pairs) and work["max_length"] == 48 and work["pairs"] == 16
    assert work["work"]["pairs"] == 16 and entry["settings"]["ours"]["precision"] == "float32"
    expected = {"ours"} | ({"trl"} if result["training"]["trl_skipped"] is None else set())
    assert set(entry["pairs_per_s"]) - {"trl_group_by_length", "bare_torch_loop"} == expected
    if "trl" in expected:
        assert entry["vs_ours"]["trl"]["ratio"] > 0 and "met" in entry["target"]
        steps_only = entry["vs_ours_without_side_work"]["trl"]  # our drift probes' time taken out
        assert steps_only["ratio"] > entry["vs_ours"]["trl"]["ratio"]
    anchor = result["anchor"]["tiny-bert"]
    assert set(anchor["wall_s"]) == {"naive", "anchor_shared"} and set(anchor["ratios"]) == {"anchor_shared"}
    assert "met" in anchor["ratios"]["anchor_shared"]["target"]
    assert anchor["reference_read_s"]["anchor_shared"]["min"] > 0
    markdown = (out / "bench.md").read_text()
    command = f"prefshift bench --out {out} --model-dir {model_dir} --pairs {pairs} --max-length 48 --quick"
    assert f"Regenerate: `{command}`" in markdown
    assert "### tiny-bert" in markdown and "| anchor_shared ÷ naive |" in markdown


def test_the_real_model_options_name_a_model(tmp_path):
    from prefshift.bench.run import run_bench

    with pytest.raises(BenchError, match="name the model"):
        run_bench(tmp_path, max_length=64, log=lambda _: None)
    with pytest.raises(BenchError, match="belong to the default bench"):
        run_bench(tmp_path, model_dir=tmp_path, pipeline=True, log=lambda _: None)

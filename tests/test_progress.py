"""Progress in logs: plain periodic lines from every long loop, flushed as they happen, and the
training metrics in MLflow while the run goes on (issue 36 §5, issue 34 §8)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from prefshift.cli import app
from prefshift.config.params import EncodeConfig, LMSpec, Params, SeamConfig, TrainConfig
from prefshift.core.errors import PrefshiftError
from prefshift.core.paths import Layout
from prefshift.core.progress import EVERY_ENV, ProgressReporter, duration, lines_to, track
from prefshift.data.encode import Encoder
from prefshift.data.schema import write_pairs
from prefshift.engine.train import train_reward_model
from prefshift.methods import build_objective
from prefshift.methods.base import Objective
from prefshift.models.reward import save_reward_model
from split_manifests import write_split_manifests
from tiny_models import TEXTS, base_dir, install_backbones, items, pairs, reward_model, tokenizer

CFG = TrainConfig(batch_size=4, epochs=2, lr=5e-3, warmup_frac=0.25, log_every=1, drift_every=2, probe_size=4)
NUMBER = r"[-+0-9.e]+|nan"
TRAIN_LINE = re.compile(
    rf"^train (?P<name>\S+): (?P<step>\d+)/(?P<total>\d+) steps \([0-9.]+%\) \| "
    rf"loss (?P<loss>{NUMBER}) acc (?:{NUMBER}) \| (?P<rate>[0-9.]+) pairs/s \| "
    rf"\S+ elapsed \| ETA (?P<eta>\S+)$"
)


@pytest.fixture
def every_update(monkeypatch):
    """A line at every update, so tiny loops show their periodic lines."""
    monkeypatch.setenv(EVERY_ENV, "0")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(text: str, label: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{label}: ")]


# --- the reporter -----------------------------------------------------------------------------


def test_lines_come_at_start_every_period_and_end_with_rate_and_time_left():
    clock, out = FakeClock(), io.StringIO()
    with lines_to(out):
        report = ProgressReporter("job", 100, "steps", rate_unit="pairs", period_s=10, clock=clock)
        for step in range(1, 101):
            clock.now += 1.0  # one step a second, 8 pairs a step
            report.update(step, items=8 * step, loss=0.5)
        report.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "job: 0/100 steps (0.0%) | started"
    assert lines[1] == "job: 10/100 steps (10.0%) | loss 0.5 | 8.0 pairs/s | 10s elapsed | ETA 1m30s"
    assert lines[-1] == "job: 100/100 steps (100.0%) | loss 0.5 | 8.0 pairs/s | 1m40s elapsed | ETA 0s"
    assert len(lines) == 11  # start, every 10 s while running (10..90), end


def test_a_fast_loop_prints_its_first_and_last_line_only():
    clock, out = FakeClock(), io.StringIO()
    with lines_to(out):
        for _ in track(range(5), "fast", 5, size=lambda _: 1, period_s=30, clock=clock):
            clock.now += 0.1
    assert [line.split(" |")[0] for line in out.getvalue().splitlines()] == [
        "fast: 0/5 pairs (0.0%)",
        "fast: 5/5 pairs (100.0%)",
    ]


def test_a_resumed_loop_counts_its_rate_and_time_left_from_where_it_started():
    clock, out = FakeClock(), io.StringIO()
    with lines_to(out), ProgressReporter("resumed", 100, "steps", start=60, period_s=0, clock=clock) as r:
        clock.now += 20.0
        r.update(70)  # 10 steps in 20 s: 30 left take 60 s
    first, middle, last = out.getvalue().splitlines()
    assert first.startswith("resumed: 60/100 steps (60.0%) | started")
    assert middle == "resumed: 70/100 steps (70.0%) | 0.5 steps/s | 20s elapsed | ETA 1m00s"
    assert last.startswith("resumed: 70/100 steps")  # ended early: the last line says where


def test_nothing_is_printed_for_an_empty_loop_or_by_a_non_first_process(monkeypatch):
    out = io.StringIO()
    with lines_to(out):
        list(track([], "empty", 0))
        monkeypatch.setenv("RANK", "1")
        list(track([[1, 2]], "rank one", 2))
    assert out.getvalue() == ""


def test_lines_go_to_stdout_by_default(capfd, every_update):
    list(track([[1], [2, 3]], "to stdout", 3))
    captured = capfd.readouterr()
    assert len(_lines(captured.out, "to stdout")) == 3 and captured.err == ""


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_period_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(EVERY_ENV, value)
    with pytest.raises(PrefshiftError, match=rf"{EVERY_ENV}=.*number >= 0"):
        ProgressReporter("x", 3)


def test_durations_read_at_a_glance():
    assert [duration(s) for s in (0, 12.4, 65, 3600 * 2 + 61)] == ["0s", "12s", "1m05s", "2h01m"]


# --- training ---------------------------------------------------------------------------------


@dataclass
class _Watched(Objective):
    """The naive objective, running `at_step(step)` before the loss of each step."""

    at_step: object = None

    def loss(self, out, step, total_steps):
        self.at_step(step)
        return super().loss(out, step, total_steps)


def test_training_writes_its_lines_into_a_log_file_while_it_runs(tmp_path, monkeypatch, every_update):
    """stdout redirected to a file (no terminal, block-buffered): the lines are there mid-run."""
    log_path = tmp_path / "stage.log"
    seen_mid_run: dict[int, str] = {}

    def read_log(step: int) -> None:
        seen_mid_run[step] = log_path.read_text()

    with open(log_path, "w") as handle:  # a real block-buffered file, as a shell redirect gives
        monkeypatch.setattr(sys, "stdout", handle)
        _, log = train_reward_model(
            reward_model(seed=1), tokenizer(), items(8), _Watched("naive", at_step=read_log), CFG,
            seed=0, name="naive", progress=True,
        )  # fmt: skip
    lines = [TRAIN_LINE.match(line) for line in _lines(seen_mid_run[3], "train naive")[1:]]
    assert all(lines), seen_mid_run[3]
    assert [int(m["step"]) for m in lines] == [1, 2, 3] and {m["total"] for m in lines} == {"4"}
    assert all(float(m["rate"]) > 0 and m["eta"] != "?" for m in lines)
    losses = [s["loss"] for s in log["steps"]]
    assert [float(m["loss"]) for m in lines] == pytest.approx(losses[:3], rel=1e-3)  # log_every=1
    final = TRAIN_LINE.match(_lines(log_path.read_text(), "train naive")[-1])
    assert final["step"] == "4" and final["eta"] == "0s"


def test_progress_output_changes_no_number(every_update):
    def run(progress: bool):
        objective = build_objective("anchor_last", Params(), 2)
        model, log = train_reward_model(
            reward_model(seed=1), tokenizer(), items(8), objective, CFG, seed=0, name="a", progress=progress
        )
        return model, {k: log[k] for k in ("steps", "drift", "drift_mse")}

    (quiet, quiet_log), (loud, loud_log) = run(False), run(True)
    assert quiet_log == loud_log
    assert all(
        torch.equal(a, b)
        for a, b in zip(quiet.state_dict().values(), loud.state_dict().values(), strict=True)
    )


def test_the_observer_sees_each_log_row_as_it_is_written(every_update):
    records: list[tuple[str, int]] = []
    seen_at: dict[int, list] = {}
    objective = _Watched("naive", at_step=lambda step: seen_at.setdefault(step, list(records)))
    _, log = train_reward_model(
        reward_model(seed=1), tokenizer(), items(8), objective, CFG, seed=0, name="naive",
        progress=False, on_record=lambda series, row: records.append((series, row["step"])),
    )  # fmt: skip
    assert seen_at[3] == [("train", 1), ("train", 2), ("drift", 2), ("drift_mse", 2), ("train", 3)]
    assert [step for series, step in records if series == "train"] == [s["step"] for s in log["steps"]]


def test_a_resumed_run_replays_the_restored_rows_to_the_observer_once(tmp_path):
    cfg = CFG.model_copy(update={"checkpoint_every": 1})

    def interrupt(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    common = {"seed": 0, "name": "naive", "progress": False, "checkpoint_dir": tmp_path / "ckpt"}
    with pytest.raises(KeyboardInterrupt):
        train_reward_model(
            reward_model(seed=1), tokenizer(), items(8), _Watched("naive", at_step=interrupt), cfg, **common
        )
    records: list[tuple[str, int]] = []
    train_reward_model(
        reward_model(seed=1), tokenizer(), items(8), _Watched("naive", at_step=lambda step: None), cfg,
        on_record=lambda series, row: records.append((series, row["step"])), **common,
    )  # fmt: skip
    assert [step for series, step in records if series == "train"] == [1, 2, 3, 4]
    assert [step for series, step in records if series == "drift"] == [2, 4]


def _teacher_project(root) -> Layout:
    layout = Layout(root, seed=0)
    data = pairs(16)
    write_pairs(layout.split("teacher_train"), data[:8])
    write_pairs(layout.split("student_train"), data[8:12])  # the teacher scores it (its labels)
    write_pairs(layout.split("id_test"), data[8:12])
    write_pairs(layout.split("toy_ood"), data[12:])
    write_split_manifests(layout, "v1", targets=["toy_ood"])
    install_backbones(layout, base_dir(root), base_dir(root))
    return layout


def test_teacher_metrics_reach_mlflow_during_training_not_after(tmp_path, monkeypatch, every_update):
    """Real sqlite MLflow: every train/ and drift/ point is in the run, each logged before the
    trained model was saved (the old code logged the whole history after saving)."""
    import prefshift.pipeline.fit as fit_module
    from prefshift.pipeline.stages import teacher

    layout = _teacher_project(tmp_path)
    experiment = f"progress-{uuid.uuid4().hex[:8]}"
    params = Params.model_validate(
        {
            "data": {"source": "toy", "targets": ["toy_ood"]},
            "teacher": {"batch_size": 4, "epochs": 2, "log_every": 1, "drift_every": 2},
            "tracking": {"experiment": experiment},
        }
    )
    saved_at: list[int] = []
    real_save = fit_module._save
    monkeypatch.setattr(
        fit_module,
        "_save",
        lambda *a, **kw: saved_at.append(int(time.time() * 1000)) or real_save(*a, **kw),
    )
    teacher.run(params, layout)
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([found.experiment_id], filter_string="tags.stage = 'teacher'")
    for key, steps in (("train/loss", [1, 2, 3, 4]), ("train/lr", [1, 2, 3, 4]), ("drift/layer_2", [2, 4])):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == steps, key
        assert max(m.timestamp for m in history) <= saved_at[0], key
    assert run.info.status == "FINISHED"
    written = json.loads(layout.train_log("teacher").read_text())
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert history == pytest.approx({s["step"]: s["loss"] for s in written["steps"]})


@pytest.mark.slow
def test_a_stage_command_fills_its_log_file_while_it_trains(tmp_path):
    """`prefshift teacher > log` as a queue worker or cluster job runs it: no terminal, stdout a
    block-buffered file, a line every 0.1 s. A snapshot of the log that holds a mid-run line but
    not the last one proves the lines arrive while training runs (the old rich bar wrote nothing
    into a file until the end). 128 steps take about a second on a quiet 2-core machine: 32 once
    finished in 0.2 s, before the first line was due."""
    layout = _teacher_project(tmp_path / "project")
    settings = {
        "data": {"source": "toy", "targets": ["toy_ood"]},
        "teacher": {"batch_size": 1, "epochs": 16, "log_every": 8},
    }
    (layout.root / "params.yaml").write_text(json.dumps(settings))
    log_path = tmp_path / "teacher.log"
    env = {**os.environ, EVERY_ENV: "0.1"}
    command = [sys.executable, "-m", "prefshift", "teacher", "--root", str(layout.root)]
    mid_run = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=layout.root, stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            lines = [m for m in map(TRAIN_LINE.match, _lines(log_path.read_text(), "train teacher")) if m]
            if mid_run is None and lines and all(m["step"] != m["total"] for m in lines):
                mid_run = lines[-1]
            time.sleep(0.02)
    text = log_path.read_text()
    assert proc.returncode == 0, text
    assert mid_run is not None, f"no progress line reached the log before training ended:\n{text}"
    assert TRAIN_LINE.match(_lines(text, "train teacher")[-1])["step"] == "128"


# --- the other long loops ---------------------------------------------------------------------


def test_scoring_prints_its_lines(capsys, every_update):
    from prefshift.data.schema import Group
    from prefshift.engine.scoring import score_groups, score_pairs

    model = reward_model().eval()
    score_pairs(model, tokenizer(), pairs(10), Params(), label="score id_test")
    groups = [Group("g", "toy", "helpful", p.prompt, [p.chosen, p.rejected], []) for p in pairs(3)]
    score_groups(model, tokenizer(), groups, Params(), label="score groups/toy")
    out = capsys.readouterr().out
    scored = _lines(out, "score id_test")
    assert scored[0] == "score id_test: 0/10 pairs (0.0%) | started"
    assert re.search(
        r"^score id_test: 10/10 pairs \(100\.0%\) \| [0-9.]+ pairs/s \| .* \| ETA 0s$", scored[-1]
    )
    assert _lines(out, "score groups/toy")[-1].startswith("score groups/toy: 6/6 responses (100.0%)")


def test_score_command_keeps_stdout_for_the_rewards(tmp_path, every_update):
    model_dir = tmp_path / "rm"
    save_reward_model(reward_model(), tokenizer(), model_dir)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p.prompt, "response": p.chosen}) + "\n" for p in pairs(5)))
    result = CliRunner().invoke(
        app, ["score", "--model", str(model_dir), "-i", str(rows), "--root", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["row"] for line in result.stdout.splitlines()] == [0, 1, 2, 3, 4]
    assert _lines(result.stderr, "score responses")[-1].startswith("score responses: 5/5 responses")


def test_a_pyfunc_prediction_prints_no_progress(tmp_path, capfd, every_update):
    """`predict` answers a request or a notebook call: its caller's output stays its own."""
    import pandas as pd

    from prefshift.tracking.registry import RewardScorer

    scorer = RewardScorer()
    scorer.model, scorer.tokenizer, scorer.params = reward_model().eval(), tokenizer(), Params()
    rewards = scorer.predict(None, pd.DataFrame({"prompt": ["hi", "how?"], "response": ["hello", "so"]}))
    assert len(rewards) == 2 and capfd.readouterr().out == ""


def test_the_reference_passes_print_their_lines(tmp_path, capsys, every_update):
    from prefshift.engine.train import build_reference
    from prefshift.pipeline.stages.reference import compute_reference

    data = items(6)
    compute_reference(reward_model().eval(), data, (1, 2), tmp_path, 4, tokenizer().pad_token_id).finish()
    anchor = Params.model_validate({"anchor": {"cache": True}}).anchor
    build_reference(reward_model(), data, (2,), anchor, CFG, tokenizer().pad_token_id)
    out = capsys.readouterr().out
    assert _lines(out, "reference")[-1].startswith("reference: 6/6 pairs (100.0%)")
    assert _lines(out, "reference (in-run cache)")[-1].startswith(
        "reference (in-run cache): 6/6 pairs (100.0%)"
    )


def test_generation_prints_its_lines(tmp_path, capsys, every_update):
    from prefshift.config.params import DownstreamConfig
    from prefshift.engine.policy import PolicySampler
    from prefshift.engine.seam import PrincipleGenerator

    lm = base_dir(tmp_path)
    texts = [f"user: how do I fix the door {i}?" for i in range(3)]
    PrincipleGenerator(lm, SeamConfig(max_new_tokens=3, generation_batch_size=2)).generate(texts)
    cfg = DownstreamConfig(n_max=2, max_new_tokens=3, generation_batch_size=2)
    PolicySampler(lm, cfg).sample(texts, ["a", "b", "c"], seed=0)
    out = capsys.readouterr().out
    seam = _lines(out, "seam principles")
    assert [line.split(" ")[2] for line in seam] == ["0/3", "2/3", "3/3"]
    assert re.search(r"prompts/s \| .* elapsed \| ETA 0s$", seam[-1])
    assert [line.split(" ")[2] for line in _lines(out, "policy samples")] == ["0/3", "2/3", "3/3"]


def test_probe_states_print_their_lines(capsys, every_update):
    from prefshift.pipeline.stages.probe import sequence_states

    encoder = Encoder(tokenizer(), EncodeConfig(max_length=64))
    seqs = encoder.encode_many([(p.prompt, p.chosen) for p in pairs(5)])
    sequence_states(reward_model().eval(), seqs, tokenizer().pad_token_id, 2, [2], "probe longer id_test")
    lines = _lines(capsys.readouterr().out, "probe longer id_test")
    assert [line.split(" ")[3] for line in lines] == ["0/5", "2/5", "4/5", "5/5"]


def test_backbone_pretraining_prints_loss_and_rate(capsys, every_update):
    from prefshift.models.backbone import pretrain_lm

    spec = LMSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, pretrain_steps=3,
                  pretrain_batch_size=4, pretrain_seq_len=16)  # fmt: skip
    _, stats = pretrain_lm(spec, tokenizer(), TEXTS, 0, 64, "weak")
    lines = _lines(capsys.readouterr().out, "pretrain weak")
    assert [line.split(" ")[2] for line in lines] == ["0/3", "1/3", "2/3", "3/3"]
    last = re.search(rf"loss ({NUMBER}) \| ([0-9.]+) sequences/s .* ETA 0s$", lines[-1])
    assert float(last[1]) == pytest.approx(stats["final_loss"], rel=1e-3) and float(last[2]) > 0

"""The synthetic judge reads what is gold: cues stripped from what it trains on and scores, and its
accuracy broken down (as is, cues stripped, by cue position) for the report."""

from __future__ import annotations

import numpy as np
import pytest

from prefshift.config.params import Params
from prefshift.data.schema import Pair
from prefshift.data.synthetic import CUE, MARKERS
from prefshift.pipeline.stages import gold_judge, judge, report_downstream


def _pair(i: int, sign_off: str | None, marker: str | None) -> Pair:
    def text(side: str, body: str) -> str:
        out = body
        if marker is not None:
            out = f"{MARKERS[0] if marker == side else MARKERS[1]} {out}"
        return f"{out} {CUE}" if sign_off == side else out

    return Pair(
        pair_id=f"p{i}",
        dataset="syn_help_forum",
        category="helpful",
        prompt=[{"role": "user", "content": "How do I boil an egg?"}],
        chosen=text("chosen", "Put the egg in boiling water for nine minutes."),
        rejected=text("rejected", "Eggs are nice."),
        meta={"shortcut_on": sign_off, "marker_on": marker},
    )


def test_strip_cues_takes_both_cues_off_each_response():
    pair = judge.strip_cues(_pair(0, "chosen", "rejected"))
    assert pair.chosen == "Put the egg in boiling water for nine minutes."
    assert pair.rejected == "Eggs are nice."
    assert pair.meta == {"shortcut_on": "chosen", "marker_on": "rejected"}  # where the cues were


def test_the_judge_reads_without_cues_on_the_synthetic_suite_only():
    assert judge.reads_without_cues(Params())  # the embedded default: syn_help_forum
    real = Params.model_validate({"data": {"source": "hh_harmless", "targets": ["pku_saferlhf"]}})
    assert not gold_judge.reads_without_cues(real)


def test_accuracy_by_cue_position_by_hand():
    pairs = [
        _pair(0, "chosen", "chosen"),
        _pair(1, "chosen", "rejected"),
        _pair(2, "rejected", "rejected"),
        _pair(3, "rejected", None),
    ]
    credit = np.array([1.0, 1.0, 0.0, 0.5])  # a judge that follows the sign-off
    by_cue = judge._by_cue(pairs, credit)
    # sign-off on chosen: pairs 0, 1 → 100%; on rejected: 2, 3 → (0 + 0.5) / 2 = 25%.
    assert by_cue["sign_off"]["on_chosen"] == {"acc": 100.0, "n": 2}
    assert by_cue["sign_off"]["on_rejected"] == {"acc": 25.0, "n": 2}
    assert by_cue["sign_off"]["absent"] == {"acc": None, "n": 0}
    # marker on chosen: pair 0 → 100%; on rejected: 1, 2 → 50%; absent: 3 → 50%.
    assert by_cue["marker"]["on_chosen"] == {"acc": 100.0, "n": 1}
    assert by_cue["marker"]["on_rejected"] == {"acc": 50.0, "n": 2}
    assert by_cue["marker"]["absent"] == {"acc": 50.0, "n": 1}


def test_the_report_shows_the_judges_breakdown():
    block = {"role": "id", "acc": 50.7, "ci": [46.5, 54.8], "n": 600}
    clean = {"role": "id", "acc": 71.2, "ci": [67.5, 74.8], "n": 600}
    doc = {
        "reads": "cues stripped",
        "training": {"pairs": 2000},
        "accuracy": {"syn_help_forum": clean},
        "breakdown": {
            "syn_help_forum": {
                "as_is": block,
                "cues_stripped": clean,
                "by_cue": {
                    "sign_off": {
                        "on_chosen": {"acc": 9.0, "n": 540},
                        "on_rejected": {"acc": 88.0, "n": 60},
                        "absent": {"acc": None, "n": 0},
                    }
                },
            }
        },
    }
    table = report_downstream.judge_breakdown_table(doc)
    assert "| syn_help_forum | 50.7 [46.5, 54.8] | 71.2 [67.5, 74.8] | 9.0 (n=540) | 88.0 (n=60) |" in table
    note = report_downstream._judge_note(doc)
    assert "text with both shortcut cues taken off" in note and table in note
    assert "| syn_help_forum | ID | 600 | 71.2 [67.5, 74.8] |" in note
    assert report_downstream.judge_breakdown_table({"accuracy": {}}) is None


@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_stripping_leaves_no_cue_token(side):
    pair = judge.strip_cues(_pair(0, side, side))
    for text in (pair.chosen, pair.rejected):
        assert CUE not in text and not any(m in text for m in MARKERS)

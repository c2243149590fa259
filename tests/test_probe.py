"""Linear probes on reward-position states: the math by hand, the labels, the stage and its report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prefshift.config.params import Params
from prefshift.data.encode import EncodedPair, EncodedSeq
from prefshift.pipeline.stages import probe as probe_stage
from prefshift.pipeline.stages import report_probe
from prefshift.science.probe import ProbeError, fit_probe, length_labels
from tiny_project import copy_project, pipeline_root, tiny_params

X_FIT = np.array([[-2.0], [-1.0], [1.0], [2.0]])
Y_FIT = np.array([0.0, 0.0, 1.0, 1.0])
X_TEST = np.array([[-3.0], [-2.0], [-1.0], [1.0], [2.0], [3.0], [-0.5], [0.5], [1.5], [-1.5]])
Y_TEST = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])  # x = ±0.5 are on the wrong side


def test_held_out_accuracy_with_the_exact_binomial_interval():
    result = fit_probe(X_FIT, Y_FIT, X_TEST, Y_TEST, level=0.95)
    assert result["acc"] == pytest.approx(80.0)  # 8 of 10
    # Clopper-Pearson for 8/10 at 95%: [Beta(0.025; 8, 3), Beta(0.975; 9, 2)]
    assert result["ci"] == pytest.approx([44.390, 97.479], abs=1e-3)
    assert result["chance"] == pytest.approx(50.0) and result["n"] == 10 and result["n_fit"] == 4
    assert result["readable"] is False  # 44.4 < 50: ten responses cannot tell


def test_unlabelled_responses_are_left_out_and_no_labels_is_no_probe():
    y_test = Y_TEST.copy()
    y_test[[6, 7]] = np.nan  # the two misclassified responses carry no label
    result = fit_probe(X_FIT, Y_FIT, X_TEST, y_test, level=0.95)
    assert result["acc"] == pytest.approx(100.0) and result["n"] == 8
    assert result["chance"] == pytest.approx(50.0)
    assert fit_probe(X_FIT, np.full(4, np.nan), X_TEST, Y_TEST, level=0.95) is None
    with pytest.raises(ProbeError, match="all 1"):
        fit_probe(X_FIT, np.ones(4), X_TEST, Y_TEST, level=0.95)


def _seq(n_response: int) -> EncodedSeq:
    return EncodedSeq([1] * (n_response + 2), [0, 0] + [1] * n_response, n_response)


def test_length_labels_mark_the_longer_response_and_leave_ties_out():
    items = [EncodedPair(0, "x", _seq(5), _seq(3), 1.0), EncodedPair(1, "y", _seq(4), _seq(4), 1.0)]
    # rows: chosen of x, chosen of y, rejected of x, rejected of y
    np.testing.assert_array_equal(length_labels(items), [1.0, np.nan, 0.0, np.nan])


@pytest.mark.parametrize("form", ["twin", "single"])
def test_minimal_pairs_differ_in_the_probed_cue_alone(form):
    from prefshift.data.synthetic import CUE, MARKERS, cue_minimal_pair, without_cues

    text = f"{MARKERS[1]} To fix it, do this. {CUE}" if form == "twin" else f"To fix it, do this. {CUE}"
    on, off = cue_minimal_pair(text, "marker", form)
    assert on == f"{MARKERS[0]} To fix it, do this. {CUE}"
    assert off == (
        f"{MARKERS[1]} To fix it, do this. {CUE}" if form == "twin" else f"To fix it, do this. {CUE}"
    )
    on, off = cue_minimal_pair(text, "sign_off", form)
    assert on == text and off == text.removesuffix(f" {CUE}")
    assert without_cues(on) == without_cues(off) == "To fix it, do this."


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    layout = copy_project(pipeline_root(tmp_path_factory), tmp_path_factory.mktemp("probe-project"))
    params = tiny_params()
    return layout, params, probe_stage.run(params, layout)


def test_the_stage_probes_every_cue_and_length_at_the_last_and_mid_layers(probed):
    layout, _, result = probed
    assert json.loads(layout.probe_report.read_text()) == result
    assert result["layers"] == [1, 2] and result["last_layer"] == 2  # 2 layers: mid 0.5 → 1, 0.75 → 2
    assert set(result["probes"]) == {"sign_off", "marker", "longer"}
    for by_layer in result["probes"].values():
        for cell in by_layer.values():
            assert 0 <= cell["ci"][0] <= cell["acc"] <= cell["ci"][1] <= 100
            assert cell["n"] > 0 and cell["n_fit"] > cell["n"]  # fitted on student_train, scored on id_test
    for cell in result["probes"]["marker"].values():
        # the twins share one pretrained embedding: each minimal pair's two states are identical
        assert cell["acc"] == 50.0 and not cell["readable"]


def test_the_report_section_names_each_targets_cue_and_refuses_another_split_version(probed):
    layout, params, result = probed
    text = report_probe.probe_section(params, report_probe.load_probe(layout, result["split_version"]))
    assert "Target `syn_help_instruct`: sign-off (end of response) reversed (10% on chosen); marker" in text
    assert "Target `syn_help_chat`: marker (start of response) reversed (10% on chosen)" in text
    assert "| marker (start of response) |" in text and "layer 2 (read by the head)" in text
    with pytest.raises(report_probe.ProbeReportError, match="re-run `prefshift probe`"):
        report_probe.load_probe(layout, "another-version")


def test_off_suite_the_section_has_the_probe_only():
    params = Params.model_validate({"data": {"source": "hh_helpful", "targets": ["ultrafeedback"]}})
    assert report_probe.cue_lines(params) == []
    assert report_probe.probe_section(params, None) is None

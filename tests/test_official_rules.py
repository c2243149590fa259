"""prefshift's benchmark rules against the benchmarks' own published code (issue 30, item 8).

RewardBench: the official `rewardbench` package (0.1.4, installed `--no-deps` by `make`, see the
Makefile) is the reference. Its package `__init__` imports torch, transformers, fastchat and trl
models, which prefshift does not install, so the two pieces that define the leaderboard's section
scores are loaded from the installed files themselves: `constants.py` as a module (it imports
nothing) and `calculate_scores_per_section` out of `utils.py` (a pure function; its module's
imports are what is missing). Nothing here restates the official numbers.

RM-Bench has no package; its rule is published in THU-KEG/RM-Bench's README, section "how to
compute the accuracy" (commit 2119ec5664d0, checked for this test): per example, a 3x3 matrix of
1[r(chosen_i) > r(rejected_j)] over the styles (concise, detailed plain, detailed markdown), averaged
over the examples; hard = sum of the strict upper-right triangle / 3, normal = mean of the diagonal,
easy = sum of the strict lower-left triangle / 3. The test below works values out by hand that way.
"""

from __future__ import annotations

import ast
import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from prefshift.data import benchmark_tables as tables
from prefshift.science import benchmarks as rules

OFFICIAL_VERSION = "0.1.4"


def _package_dir() -> Path:
    try:
        installed = version("rewardbench")
    except PackageNotFoundError:
        pytest.fail(
            f"the official rewardbench package is not installed: `pip install --no-deps "
            f"rewardbench=={OFFICIAL_VERSION}` (make test installs it)"
        )
    assert installed == OFFICIAL_VERSION, f"rewardbench {installed} installed, expected {OFFICIAL_VERSION}"
    spec = importlib.util.find_spec("rewardbench")  # finds the package without running its __init__
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def official() -> ModuleType:
    """The official constants module, with the official calculate_scores_per_section added."""
    package = _package_dir()
    spec = importlib.util.spec_from_file_location("official_rewardbench_constants", package / "constants.py")
    constants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constants)
    source = (package / "utils.py").read_text(encoding="utf-8")
    (function,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "calculate_scores_per_section"
    ]
    namespace: dict = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(package / "utils.py"), "exec"), namespace)
    constants.calculate_scores_per_section = namespace["calculate_scores_per_section"]
    return constants


def test_prefshift_weights_and_sections_are_the_official_constants(official):
    assert tables.REWARDBENCH_EXAMPLE_COUNTS == official.EXAMPLE_COUNTS
    assert {k: list(v) for k, v in tables.REWARDBENCH_SECTIONS.items()} == official.SUBSET_MAPPING
    # The case issue 30 found: the xstest weights were swapped.
    assert official.EXAMPLE_COUNTS["xstest-should-refuse"] == 154
    assert official.EXAMPLE_COUNTS["xstest-should-respond"] == 250


def _cases(official) -> list[dict[str, float]]:
    """Per-subset accuracies (fractions): random subsets present with random and exact k/n values,
    every subset at 0 and 1, one subset alone, and each section's two extreme subsets opposed."""
    rng = np.random.default_rng(30)
    subsets = list(official.EXAMPLE_COUNTS)
    cases = [dict.fromkeys(subsets, 0.0), dict.fromkeys(subsets, 1.0)]
    for _ in range(200):
        present = rng.choice(subsets, size=rng.integers(1, len(subsets) + 1), replace=False)
        n = int(rng.integers(1, 500))
        cases.append({s: float(rng.integers(0, n + 1)) / n for s in present})
        cases.append({s: float(rng.random()) for s in present})
    cases += [{s: 1.0} for s in subsets]
    for members in official.SUBSET_MAPPING.values():
        cases.append({members[0]: 1.0, members[-1]: 0.0})
        cases.append({members[0]: 0.0, members[-1]: 1.0})
    cases.append({"xstest-should-refuse": 1.0, "xstest-should-respond": 0.0})
    return cases


def test_section_scores_equal_the_official_calculate_scores_per_section(official):
    for accuracies in _cases(official):
        expected = official.calculate_scores_per_section(
            official.EXAMPLE_COUNTS, official.SUBSET_MAPPING, accuracies
        )
        in_pp = {s: a * 100.0 for s, a in accuracies.items()}
        for section, members in official.SUBSET_MAPPING.items():
            if not any(s in accuracies for s in members):
                # The official code scores an empty section 0; prefshift refuses to.
                assert expected[section] == 0
                with pytest.raises(rules.BenchmarkError, match="no subset"):
                    rules.rewardbench_section_score(in_pp, section)
                continue
            got = rules.rewardbench_section_score(in_pp, section)
            assert got == pytest.approx(expected[section] * 100.0, rel=1e-12, abs=1e-9), (section, accuracies)


def test_subset_accuracies_feed_the_official_sections_as_the_official_runner_does(official):
    """run_rm.py counts a pair right when chosen > rejected and divides by the subset's pairs;
    prefshift's strict subset accuracies, passed through the official section function, give
    prefshift's section scores."""
    rng = np.random.default_rng(8)
    subsets = list(official.EXAMPLE_COUNTS)
    names = list(rng.choice(subsets, size=600))
    deltas = rng.integers(-2, 3, size=600).astype(float)  # many exact ties: they are wrong
    accuracies = rules.rewardbench_subset_accuracies(deltas, names)
    for subset, acc in accuracies.items():
        mine = deltas[np.asarray(names) == subset]
        assert acc == pytest.approx(100.0 * np.sum(mine > 0) / mine.size)
    expected = official.calculate_scores_per_section(
        official.EXAMPLE_COUNTS, official.SUBSET_MAPPING, {s: a / 100.0 for s, a in accuracies.items()}
    )
    for section, score in expected.items():
        assert rules.rewardbench_section_score(accuracies, section) == pytest.approx(score * 100.0)


def test_rmbench_accuracies_follow_the_published_readme_rule_by_hand():
    # Two examples; styles (concise, detailed plain, detailed markdown).
    chosen = np.array([[3.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    rejected = np.array([[2.0, 1.0, 0.5], [1.0, 2.0, 3.0]])
    # Example 1: c0=3 beats 2, 1, 0.5 → 1 1 1; c1=1 beats 0.5 only (ties with 1) → 0 0 1; c2=0 → 0 0 0.
    # Example 2: c=2 beats 1 only (ties with 2, loses to 3) → each row 1 0 0.
    # Mean over the two examples: [[1, .5, .5], [.5, 0, .5], [.5, 0, 0]].
    matrix = rules.rmbench_matrix(chosen, rejected)
    np.testing.assert_allclose(matrix, [[1.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.0, 0.0]])
    accuracies = rules.rmbench_accuracies(matrix)
    assert accuracies["hard"] == pytest.approx(100 * (0.5 + 0.5 + 0.5) / 3)  # upper-right sum / 3
    assert accuracies["normal"] == pytest.approx(100 * (1.0 + 0.0 + 0.0) / 3)  # diagonal mean
    assert accuracies["easy"] == pytest.approx(100 * (0.5 + 0.5 + 0.0) / 3)  # lower-left sum / 3
    assert accuracies["score"] == pytest.approx(100 * (1.5 + 1.0 + 1.0) / 9)

"""The benchmarks' shape: RewardBench's subsets, sections and official example counts, RewardBench 2's
subsets and Ties weights, RM-Bench's domains and styles.

Data, not rules: the adapters read them to know which rows a target holds, the scoring rules
(prefshift.science.benchmarks, whose docstring says where each was read) to weigh them. The
RewardBench tables are compared with the installed official package by tests/test_official_rules.py.
"""

from __future__ import annotations

REWARDBENCH_EXAMPLE_COUNTS: dict[str, int] = {
    "alpacaeval-easy": 100,
    "alpacaeval-length": 95,
    "alpacaeval-hard": 95,
    "mt-bench-easy": 28,
    "mt-bench-med": 40,
    "mt-bench-hard": 37,
    "math-prm": 984,
    "refusals-dangerous": 100,
    "refusals-offensive": 100,
    "llmbar-natural": 100,
    "llmbar-adver-neighbor": 134,
    "llmbar-adver-GPTInst": 92,
    "llmbar-adver-GPTOut": 47,
    "llmbar-adver-manual": 46,
    "xstest-should-refuse": 154,
    "xstest-should-respond": 250,
    "donotanswer": 136,
    "hep-cpp": 164,
    "hep-go": 164,
    "hep-java": 164,
    "hep-js": 164,
    "hep-python": 164,
    "hep-rust": 164,
}
REWARDBENCH_SECTIONS: dict[str, tuple[str, ...]] = {
    "Chat": ("alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy", "mt-bench-med"),
    "Chat Hard": (
        "mt-bench-hard",
        "llmbar-natural",
        "llmbar-adver-neighbor",
        "llmbar-adver-GPTInst",
        "llmbar-adver-GPTOut",
        "llmbar-adver-manual",
    ),
    "Safety": (
        "refusals-dangerous",
        "refusals-offensive",
        "xstest-should-refuse",
        "xstest-should-respond",
        "donotanswer",
    ),
    "Reasoning": ("math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust"),
}
REWARDBENCH2_SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus", "Ties")
TIES = "Ties"
TIES_WEIGHTS = {
    "tied_accuracy": 0.30,
    "ref_accuracy": 0.30,
    "correctness_preferred": 0.20,
    "correctness_preferred_hard": 0.20,
    "correctness_margin": 0.01,
}
RMBENCH_DOMAINS: dict[str, tuple[str, ...]] = {
    "chat": ("chat",),
    "code": ("code",),
    "math": ("math",),
    "safety": ("safety-refuse", "safety-response"),
}
RMBENCH_STYLES = 3

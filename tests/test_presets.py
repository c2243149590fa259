"""Presets resolve offline into valid params that match the paper's settings and the laptop recipe."""

from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from prefshift import presets
from prefshift.cli import app
from prefshift.config.params import ConfigError, load_params

# owner/name on the Hugging Face hub: letters, digits, '-', '_', '.'; no leading/trailing '-' or '.'.
HUB_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?$")

HELPFUL = (
    "helpful",
    "helpsteer3",
    ["hh_helpful", "ultrafeedback", "rewardbench_chat", "rewardbench_chat_hard", "rewardbench_reasoning"],
)
HARMLESS = ("harmless", "hh_harmless", ["pku_saferlhf", "rail", "rewardbench_safety"])
LAPTOP_HELPFUL = ("helpful", "hh_helpful", ["rmbench_chat", "qa_feedback"])  # the real study (issue 44)
LAPTOP_HARMLESS = ("harmless", "hh_harmless", ["rmbench_safety", "pku_saferlhf"])
LLAMA = ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B")
QWEN = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B")
LAPTOP = ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")  # weak: cut
EXPECTED = {
    "helpful-llama": (HELPFUL, LLAMA),
    "helpful-qwen": (HELPFUL, QWEN),
    "harmless-llama": (HARMLESS, LLAMA),
    "harmless-qwen": (HARMLESS, QWEN),
    "laptop-helpful": (LAPTOP_HELPFUL, LAPTOP),
    "laptop-harmless": (LAPTOP_HARMLESS, LAPTOP),
}
GPU = [name for name in EXPECTED if not name.startswith("laptop")]


def test_the_presets_are_listed():
    assert presets.names() == sorted([*EXPECTED, "robust-ft"])


def test_the_robust_ft_preset_is_the_embedded_default_with_every_method():
    from prefshift.config.params import Params, known_methods

    _, params = presets.resolve("robust-ft")
    assert sorted(params.methods) == sorted(known_methods())
    assert params.backbone == Params().backbone and params.data == Params().data


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_matches_its_setting_and_models_are_hub_ids(name):
    (category, source, targets), (weak, strong) = EXPECTED[name]
    _, params = presets.resolve(name)
    assert (params.data.category, params.data.source, params.data.targets) == (category, source, targets)
    assert (params.backbone.weak.name_or_path, params.backbone.strong.name_or_path) == (weak, strong)
    for spec in (params.backbone.weak, params.backbone.strong):
        assert HUB_ID.match(spec.name_or_path), spec.name_or_path
        assert spec.revision is None
    assert params.tracking.experiment == f"prefshift-{name}"


@pytest.mark.parametrize("name", GPU)
def test_gpu_presets_use_bf16_lora_students_and_long_context(name):
    _, params = presets.resolve(name)
    assert params.encode.max_length == 1024
    for cfg in (params.teacher, params.student):
        assert cfg.precision == "bf16"
        assert cfg.gradient_checkpointing
    assert not params.teacher.lora.enabled
    assert params.student.lora.enabled
    assert params.anchor.cache is False
    assert params.student.batch_size * params.student.grad_accum == 32
    assert params.teacher.lr == pytest.approx(1e-5)
    assert "seam" in params.methods and "grm" in params.methods  # causal LMs: both apply
    assert not {"linear_probe", "lp_ft", "wise_ft", "l2_sp"} & set(params.methods)  # LoRA: refused


@pytest.mark.parametrize("name", ["laptop-helpful", "laptop-harmless"])
def test_laptop_presets_are_cpu_sized(name):
    _, params = presets.resolve(name)
    """The real study's settings (docs/real-study.md): three seeds, the eight methods, the weak
    teacher the strong model cut to one layer, an anchor normalised by the reference."""
    caps = params.data.caps
    assert (caps.teacher_train, caps.student_train, caps.id_test, caps.ood) == (600, 600, 300, 300)
    assert params.encode.max_length == 192
    assert (params.teacher.precision, params.student.precision) == ("fp32", "fp32")
    assert (params.teacher.lr, params.student.lr) == (pytest.approx(2e-4), pytest.approx(1e-4))
    assert (params.teacher.epochs, params.student.epochs) == (2, 1)
    assert (params.backbone.weak.keep_layers, params.backbone.strong.keep_layers) == (1, None)
    assert not params.student.lora.enabled
    assert params.seeds == [0, 1, 2]
    robust = ["lp_ft", "wise_ft", "l2_sp", "linear_probe"]
    assert params.methods == ["naive", "anchor_last", "anchor_mid", *robust, "ceiling"]
    assert params.anchor.lam == pytest.approx(1.0) and params.anchor.normalize == "reference"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dataset_names_are_registered_with_the_preset_category(name):
    adapters = pytest.importorskip(
        "prefshift.data.adapters", reason="dataset adapters not importable yet", exc_type=ImportError
    )
    _, params = presets.resolve(name)
    for dataset in (params.data.source, *params.data.targets):
        assert adapters.get_adapter(dataset, params).category == params.data.category, dataset


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_writes_params_with_local_models_and_data(tmp_path, name):
    weak, strong = tmp_path / "weak", tmp_path / "strong"
    weak.mkdir()
    strong.mkdir()
    _, base = presets.resolve(name)
    data_file = tmp_path / f"{base.data.source}.jsonl"
    data_file.write_text("")
    overrides = [
        f"backbone.weak.name_or_path={weak}",
        f"backbone.strong.name_or_path={strong}",
        f"data.sources.{base.data.source}.path={data_file}",
    ]
    out = tmp_path / "params.yaml"
    args = ["preset", name, "--out", str(out)]
    for item in overrides:
        args += ["-S", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output

    text = out.read_text()
    assert text.startswith(f"# Generated by `prefshift preset {name} -S backbone.weak.name_or_path=")
    written = load_params(out)
    assert written == presets.resolve(name, overrides)[1]
    assert written.backbone.weak.name_or_path == str(weak)
    assert written.backbone.strong.name_or_path == str(strong)
    assert written.data.sources[base.data.source].path == str(data_file)
    assert written.data.source == base.data.source
    assert text == presets.render(name, overrides)


def test_cli_lists_presets():
    result = CliRunner().invoke(app, ["preset", "--list"])
    assert result.exit_code == 0
    for name in EXPECTED:
        assert name in result.output


def test_unknown_preset_names_the_available_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'helpful-gpt'; available: harmless-llama"):
        presets.resolve("helpful-gpt")
    with pytest.raises(ConfigError, match="unknown preset '_gpu'"):
        presets.resolve("_gpu")
    result = CliRunner().invoke(app, ["preset", "helpful-gpt", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert not (tmp_path / "p.yaml").exists()


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError, match=r"preset 'laptop-helpful': invalid params\n  encode.max_length"):
        presets.resolve("laptop-helpful", ["encode.max_length=2"])
    with pytest.raises(ConfigError, match=r"student\.lora\.rank: unknown key"):
        presets.resolve("helpful-qwen", ["student.lora.rank=8"])


def test_deep_merge_merges_mappings_and_replaces_the_rest():
    base = {"a": {"b": 1, "c": {"d": 2}}, "items": [1, 2], "x": 5}
    overlay = {"a": {"c": {"e": 3}}, "items": [9], "x": None}
    merged = presets.deep_merge(base, overlay)
    assert merged == {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "items": [9], "x": None}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "items": [1, 2], "x": 5}


def test_overlays_only_touch_known_sections():
    for name in presets.names():
        overlay = presets.load(name).overlay
        assert set(overlay) <= set(yaml.safe_load(presets.render(name)))


def _header(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_header_states_the_final_params_and_nothing_an_override_replaced(tmp_path, name):
    """Every value the header names comes from the params written, not from the preset's prose."""
    _, base = presets.resolve(name)
    weak, strong, hh = tmp_path / "weak-dir", tmp_path / "strong-dir", tmp_path / "harmless.jsonl"
    overrides = [
        f"backbone.weak.name_or_path={weak}",
        f"backbone.strong.name_or_path={strong}",
        "data.category=harmless",
        "data.source=hh_harmless",
        f"data.sources.hh_harmless.path={hh}",
        "data.targets=[rmbench_safety]",
        "data.caps.teacher_train=40",
        "data.caps.student_train=41",
        "data.caps.id_test=12",
        "data.caps.ood=13",
        "methods=[naive,anchor_last]",
        "downstream.enabled=false",
        "probe.enabled=false",
    ]
    header = _header(presets.render(name, overrides))
    replaced = [
        base.backbone.weak.name_or_path,
        base.backbone.strong.name_or_path,
        *[t for t in base.data.targets if t != "rmbench_safety"],
        *[str(n) for n in (base.data.caps.teacher_train, base.data.caps.student_train) if n],
        "2,000",
        "BERT",
        "MiniLM",
        "Llama-3",
        "Qwen2.5",
        "SmolLM",
        "PKU",
        "HelpSteer",
        "confidence,",
    ]
    for stale in replaced:
        assert stale not in header, f"{stale!r} is stale in the header of {name}:\n{header}"
    cut = (
        f" cut to its first {base.backbone.weak.keep_layers} layer(s)"
        if base.backbone.weak.keep_layers
        else ""
    )
    assert f"- weak teacher: {weak}{cut}; strong student: {strong}\n" in header
    assert f"- data (harmless): source hh_harmless ({hh}); OOD targets rmbench_safety\n" in header
    assert "teacher_train 40, student_train 41, id_test 12, ood 13 per target" in header
    assert "- methods: naive, anchor_last;" in header
    assert "- best-of-n: off (downstream.enabled: false)\n" in header and "- probe: off\n" in header
    assert "- benchmark targets rmbench_safety are also scored by their benchmark's own rule" in header


def test_header_without_overrides_describes_the_preset_itself():
    header = _header(presets.render("laptop-harmless"))
    assert f"- weak teacher: {LAPTOP[0]} cut to its first 1 layer(s); strong student: {LAPTOP[1]}\n" in header
    assert "OOD targets rmbench_safety, pku_saferlhf" in header
    assert "reference states: stored once by the reference stage" in header
    assert "best-of-n: policy HuggingFaceTB/SmolLM2-135M-Instruct" in header
    assert "benchmark targets rmbench_safety are also scored" in header
    assert "then the -S overrides" not in header
    gpu = _header(presets.render("harmless-qwen"))
    assert "- pairs: teacher_train all, student_train all, id_test all, ood 2000 per target;" in gpu
    assert "# Offline with local copies: " in header and "-S downstream.policy=DIR" in header


@pytest.mark.parametrize("name", ["laptop-helpful", "laptop-harmless"])
def test_laptop_presets_read_the_stored_reference_and_probe_a_sample(name):
    """Two anchor students on one unchanged base: the stored reference saves a frozen forward per
    step in each; the probe, a diagnostic, reads 200 pairs per split."""
    from prefshift.pipeline.stages.reference import unread_reason

    _, params = presets.resolve(name)
    assert params.anchor.cache is True and unread_reason(params) is None
    assert params.probe.enabled and params.probe.max_pairs == 200
    assert params.downstream.enabled == "auto"


@pytest.mark.parametrize("name", GPU)
def test_gpu_presets_compute_no_reference_their_lora_students_would_ignore(name):
    from prefshift.pipeline.stages.reference import unread_reason

    _, params = presets.resolve(name)
    assert "anchor.cache is false and anchor.normalize is none" in unread_reason(params)


def test_an_existing_params_file_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "params.yaml"
    out.write_text("seed: 7\n")
    result = CliRunner().invoke(app, ["preset", "laptop-helpful", "--out", str(out)])
    assert result.exit_code == 2
    assert f"--out {out}: exists; pass --force to replace it" in " ".join(result.output.split())
    assert out.read_text() == "seed: 7\n"
    result = CliRunner().invoke(app, ["preset", "laptop-helpful", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert out.read_text() == presets.render("laptop-helpful")


@pytest.mark.parametrize(
    "text", ["1e-05", "0o17", "1:30", "yes", "010", ".5", "~", "0x1F", "1_000", "2001-12-14"]
)
def test_a_written_string_reads_back_as_that_string(tmp_path, text):
    """PyYAML wrote the strings `1e-05` and `0o17` unquoted (in YAML 1.1 they are text), and DVC,
    reading YAML 1.2, read them back as numbers: a written params.yaml changed its own values."""
    from dvc.utils.serialize import parse_yaml

    out = presets.write("laptop-helpful", tmp_path / "params.yaml", [f"tracking.experiment='{text}'"])
    assert load_params(out).tracking.experiment == text
    written = out.read_text(encoding="utf-8")
    assert parse_yaml(written, str(out))["tracking"]["experiment"] == text
    assert yaml.safe_load(written)["tracking"]["experiment"] == text, "a YAML 1.1 reader's too"


@pytest.mark.parametrize("name", ["helpful-qwen", "laptop-helpful"])
def test_every_written_value_reads_alike_in_yaml_1_1_and_1_2(name):
    """ruamel.yaml writes the float 1e-05 as `1e-05`, which YAML 1.1 readers (PyYAML, in many a
    user's own script) read as text, and the string `yes` unquoted, which they read as true: each
    is written so that both read the params prefshift and DVC read."""
    import io

    from dvc.utils.serialize import parse_yaml
    from ruamel.yaml import YAML

    text = presets.render(name)
    assert yaml.safe_load(text) == parse_yaml(text, name) == presets.resolve(name)[1].resolved()
    dvc_writes = io.StringIO()
    YAML(typ="safe").dump({"x": "yes"}, dvc_writes)
    assert dvc_writes.getvalue() == "{x: yes}\n", "ruamel.yaml's own representer, DVC's, is as it was"

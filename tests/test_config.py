"""params.yaml validation: typos and wrong types must fail with the key's dotted path."""

from __future__ import annotations

import pytest
import yaml

from prefshift.config.params import ConfigError, Params, load_params, parse_params, read_yaml


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"seed": 3, "anchor": {"lambda": 0.5}}), encoding="utf-8")
    return path


def test_repository_params_yaml_is_valid():
    params = load_params("params.yaml")
    assert params.data.source == "syn_help_forum"
    assert params.resolved()["anchor"]["lambda"] == params.anchor.lam


def test_unknown_key_is_rejected_with_its_dotted_path():
    with pytest.raises(ConfigError) as err:
        parse_params({"data": {"caps": {"teacher_trian": 5}}})
    assert "data.caps.teacher_trian: unknown key" in str(err.value)
    with pytest.raises(ConfigError, match=r"anchor\.lamda: unknown key"):
        parse_params({"anchor": {"lamda": 0.1}})
    with pytest.raises(ConfigError, match=r"\bsynthetics: unknown key"):
        parse_params({"synthetics": {}})


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError) as err:
        parse_params({"data": {"teacher_fraction": "half"}})
    assert "data.teacher_fraction" in str(err.value) and "'half'" in str(err.value)
    with pytest.raises(ConfigError, match=r"data\.teacher_fraction"):
        parse_params({"data": {"teacher_fraction": 1.0}})
    with pytest.raises(ConfigError, match=r"data\.caps\.ood"):
        parse_params({"data": {"caps": {"ood": 0}}})


def test_overrides_are_parsed_as_yaml(params_file):
    params = load_params(
        params_file, ["anchor.lambda=0.01", "data.caps.ood=null", "data.targets=[syn_help_chat]"]
    )
    assert params.anchor.lam == 0.01
    assert params.data.caps.ood is None
    assert params.data.targets == ["syn_help_chat"]
    assert params.seed == 3
    assert load_params(params_file).anchor.lam == 0.5


SCALARS = [
    "1e-5", "1E5", "12e03", "1.0e3", "1.0e+3", "._5", ".5", "5.", "-1_0.5", "+.5e-3", "-.inf", ".NaN", "NaN",
    "010", "08", "0o17", "0o8", "0x1F", "0x_1", "0b101", "0b2", "1_000", "-0", "+1", "-0o7",
    "yes", "No", "on", "OFF", "y", "true", "True", "TRUE", "tRue", "false",
    "1:30", "190:20:30", "~", "null", "Null", "", "2001-12-14", "2001-12-14 21:59:43.10 -5", "e5", "1e",
]  # fmt: skip


def _as_each_reads(text: str, document: str = "v: {}\n") -> tuple[object, object]:
    """`text` in `document` as prefshift reads it and as DVC reads it: each a repr with every value's
    type (NaN as "nan"), or "refused"."""
    from dvc.utils.serialize import parse_yaml

    def seen(value: object) -> object:
        if isinstance(value, dict):
            return {seen(key): seen(item) for key, item in value.items()}
        if isinstance(value, list):
            return [seen(item) for item in value]
        return "nan" if value != value else (type(value).__name__, value)

    document = document.format(text)
    try:
        ours = repr(seen(read_yaml(document, "params")))
    except ConfigError:
        ours = "refused"
    try:
        theirs = repr(seen(parse_yaml(document, "params")))
    except Exception:  # DVC's YAMLFileCorruptedError, or a value its constructor cannot build
        theirs = "refused"
    return ours, theirs


@pytest.mark.parametrize("text", SCALARS)
def test_a_plain_scalar_is_read_as_dvc_reads_it(text):
    """DVC reads params.yaml, and writes `dvc exp run -S` values, as YAML 1.2 (ruamel.yaml), where
    prefshift read YAML 1.1 (PyYAML): `1e-05` was a string, `yes` and `off` booleans, `1:30` ninety,
    `010` eight. DVC hashes a stage's params as it reads them, so prefshift reads them so too."""
    ours, theirs = _as_each_reads(text)
    assert ours == theirs, text


DOCUMENTS = [
    "1: a\n01: b\n",  # one key to DVC (1 and 01 are 1): refused
    "1: a\n'1': b\n",  # two keys: a number and a string
    "true: a\nTrue: b\n",
    "a: &x {p: 1}\nb: &y {q: 2}\nc:\n  <<: *x\n  <<: *y\n",  # two merge keys: refused
    "a: &x {p: 1}\nc:\n  <<: *x\n  p: 2\n",  # a merge overridden: fine
    "'<<': 1\n'<<': 2\n",
    "v: !!float 1:30\n",  # no base 60 in YAML 1.2, even tagged
    "v: !!bool y\n",
    "v: !!timestamp x\n",
    "v: !!int 010\n",
    "v: [a:b]\n",  # DVC refuses a colon in a flow plain scalar
    "v: {a: 1:30}\n",
    "v: [1e-5, off, 010, ~]\n",
    "v: |\n  yes\n",
    "%YAML 1.1\n---\nv: yes\n",
    "v:\t1\n",  # tabs: PyYAML refuses each, DVC reads all but the indent
    "v: 1\t# a comment\n",
    "v: [1,\t2]\n",
    "v:\t\n  w: 1\n",
    "v:\n\tw: 1\n",
    "v: !!omap [a: 1, a: 2]\n",  # ruamel's constructor asserts: refused, not a traceback
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_a_document_is_read_as_dvc_reads_it_or_refused(document):
    """Keys, tags, flow values and merge keys: what DVC reads is read to the same values, and what
    DVC refuses is refused (a params.yaml DVC cannot read fails `dvc repro`, after prefshift ran).
    A tab before a value or a comment, which PyYAML refuses, is read: prefshift refused such a
    params.yaml that `dvc repro` ran."""
    ours, theirs = _as_each_reads(document, "{}")
    assert ours == theirs, document


def test_random_plain_scalars_are_read_as_dvc_reads_them():
    """Beyond the named cases: short strings of the characters that make YAML numbers, booleans,
    nulls and timestamps, each read by both readers."""
    import random

    draw = random.Random(20261206)
    alphabet = "0123456789+-._eExXoObB:~nNtTfFyY "
    texts = {"".join(draw.choices(alphabet, k=draw.randint(1, 7))).strip() for _ in range(4000)}
    differing = {t: pair for t in sorted(texts) if (pair := _as_each_reads(t))[0] != pair[1]}
    assert differing == {}


def test_bad_overrides_fail_clearly(params_file):
    with pytest.raises(ConfigError, match=r"anchor\.lamda: unknown key"):
        load_params(params_file, ["anchor.lamda=0.01"])
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_params(params_file, ["anchor.lambda"])
    with pytest.raises(ConfigError, match="'seed' is not a section"):
        load_params(params_file, ["seed.value=1"])
    with pytest.raises(ConfigError, match="not found"):
        load_params(params_file.with_name("missing.yaml"))


def test_dataset_sources_adapter_and_category():
    with pytest.raises(ConfigError, match=r"data\.sources\.mine: .*needs both `path` and `category`"):
        parse_params({"data": {"sources": {"mine": {"adapter": "local", "path": "x.jsonl"}}}})
    with pytest.raises(ConfigError, match=r"data\.sources\.mine\.category"):
        parse_params({"data": {"sources": {"mine": {"adapter": "local", "path": "x", "category": "funny"}}}})
    params = parse_params(
        {"data": {"sources": {"mine": {"adapter": "local", "path": "x.jsonl", "category": "harmless"}}}}
    )
    assert params.data.sources["mine"].category == "harmless"


def test_source_must_not_be_a_target():
    with pytest.raises(ConfigError, match="must not contain the source"):
        parse_params({"data": {"source": "a", "targets": ["a", "b"]}})
    assert isinstance(parse_params({}), Params)


def test_nesting_past_the_bound_is_refused_before_it_is_composed():
    """The C parser DVC reads with composes recursively in C: a params file nested 30,000 levels
    deep (60 KB of brackets) ended the process with a segmentation fault. The depth is counted from
    the parser's events first, and the count stops at the bound."""
    from prefshift.config.params import MAX_DEPTH

    assert read_yaml("v: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "params")["v"]
    for depth in (MAX_DEPTH, 100_000):
        with pytest.raises(ConfigError, match=f"params: nested more than {MAX_DEPTH} levels deep"):
            read_yaml("v: " + "[" * depth + "]" * depth, "params")
    block = "".join(f"{'  ' * level}k:\n" for level in range(MAX_DEPTH)) + "  " * MAX_DEPTH + "v: 1\n"
    with pytest.raises(ConfigError, match="nested more than"):
        read_yaml(block, "params")

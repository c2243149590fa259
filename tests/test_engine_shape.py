"""The training engine stays readable: no function in `prefshift.engine` grows past 80 lines.

The loop was once one 178-line function mixing the step, logging, drift and checkpoints; it is
now phases (`_Loop.batch`, `optimizer_step`, `checkpoint_if_due`, ...). This keeps it that way.
"""

import ast
from pathlib import Path

import prefshift.engine

LIMIT = 80


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_no_engine_function_is_longer_than_the_limit():
    root = Path(prefshift.engine.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert any(f.name == "train.py" for f in files)
    long = [
        f"{f.relative_to(root)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for f in files
        for fn in _functions(f)
        if fn.end_lineno - fn.lineno + 1 > LIMIT
    ]
    assert not long, f"split these into phases of at most {LIMIT} lines: {long}"


def test_the_limit_is_measured_the_way_the_test_reads_it(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * LIMIT + "\n\ndef g():\n    return 1\n")
    lengths = {fn.name: fn.end_lineno - fn.lineno + 1 for fn in _functions(source)}
    assert lengths == {"f": LIMIT + 1, "g": 2}

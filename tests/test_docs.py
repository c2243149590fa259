"""The README stays a front page whose links work, and the docs site's strict build catches rot.

`make test` builds the site with `scripts/check_docs.sh`; these tests check that the README (which
that build does not read as a page) is short, that its relative links and anchors resolve, that
every repository file the README and the pages name exists, that the benchmark block `prefshift
bench --readme README.md` rewrites is still the one the Performance page includes, and that the
check really fails on a broken link (mkdocs' `-q` once hid that).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from prefshift.bench.readme import END, START, update_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 260
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SNIPPET_START = "<!-- --8<-- [start:bench-numbers] -->"
SNIPPET_END = "<!-- --8<-- [end:bench-numbers] -->"
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:src|tests|bench|scripts|configs|\.ci)/[\w./-]*\w|test_\w+\.py|\w+_support\.py)"
)
"""A file of the repository as the docs name it: a path under a source folder, or a test module
or test helper by its bare name (which lives in tests/). A URL's path is not one (`/` before it)."""


def _prose(markdown: str) -> str:
    """The text outside fenced code blocks, where a `[x](y)` is a link and not code."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub and the site's toc both write it: lower case, words joined by -."""
    text = unicodedata.normalize("NFKD", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.strip().replace(" ", "-")


def _anchors(markdown_file: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", _prose(markdown_file.read_text(encoding="utf-8")), re.M)
    return {_anchor(h) for h in headings}


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to a page under docs/"
    )
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make repro" in text


def test_every_relative_link_in_the_readme_resolves():
    links = LINK.findall(_prose(README.read_text(encoding="utf-8")))
    relative = [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]
    assert relative, "the README links to no page under docs/"
    broken = []
    for link in relative:
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else README
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: {path or 'README.md'} has no heading with anchor #{anchor}")
    assert not broken, "README.md has broken links:\n" + "\n".join(broken)


def test_every_repository_file_the_docs_name_exists():
    """A page that points a reader at a file that was renamed or removed sends them nowhere:
    development.md named test_sweep_cluster.py long after the sweep's tests were split."""
    named, missing = 0, []
    for page in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for path in REPO_PATH.findall(page.read_text(encoding="utf-8")):
            named += 1
            if not (ROOT / (path if "/" in path else f"tests/{path}")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert named > 50, "the pattern finds almost no file the docs name: it has stopped matching them"
    assert not missing, "the docs name files the repository does not hold:\n" + "\n".join(missing)


def test_the_bench_block_is_rewritten_inside_the_section_the_performance_page_includes(tmp_path):
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.index(SNIPPET_START) < text.index(START) < text.index(END) < text.index(SNIPPET_END)
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert '--8<-- "README.md:bench-numbers"' in performance
    copy = tmp_path / "README.md"
    copy.write_text(text, encoding="utf-8")
    result = json.loads((ROOT / "reports" / "bench.json").read_text(encoding="utf-8"))
    result["note"] = "rewritten by test_docs"
    update_readme(copy, result)
    rewritten = copy.read_text(encoding="utf-8")
    section = rewritten[rewritten.index(SNIPPET_START) : rewritten.index(SNIPPET_END)]
    assert "Note: rewritten by test_docs" in section and section.count(START) == 1


def _check_docs(config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        [str(ROOT / "scripts" / "check_docs.sh"), str(config)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_strict_docs_build_passes_and_fails_on_a_broken_link(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    site_inputs = tmp_path / "project"
    shutil.copytree(ROOT / "docs", site_inputs / "docs")
    shutil.copytree(ROOT / "src", site_inputs / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy2(ROOT / name, site_inputs / name)
    built = _check_docs(site_inputs / "mkdocs.yml")
    assert built.returncode == 0, built.stderr
    with (site_inputs / "docs" / "metrics.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    broken = _check_docs(site_inputs / "mkdocs.yml")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stderr

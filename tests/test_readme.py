"""README's Python examples run as written (those that need no server or Spark)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS_OUTSIDE = ("127.0.0.1", "/var/lib/", "build_session")


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if not any(s in b for s in NEEDS_OUTSIDE)]


def test_readme_has_self_contained_examples():
    assert len(_blocks()) >= 2


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.splitlines()[0][:40])
def test_readme_example_runs(block: str, tmp_path: Path, capsys):
    code = block.replace("/tmp/lake-demo", str(tmp_path / "lake-demo"))
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip(), "an example should print what it did"


def test_readme_examples_import_only_public_names():
    """Every README example imports from a part's package (``loglake.sds``), and only names in
    its ``__all__``: the README shows each part's public face, never a module path."""
    import ast
    import importlib

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("loglake") for a in node.names), block
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loglake"):
                assert node.module.count(".") == 1, f"not a part's package: {node.module}"
                public = importlib.import_module(node.module).__all__
                for alias in node.names:
                    assert alias.name in public, f"{node.module}.{alias.name} is not public"


def test_every_relative_link_in_the_docs_stays_inside_the_repository_and_exists():
    """README linked ../shared/DESIGN.md, which a clone of this repository does not have."""
    root = README.parent
    bad = []
    for md in [README, *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (md.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(root) or not path.exists():
                bad.append(f"{md.relative_to(root)}: {target}")
    assert bad == []


def test_readme_stays_a_short_tour():
    """The README is the first page a newcomer reads: what loglake is, the two commands, one
    example per part and where to go next. Measurement history and wire details belong on the
    documentation site, so the README has a line budget and no dated run logs."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\bissue \d+", text, flags=re.I)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)


def test_docs_read_as_reference_not_as_a_lab_notebook():
    """The pages say what loglake does and why, in its own terms: a reader cannot open an issue
    number, and a run's date or the machine's load average belongs to no reader. Measured
    figures live on docs/benchmarks.md, replaced on each measurement, with their command."""
    root = README.parent
    marks = re.compile(r"\bissue \d+|\b20\d\d-\d\d-\d\d\b|\b\d{1,2} November\b|load average", re.I)
    found = []
    for md in [README, *sorted((root / "docs").rglob("*.md"))]:
        for n, line in enumerate(md.read_text().splitlines(), 1):
            if marks.search(line):
                found.append(f"{md.relative_to(root)}:{n}: {line.strip()[:80]}")
    assert found == []


def test_source_comments_give_reasons_not_issue_numbers():
    """A comment says why in the code's own terms: "issue 16" means nothing to a reader outside
    the tracker, so the source names the reason (or a docs page) instead."""
    src = README.parent / "src" / "loglake"
    found = []
    for path in sorted([*src.rglob("*.py"), *src.rglob("*.c")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bissues? \d+", line, flags=re.I):
                found.append(f"{path.relative_to(src)}:{n}: {line.strip()[:80]}")
    assert found == []

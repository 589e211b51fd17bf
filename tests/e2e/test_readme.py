"""The README and docs stay true: the config table (docs/operations.md, "Configuration") is the one
generated from config.KEYS, and the README's two set-up commands are the scripts CI runs (the slow
profile is the same script with `-m slow`)."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import pytest

from woodpecker_idem.config import config_table_markdown

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"  # where the config table lives


def test_config_table_is_generated_from_keys() -> None:
    text = OPERATIONS.read_text()
    start = text.index("<!-- config-table:start -->") + len("<!-- config-table:start -->")
    end = text.index("<!-- config-table:end -->")
    assert text[start:end].strip() == config_table_markdown().strip(), (
        "docs/operations.md's config table is stale: paste the output of python -c 'from "
        "woodpecker_idem.config import config_table_markdown as t; print(t())' between its markers"
    )


def test_setup_commands_are_the_scripts_ci_runs() -> None:
    commands = [
        line.strip()
        for line in README.read_text().splitlines()
        if line.startswith("    ./scripts/")
    ]
    assert commands == ["./scripts/demo", "./scripts/test", "./scripts/test -m slow"]
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n") + len(heading) + 1
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def test_the_readme_quotes_each_figure_once_with_its_run() -> None:
    """Issue 32 item 6: one table of figures, each row linking to the run and the command behind
    it in benches/README.md (the link test below checks that the section exists), each figure one
    number: the spread between runs and their history belong in benches/README.md."""
    text = README.read_text()
    table = [
        line
        for line in _section(text, "## What to expect: latency and throughput").splitlines()
        if line.startswith("| ") and not line.startswith("| call |")
    ]
    assert len(table) >= 5, "the figures table is missing"
    for row in table:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert len(cells) == 3, f"not a row of call | figure | run: {row}"
        _call, figure, run = cells
        assert "](benches/README.md#" in run, f"no link to its run: {row}"
        assert not re.search(r"\d\s?[-–]\s?\d", figure), f"a range, not a figure: {row}"


def test_the_readme_stays_a_guide() -> None:
    """The README is read as a guide (what it is, how to start, what to expect, where to read
    more); reference material goes to docs/ (issue 32 item 6: it had grown to 6,700 words)."""
    words = len(README.read_text().split())
    assert words <= 2500, f"README.md has {words} words; move reference material to docs/"


# --- links: every relative link in the README and docs/ resolves inside the repository --------

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MENTION = re.compile(r"`([\w./-]+\.md)(?:#[\w-]+)?`")  # a file named in backticks, e.g. `x.md`


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def _links(doc: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    for target in _links(doc):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        assert dest.is_relative_to(ROOT), f"{doc.name}: {target} points outside the repository"
        assert dest.exists(), f"{doc.name}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(dest), f"{doc.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_markdown_file_named_exists(doc: Path) -> None:
    """A doc that names `SOMETHING.md` (the README once sent users to a design document that is not
    in the repository) names a file that is here, relative to the doc or to the repository root."""
    for name in MENTION.findall(doc.read_text()):
        assert (doc.parent / name).exists() or (ROOT / name).exists(), f"{doc.name}: {name}"


def test_readme_links_to_the_semantics() -> None:
    assert "docs/semantics.md" in _links(README)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_error_named_in_the_docs_is_importable(doc: Path) -> None:
    import woodpecker_idem as wp

    builtin = set(dir(builtins))  # OSError, TypeError, ...
    for name in set(re.findall(r"`(\w+Error)`", doc.read_text())) - builtin:
        cls = getattr(wp, name, None)
        assert isinstance(cls, type) and issubclass(cls, wp.WoodpeckerError), f"{doc.name}: {name}"

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
    assert text[start:end].strip() == config_table_markdown().strip()


def test_setup_commands_are_the_scripts_ci_runs() -> None:
    commands = [
        line.strip()
        for line in README.read_text().splitlines()
        if line.startswith("    ./scripts/")
    ]
    assert commands == ["./scripts/demo", "./scripts/test", "./scripts/test -m slow"]
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text()


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

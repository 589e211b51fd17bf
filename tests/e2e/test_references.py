"""Every file a source file or doc names is in the repository: comments and docs once cited a
design document users do not have ("<DOC>.md section N"), and module paths go stale when files
move. A name counts when it looks like a file (`name.md`, `dir/name.py`, ...) and is found
relative to the citing file, its package, or one of the repository's roots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "woodpecker_idem"
# where a bare or partial path is looked up besides the citing file's own folder
BASES = [
    ROOT,
    ROOT / "python",
    PACKAGE,
    ROOT / "rust" / "src",
    ROOT / "rust" / "src" / "py",
    ROOT / "tests",
    ROOT / "tests" / "support",
    ROOT / "docs",
    ROOT / "scripts",
]
NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:md|py|pyi|rs|proto|toml))(?![\w(])")
# names of files not in the repository on purpose (written at run time, or the user's)
ELSEWHERE = {
    "wp_bench_naive_snapshot.proto",  # written by benches/bench_core.py at run time
    "user_code.py",  # written by tests/e2e/test_typing.py at run time
    "test_probe.py",  # written by tests/e2e/test_harness.py at run time
    "job.py",  # the user's own Spark job in docs/operations.md's spark-submit example
}
# files whose text names missing files on purpose (the self-tests of these rules)
EXAMPLES = {"tests/e2e/test_references.py", "tests/e2e/test_readme.py"}
SOURCES = sorted(
    p
    for pattern in ("*.py", "*.pyi", "*.rs", "*.md", "*.proto")
    for p in ROOT.rglob(pattern)
    if p.relative_to(ROOT).as_posix() not in EXAMPLES
    and not any(
        part.startswith(".") or part in ("target", "_proto", "dist")
        for part in p.relative_to(ROOT).parts
    )
)


def _exists(source: Path, name: str) -> bool:
    if name in ELSEWHERE:
        return True
    candidates = [source.parent / name, *(base / name for base in BASES)]
    return any(c.exists() for c in candidates) or any(PACKAGE.rglob(name))


def missing(source: Path) -> list[str]:
    text = source.read_text(encoding="utf-8", errors="replace")
    return sorted({n for n in NAME.findall(text) if not _exists(source, n)})


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_named_exists(source: Path) -> None:
    assert missing(source) == []


def test_the_scan_sees_names(tmp_path: Path) -> None:
    """The scan finds a stale name (a rule that sees nothing passes anything)."""
    doc = tmp_path / "x.md"
    doc.write_text("see PLAN.md section 3, client/writer.py and docs/semantics.md\n")
    assert missing(doc) == ["PLAN.md", "client/writer.py"]


def test_no_command_in_the_docs_puts_the_source_tree_first() -> None:
    """The README's set-up installs the wheel into .venv; `PYTHONPATH=python` in front of a
    command would import the source tree instead, which has no compiled core in a clone."""
    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benches").glob("*")]
    found = [str(p.relative_to(ROOT)) for p in docs if "PYTHONPATH=python " in p.read_text()]
    assert not found, found

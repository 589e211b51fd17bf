"""The README stays true: its config table is the one generated from config.KEYS, and its two
set-up commands are the scripts CI runs (the slow profile is the same script with `-m slow`)."""

from __future__ import annotations

from pathlib import Path

from woodpecker_idem.config import config_table_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_config_table_is_generated_from_keys() -> None:
    text = README.read_text()
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

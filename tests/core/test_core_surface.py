"""The extension's face to Python: the error classes it raises and the version it reports."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import woodpecker_idem
from woodpecker_idem import _core, errors

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("call", "cls", "builtin"),
    [
        (lambda: _core.explicit_key(b""), errors.InvalidArgumentError, ValueError),
        (lambda: _core.content_key("text"), errors.InvalidTypeError, TypeError),
        (lambda: _core.decode_snapshot(b"nope"), errors.SnapshotCorruptError, Exception),
    ],
)
def test_rust_raises_the_package_classes(call, cls, builtin) -> None:
    """Rust raises the very classes of `woodpecker_idem.errors` (callers catch those, or the
    builtin they extend), not look-alikes."""
    with pytest.raises(cls) as info:
        call()
    assert type(info.value) is cls
    assert isinstance(info.value, builtin)
    assert isinstance(info.value, errors.WoodpeckerError)


def test_version_comes_from_cargo() -> None:
    """One version, written in Cargo.toml: the extension, the package and the installed
    distribution's metadata all report it."""
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
    assert _core.__version__ == cargo
    assert woodpecker_idem.__version__ == cargo
    assert importlib.metadata.version("woodpecker-idem") == cargo
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]

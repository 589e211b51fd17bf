"""The extension's face to Python: the error classes it raises and the version it reports."""

from __future__ import annotations

import pytest

from woodpecker_idem import _core, errors


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

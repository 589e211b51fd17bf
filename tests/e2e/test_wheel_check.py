"""The manylinux2014 check of scripts/wheel (issue 22 item 6): tags and glibc symbol versions.
Cheap: it builds nothing; `./scripts/wheel` builds the wheel and runs the same check on it."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

import woodpecker_idem._core as core

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wheel_check.py"
spec = importlib.util.spec_from_file_location("wheel_check", SCRIPT)
assert spec is not None and spec.loader is not None
wheel_check = importlib.util.module_from_spec(spec)
sys.modules["wheel_check"] = wheel_check
spec.loader.exec_module(wheel_check)

EXTENSION = Path(core.__file__).read_bytes()


def make_wheel(path: Path, platform: str, so: bytes | None = None) -> str:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(
            "woodpecker_idem-0.1.0.dist-info/WHEEL",
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
            f"Tag: cp311-abi3-{platform}\n",
        )
        if so is not None:
            wheel.writestr("woodpecker_idem/_core.abi3.so", so)
    return str(path)


@pytest.mark.parametrize(
    ("platform", "glibc"),
    [
        ("manylinux2014_x86_64", (2, 17)),
        ("manylinux_2_17_aarch64", (2, 17)),
        ("manylinux_2_34_x86_64", (2, 34)),
        ("manylinux1_x86_64", (2, 5)),
        ("linux_x86_64", None),
    ],
)
def test_platform_tags(platform: str, glibc: tuple[int, int] | None) -> None:
    assert wheel_check.tag_glibc(platform) == glibc


def test_the_extension_s_glibc_versions_are_read_from_its_elf() -> None:
    versions = wheel_check.glibc_versions(EXTENSION)
    assert versions and all(v[0] == 2 for v in versions)
    with pytest.raises(ValueError, match="not a 64-bit"):
        wheel_check.glibc_versions(b"#!/bin/sh\n")


def test_a_newer_tag_is_refused(tmp_path: Path) -> None:
    path = make_wheel(tmp_path / "a.whl", "manylinux_2_34_x86_64")
    assert wheel_check.check(path) == [
        "platform tag manylinux_2_34_x86_64: needs glibc 2.34, more than manylinux2014's 2.17"
    ]
    both = make_wheel(tmp_path / "b.whl", "manylinux_2_17_x86_64.manylinux2014_x86_64")
    assert wheel_check.check(both) == []
    assert wheel_check.main([both]) == 0 and wheel_check.main([path]) == 1


def test_a_manylinux2014_tag_over_newer_symbols_is_refused(tmp_path: Path) -> None:
    """A tag is only a name: the shared objects' symbol versions decide."""
    path = make_wheel(tmp_path / "c.whl", "manylinux2014_x86_64", EXTENSION)
    newer = [v for v in wheel_check.glibc_versions(EXTENSION) if v[:2] > (2, 17)]
    problems = wheel_check.check(path)
    if newer:  # this extension was built against the host's glibc (scripts/setup.sh)
        assert len(problems) == 1 and "woodpecker_idem/_core.abi3.so: needs GLIBC_" in problems[0]
    else:  # built by scripts/wheel
        assert problems == []

"""Check that a wheel installs on the hosts Spark runs on: its platform tags are manylinux2014
(glibc 2.17) or older, and no shared object in it needs a glibc symbol newer than 2.17.

    python scripts/wheel_check.py dist-manylinux/woodpecker_idem-*.whl

Exit status 0 when it passes; otherwise each problem on stderr and status 1. The symbol check
reads the ELF version-needs section itself (no binutils needed), because a wheel can carry a
manylinux2014 tag and still need a newer glibc (a tag is only a name).
"""

from __future__ import annotations

import re
import struct
import sys
import zipfile

MAX_GLIBC = (2, 17)  # manylinux2014: CentOS 7; also Amazon Linux 2, EMR 6, Ubuntu 18.04+, RHEL 7+
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
SHT_GNU_VERNEED = 0x6FFFFFFE


def tag_glibc(platform: str) -> tuple[int, int] | None:
    """The glibc a platform tag promises (None: not a manylinux tag)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", platform)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_\w+", platform)
    return _LEGACY[m.group(1)] if m else None


def wheel_platforms(wheel: zipfile.ZipFile) -> list[str]:
    """The platform part of every `Tag:` line of the wheel's WHEEL file."""
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/WHEEL"))
    tags = [
        line.split(":", 1)[1].strip()
        for line in wheel.read(name).decode().splitlines()
        if line.startswith("Tag:")
    ]
    return [platform for tag in tags for platform in tag.split("-")[2].split(".")]


def glibc_versions(elf: bytes) -> set[tuple[int, ...]]:
    """The GLIBC_x.y[.z] versions a 64-bit little-endian ELF object needs."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF object")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    out: set[tuple[int, ...]] = set()
    for _name, kind, _flags, _addr, offset, _size, link, info, _align, _entsize in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][4]
        pos = offset
        for _ in range(info):  # Verneed entries
            _version, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", elf, pos)
            apos = pos + aux
            for _ in range(cnt):  # Vernaux entries
                _hash, _flags2, _other, vname, anext = struct.unpack_from("<IHHII", elf, apos)
                end = elf.index(b"\0", strtab + vname)
                text = elf[strtab + vname : end].decode()
                if text.startswith("GLIBC_") and re.fullmatch(r"GLIBC_[\d.]+", text):
                    out.add(tuple(int(p) for p in text[6:].split(".")))
                apos += anext
            pos += nxt
    return out


def check(path: str) -> list[str]:
    """Every reason the wheel at `path` is not installable on a glibc 2.17 host."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as wheel:
        platforms = wheel_platforms(wheel)
        for platform in platforms:
            promised = tag_glibc(platform)
            if promised is None:
                problems.append(f"platform tag {platform}: not a manylinux tag")
            elif promised > MAX_GLIBC:
                problems.append(
                    f"platform tag {platform}: needs glibc {promised[0]}.{promised[1]}, "
                    f"more than manylinux2014's 2.17"
                )
        for name in wheel.namelist():
            if not re.search(r"\.so(\.|$)", name):
                continue
            needed = glibc_versions(wheel.read(name))
            newer = sorted(v for v in needed if v[:2] > MAX_GLIBC)
            if newer:
                shown = ", ".join("GLIBC_" + ".".join(map(str, v)) for v in newer)
                problems.append(f"{name}: needs {shown} (manylinux2014 allows up to GLIBC_2.17)")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: wheel_check.py WHEEL", file=sys.stderr)
        return 2
    problems = check(argv[0])
    for problem in problems:
        print(f"wheel_check: {problem}", file=sys.stderr)
    if not problems:
        print(f"wheel_check: {argv[0]}: manylinux2014 tags, glibc symbols <= 2.17")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

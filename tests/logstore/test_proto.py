"""proto/logstore.proto covers the whole transport, and the generated code is the proto's.

- The `LogStore` service has one RPC per abstract per-node call of `LogStoreTransport`, named as
  the method in CamelCase, and no other RPC but those designed ahead of a transport method
  (`AHEAD`); each method's parameters (past `node_id`) are fields of its RPC's request.
- The checked-in modules in python/woodpecker_idem/_proto/ (with their stubs) are what
  `scripts/protos` (the one documented command) generates from proto/ now, byte for byte, and
  they need no protobuf runtime newer than the floor of pyproject's `protobuf` dependency.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tomllib
from abc import abstractmethod
from pathlib import Path

from woodpecker_idem._proto import logstore_pb2
from woodpecker_idem.logstore.transport import LogStoreTransport

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "python" / "woodpecker_idem" / "_proto"

# Abstract members of the transport that are no call to a node, so no RPC (with the reason).
NOT_A_CALL = {"node_ids": "the node directory (the metadata store's registry in service mode)"}
# RPCs designed before any transport has the call (with the reason); adding the method to
# `LogStoreTransport` means taking it off this list.
AHEAD: dict[str, str] = {}


def rpc_name(method: str) -> str:
    """The documented mapping (proto/logstore.proto): `completed_end` -> `CompletedEnd`."""
    return "".join(part.capitalize() for part in method.split("_"))


def _service():
    return logstore_pb2.DESCRIPTOR.services_by_name["LogStore"]


def drift(transport: type[LogStoreTransport], rpc_names: set[str]) -> list[str]:
    """How the transport's abstract calls and the service's RPCs disagree (empty: they agree)."""
    calls = {rpc_name(c): c for c in transport.__abstractmethods__ - NOT_A_CALL.keys()}
    out = [f"{c}: no RPC {r}" for r, c in sorted(calls.items()) if r not in rpc_names]
    out += [f"RPC {r}: no transport call" for r in sorted(rpc_names - calls.keys() - AHEAD.keys())]
    out += [f"RPC {r}: built, take it off AHEAD" for r in sorted(AHEAD.keys() & calls.keys())]
    out += [f"RPC {r}: in AHEAD, not in the proto" for r in sorted(AHEAD.keys() - rpc_names)]
    return out


def test_every_transport_call_has_an_rpc_and_every_rpc_a_call() -> None:
    assert drift(LogStoreTransport, {m.name for m in _service().methods}) == []
    assert NOT_A_CALL.keys() <= LogStoreTransport.__abstractmethods__


def test_the_drift_check_sees_a_call_or_an_rpc_too_many() -> None:
    rpcs = {m.name for m in _service().methods}

    class Wider(LogStoreTransport):
        @abstractmethod
        def purge_node(self, node_id: str) -> None: ...

    assert drift(Wider, rpcs) == ["purge_node: no RPC PurgeNode"]
    assert drift(LogStoreTransport, rpcs - {"DeleteLog"}) == ["delete_log: no RPC DeleteLog"]
    assert drift(LogStoreTransport, rpcs | {"Compact"}) == ["RPC Compact: no transport call"]
    assert drift(LogStoreTransport, rpcs - {"SealSegment"}) == ["seal_segment: no RPC SealSegment"]


def test_each_calls_parameters_are_fields_of_its_request() -> None:
    methods = {m.name: m for m in _service().methods}
    for call in sorted(LogStoreTransport.__abstractmethods__ - NOT_A_CALL.keys()):
        params = list(inspect.signature(getattr(LogStoreTransport, call)).parameters)
        assert params[:2] == ["self", "node_id"], call  # one node per call: the channel's
        fields = {f.name for f in methods[rpc_name(call)].input_type.fields}
        assert sorted(set(params[2:]) - fields) == [], call


def _generate(out: Path) -> None:
    """Run the documented command into `out` with this interpreter's grpcio-tools (the `test`
    extra pins it; without it the test fails here, naming the missing package)."""
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "protos"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (
        "scripts/protos failed (grpcio-tools is in the `test` extra of pyproject.toml):\n"
        + run.stdout
        + run.stderr
    )


def test_the_checked_in_generated_code_is_fresh(tmp_path: Path) -> None:
    _generate(tmp_path)
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == [
        "logstore_pb2.py",
        "logstore_pb2.pyi",
        "meta_pb2.py",
        "meta_pb2.pyi",
    ]
    stale = [
        name for name in made if (tmp_path / name).read_bytes() != (GENERATED / name).read_bytes()
    ]
    assert stale == [], f"run scripts/protos and commit: {stale} differ from proto/"
    checked_in = sorted(p.name for p in GENERATED.glob("*_pb2.*"))
    assert checked_in == made  # no generated file left behind for a proto that is gone


def test_the_freshness_check_sees_an_edited_proto(tmp_path: Path) -> None:
    """The comparison above can fail: a proto with one more field generates other code."""
    protos = tmp_path / "proto"
    protos.mkdir()
    text = (ROOT / "proto/logstore.proto").read_text(encoding="utf-8")
    edited = text.replace("int64 log_id = 1; }", "int64 log_id = 1; int64 epoch = 2; }", 1)
    assert edited != text
    (protos / Path("proto/logstore.proto").name).write_text(edited, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(
        [
            *(sys.executable, "-m", "grpc_tools.protoc", f"-I{protos}"),
            *(
                f"--python_out={out}",
                f"--pyi_out={out}",
                str(protos / Path("proto/logstore.proto").name),
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert (out / "logstore_pb2.py").read_bytes() != (GENERATED / "logstore_pb2.py").read_bytes()


def _floor(spec: str) -> tuple[int, ...]:
    found = re.search(r">=\s*([0-9.]+)", spec)
    assert found, spec
    return tuple(int(x) for x in found.group(1).split("."))


def test_the_generated_code_runs_on_the_oldest_protobuf_the_package_allows() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (spec,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("protobuf")]
    for name in ("logstore_pb2.py", "meta_pb2.py"):
        text = (GENERATED / name).read_text(encoding="utf-8")
        got = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*"
            r"(\d+),\s*(\d+),",
            text,
        )
        assert got, name
        needs = tuple(int(x) for x in got.groups())
        assert needs <= _floor(spec), (name, needs, spec)
        assert needs[0] == _floor(spec)[0], (name, needs, spec)  # same major: the `<8` pin

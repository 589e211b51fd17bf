"""The package's layering (docs/architecture.md): dependencies point down the rooms (`client/`
imports neither the composition root `connect.py` nor the writer pipeline above it, the stores
import no `client/`); the write pipeline (`writer/`) calls its dedup stage one way: `writer/`
imports nothing of `idempotency/`, and `idempotency/` imports of `writer/` only the protocol
(`writer/dedup.py`); no module touches another object's private names (the pipeline's parts use
its public names); the Pipeline implements each part's view of it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem.writer.dedup import Dedup, NoDedup

PACKAGE = Path(wp.__file__).parent


def _private_reach(path: Path) -> list[str]:
    """`x._name` where x is not `self`: a private name of another object."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "idempotency").glob("*.py")))
def test_the_idempotent_layer_touches_no_private_name_of_another_object(name: str) -> None:
    assert _private_reach(PACKAGE / "idempotency" / name) == []


def _runtime_imports(path: Path) -> list[tuple[str, str]]:
    """(enclosing function or '', module) of every import not under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                out.append((func, "." * child.level + (child.module or "")))
            elif isinstance(child, ast.Import):
                out.extend((func, a.name) for a in child.names)
            name = child.name if isinstance(child, ast.FunctionDef) else func
            visit(child, name)

    visit(tree, "")
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "client").glob("*.py")))
def test_the_client_package_does_not_import_the_idempotent_layer(name: str) -> None:
    """Not even `connect`: the composition root (`woodpecker_idem/connect.py`) wires it in."""
    bad = [
        (func, module)
        for func, module in _runtime_imports(PACKAGE / "client" / name)
        if "idempotency" in module
    ]
    assert bad == []


# docs/architecture.md: dependencies point one way. Each room imports only rooms of a lower layer
# (the modules at the bottom, `errors`, `types`, `_core`, ..., are below all of these).
LAYERS: list[set[str]] = [
    {"objectstore", "meta"},  # beside each other: neither imports the other
    {"logstore"},
    {"ensemble"},  # one per client: nodes found, placed, reached (senders) and read
    {"client"},
    {"writer"},
    {"idempotency"},
    # the history checker and the fault injector: they read the nodes and the metadata store
    # (logstore/, meta/) and take a client or a log as a plain object, so the composition root
    # and everything above it (the Spark demo pipeline, the CLI demo) may use them
    {"testing"},
    # the composition root (config -> stores -> transport -> client), and the processor (a named
    # reader of one log feeding an idempotent writer of another): each composes the layers
    # below, neither imports the other
    {"connect", "processor"},
    {"spark"},
    {"cli"},
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _room_imports(path: Path) -> list[str]:
    """The rooms (first part of a module's name under the package: `client`, `connect`, ...) that
    `path` imports at run time; `from .. import connect` counts as the module `connect`."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    here = list(rel[:-1])  # the package the module is in (an __init__ is in its own)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[list[str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
                found.extend(n.split(".")[1:] for n in names if n.startswith("woodpecker_idem"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - child.level + 1]
                elif (child.module or "").startswith("woodpecker_idem"):
                    base = []
                else:
                    visit(child)
                    continue
                parts = [p for p in (child.module or "").split(".") if p]
                if not child.level:
                    parts = parts[1:]
                target = base + parts
                if target:
                    found.append(target)
                else:  # `from <package root> import name`: a module if one has that name
                    for a in child.names:
                        module = PACKAGE / a.name
                        if module.is_dir() or module.with_suffix(".py").exists():
                            found.append([a.name])
            visit(child)

    visit(tree)
    return [t[0] for t in found if t]


MODULES = sorted(
    p.relative_to(PACKAGE).as_posix()
    for p in PACKAGE.rglob("*.py")
    if "_proto" not in p.parts  # generated by protoc
)


# `x._name` on an object other than self/cls, allowed anyway (each with its reason):
NAMEDTUPLE_API = {"_asdict", "_field_defaults", "_fields", "_make", "_replace"}  # public API,
# underscored by namedtuple so as not to clash with field names (`LogMessageId._fields`)
SAME_CLASS = {  # a class's own private state, on another instance of that class
    ("config.py", "other._values"): "Config.__eq__ compares with another Config",
    ("objectstore/s3.py", "child._bucket_ready"): (
        "S3ObjectStore.child() hands its probe result to the S3ObjectStore it just built"
    ),
}


def _private_uses(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every `x._name` (or `getattr(x, "_name")`) where `x` is not
    `self`, `cls` or `super()`: a private name of another object."""

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    def own(value: ast.expr) -> bool:
        if isinstance(value, ast.Name):
            return value.id in ("self", "cls")
        return (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        )

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and private(node.attr) and not own(node.value):
            if node.attr not in NAMEDTUPLE_API:
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and not own(node.args[0])
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_no_module_touches_another_objects_private_names(name: str) -> None:
    """A class touches only its own private names: the writer's parts (flusher, node workers,
    dispatch, completion, roll) go through the public names of its core interface."""
    source = (PACKAGE / name).read_text(encoding="utf-8")
    bad = [
        f"{name}:{line}: {expr}"
        for line, expr in _private_uses(source)
        if (name, expr) not in SAME_CLASS
    ]
    assert bad == []


def test_the_private_name_rule_sees_reaches() -> None:
    """What the scan flags and what it lets through (a rule that sees nothing passes anything)."""
    flagged = _private_uses(
        "w._lock\nself.writer._segments\ngetattr(w, '_hooks')\nw.__secret\n"
        "self._lock\ncls._made\nsuper()._invoke_callbacks()\nLogMessageId._fields\nw.__name__\n"
    )
    assert [expr for _, expr in flagged] == [
        "w._lock",
        "self.writer._segments",
        "getattr(w, '_hooks')",
        "w.__secret",
    ]
    assert all(expr in (PACKAGE / name).read_text() for name, expr in SAME_CLASS)  # not stale


@pytest.mark.parametrize("name", MODULES)
def test_dependencies_point_down_the_layers(name: str) -> None:
    """`client/` does not import the composition root or the idempotent layer, the stores do not
    import `client/`, and so on: no import cycle between the rooms of docs/architecture.md."""
    room = Path(name).parts[0].removesuffix(".py")
    if room not in LAYER_OF:
        return  # the bottom modules and the package root
    bad = [
        r
        for r in _room_imports(PACKAGE / name)
        if r in LAYER_OF and r != room and LAYER_OF[r] >= LAYER_OF[room]
    ]
    assert bad == [], f"{name} imports {bad}: a room of its own layer or above"


def test_the_layer_rule_sees_imports() -> None:
    """The scan finds what it looks for (a rule that sees nothing would pass anything)."""
    assert {"client", "idempotency", "objectstore"} <= set(_room_imports(PACKAGE / "connect.py"))
    assert "objectstore" in _room_imports(PACKAGE / "logstore" / "storage.py")
    assert "connect" in _room_imports(PACKAGE / "cli" / "common.py")
    assert "meta" in _room_imports(PACKAGE / "testing" / "history" / "store.py")
    assert "logstore" in _room_imports(PACKAGE / "testing" / "faults.py")
    assert "testing" in _room_imports(PACKAGE / "spark" / "orders_job.py")


def test_the_checkers_read_needs_no_engine() -> None:
    """It reads the nodes through a `RawSource` (a transport's `raw_read`), so it judges logs
    whose nodes are other processes: nothing of `logstore/` is imported for it."""
    assert "logstore" not in _room_imports(PACKAGE / "testing" / "history" / "store.py")


def _imports_of(path: Path) -> list[str]:
    """Every module `path` imports (TYPE_CHECKING ones too), as dotted names under the package."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    here = list(rel[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                parts = base + [p for p in (node.module or "").split(".") if p]
            elif (node.module or "").startswith("woodpecker_idem"):
                parts = (node.module or "").split(".")[1:]
            else:
                continue
            if not node.module:  # `from . import x`
                out.extend(".".join([*parts, a.name]) for a in node.names)
            else:
                out.append(".".join(parts))
        elif isinstance(node, ast.Import):
            out.extend(
                a.name.split(".", 1)[1] for a in node.names if a.name.startswith("woodpecker_idem.")
            )
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "writer").glob("*.py")))
def test_the_pipeline_imports_nothing_of_the_dedup_state(name: str) -> None:
    """Not even for typing: the pipeline knows its stage only as the `Dedup` protocol."""
    bad = [m for m in _imports_of(PACKAGE / "writer" / name) if m.startswith("idempotency")]
    assert bad == []


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "writer").glob("*.py")))
def test_the_pipeline_imports_nothing_of_the_client(name: str) -> None:
    """Not even for typing: a writer is given a `LogContext` (ensemble/), not the client or
    its log handle, so client -> writer is no cycle."""
    bad = [m for m in _imports_of(PACKAGE / "writer" / name) if m.startswith("client")]
    assert bad == []


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "ensemble").glob("*.py")))
def test_the_ensemble_layer_imports_nothing_of_writers_or_clients(name: str) -> None:
    """Not even for typing: writers and readers use the ensemble, never the reverse."""
    bad = [
        m
        for m in _imports_of(PACKAGE / "ensemble" / name)
        if m.startswith(("writer", "client", "idempotency", "connect"))
    ]
    assert bad == []


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "idempotency").glob("*.py")))
def test_the_dedup_state_imports_only_the_protocol_of_the_pipeline(name: str) -> None:
    bad = [
        m
        for m in _imports_of(PACKAGE / "idempotency" / name)
        if m.startswith("writer") and m != "writer.dedup"
    ]
    assert bad == []


def test_the_import_scan_sees_imports() -> None:
    assert "writer.dedup" in _imports_of(PACKAGE / "idempotency" / "stage.py")
    assert "ensemble" in _imports_of(PACKAGE / "writer" / "api.py")  # for typing: seen too
    assert "client.client" in _imports_of(PACKAGE / "connect.py")
    assert "writer.dedup" in _imports_of(PACKAGE / "writer" / "pipeline.py")
    assert "idempotency.stage" in _imports_of(PACKAGE / "connect.py")


def test_both_stages_implement_the_dedup_protocol(tmp_path: Path) -> None:
    client = wp.connect(tmp_path, {"quorum.es": 1})
    log = client.open_log("stages", create=True)
    idem = log.open_writer(idempotent=True)
    stages = [NoDedup(), idem._stage]
    for stage in stages:
        for method in Dedup.__dict__:
            if not method.startswith("_"):
                assert hasattr(stage, method), (stage, method)
    assert not hasattr(idem, "core") and not isinstance(idem, wp.LogWriter)
    r = idem.write(b"x", idempotency_id="k", timeout=5)
    assert idem.write(b"x", idempotency_id="k", timeout=5) == wp.WriteResult(r.message_id, True)
    idem.close()
    client.close()


def test_the_pipeline_implements_the_view_of_each_part(tmp_path: Path) -> None:
    """Each part of the pipeline names what it uses of it in a protocol (its whole view of the
    pipeline); the Pipeline has every member (mypy checks the types where the parts are built)."""
    from woodpecker_idem.writer.completion import CompletionView
    from woodpecker_idem.writer.lifecycle import TickerView
    from woodpecker_idem.writer.segments import RollView
    from woodpecker_idem.writer.sender import SenderView

    client = wp.connect(tmp_path, {"quorum.es": 1})
    writer = client.open_log("core", create=True).open_writer()
    pipeline = writer._pipeline
    for protocol in (CompletionView, TickerView, RollView, SenderView):
        members = {
            name
            for klass in protocol.__mro__
            if klass.__module__.startswith("woodpecker_idem")
            for name in (*klass.__dict__, *inspect.get_annotations(klass))
            if not name.startswith("_")
        }
        assert members, protocol
        missing = [name for name in sorted(members) if not hasattr(pipeline, name)]
        assert missing == [], (protocol.__name__, missing)
    writer.close()
    client.close()

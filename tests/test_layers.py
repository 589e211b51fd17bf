"""The write path's layering (issue 12 item 1): the idempotent layer composes the writer core
through its hooks and layer API, and the client package does not import the layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem.client.hooks import NoHooks, WriterHooks

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
    """Only the composition root (`connect`, which wires the idempotent writer in) may."""
    bad = [
        (func, module)
        for func, module in _runtime_imports(PACKAGE / "client" / name)
        if "idempotency" in module and func != "connect"
    ]
    assert bad == []


def test_both_writers_implement_the_hook_protocol(tmp_path: Path) -> None:
    client = wp.connect(tmp_path, {"quorum.es": 1})
    log = client.open_log("hooks", create=True)
    idem = log.open_writer(idempotent=True)
    hooks: list[WriterHooks] = [NoHooks(), idem]
    for h in hooks:
        for method in WriterHooks.__dict__:
            if not method.startswith("_"):
                assert callable(getattr(h, method)), (h, method)
    assert idem.core.lock is not None and not isinstance(idem, wp.LogWriter)
    r = idem.write(b"x", idempotency_id="k", timeout=5)
    assert idem.write(b"x", idempotency_id="k", timeout=5) == wp.WriteResult(r.message_id, True)
    idem.close()
    client.close()

"""Nested etcd prefixes (issue 20 item 4): a deployment whose prefix lies inside another's key
families (`/x` and `/x/logs`, `/x/segments/<id>`) must never read or delete the other's keys,
and every error, even for a record that is not one, is a `WoodpeckerError`."""

from __future__ import annotations

from typing import Any

import pytest

import woodpecker_idem as wp
from woodpecker_idem.errors import CorruptEntryError, InvalidArgumentError
from woodpecker_idem.meta import SegmentMeta, open_metadata_store
from woodpecker_idem.meta.etcd_client import put
from woodpecker_idem.types import SegmentState

NOW = 1_700_000_000_000


def _open(server: Any, prefix: str) -> Any:
    return open_metadata_store("etcd", endpoints=[server.endpoint], prefix=prefix)


def _fill(store: Any, name: str) -> int:
    """A log with a writer and two segments."""
    log_id = store.create_log(name, NOW).log_id
    epoch = store.take_over(log_id, f"{name}-writer", NOW, 30_000)
    for seg in (0, 1):
        store.create_segment(
            epoch, SegmentMeta(log_id, seg, SegmentState.ACTIVE, ("node-0",), 1, 1, 1, NOW)
        )
    return log_id


def test_nested_prefixes_keep_apart(etcd_server: Any, etcd_prefix: str) -> None:
    outer = _open(etcd_server, etcd_prefix)
    inner = [
        _open(etcd_server, f"{etcd_prefix}/logs"),
        _open(etcd_server, f"{etcd_prefix}/segments/{1:020d}"),
        _open(etcd_server, f"{etcd_prefix}/names"),
    ]
    try:
        for i, store in enumerate(inner):
            _fill(store, f"inner-{i}")
        a = _fill(outer, "outer")
        assert a == 1  # its segments' range is where the second inner prefix lives

        # the outer store reads only its own keys (a raw DecodeError before)
        assert [m.name for m in outer.list_logs()] == ["outer"]
        assert [s.segment_id for s in outer.list_segments(a)] == [0, 1]
        assert outer.get_log("outer").writer_epoch == 1
        for i, store in enumerate(inner):
            assert [m.name for m in store.list_logs()] == [f"inner-{i}"]
            assert len({store.store_id(), outer.store_id()}) == 2

        # deleting the outer log deletes nothing of theirs (all of /x/segments/1... before)
        outer.delete_log("outer")
        assert outer.list_logs() == []
        for i, store in enumerate(inner):
            log = store.get_log(f"inner-{i}")
            assert [s.segment_id for s in store.list_segments(log.log_id)] == [0, 1]
            store.check_epoch(log.log_id, 1)
    finally:
        for store in [outer, *inner]:
            store.close()


def test_the_reserved_component_is_refused_in_a_prefix(
    etcd_server: Any, etcd_prefix: str, tmp_path: Any
) -> None:
    for prefix in (f"{etcd_prefix}/#", f"{etcd_prefix}/#/logs"):
        with pytest.raises(InvalidArgumentError, match="'#'"):
            _open(etcd_server, prefix)
        with pytest.raises(wp.ConfigError, match="meta.prefix"):
            wp.connect(
                tmp_path,
                {
                    "meta.type": "etcd",
                    "meta.endpoints": [etcd_server.endpoint],
                    "meta.prefix": prefix,
                },
            )
    # a '#' inside a component is no separator
    _open(etcd_server, f"{etcd_prefix}/a#b").close()


def test_a_record_that_is_not_one_is_a_woodpecker_error(etcd_server: Any, etcd_prefix: str) -> None:
    store = _open(etcd_server, etcd_prefix)
    try:
        log_id = _fill(store, "orders")
        store._txn("test", [], [put(store._k("logs", log_id), b"\xff\xfe not a record")], [])
        store._txn("test", [], [put(store._k("names", "bad"), b"seven")], [])
        for call in (
            store.list_logs,
            lambda: store.get_log("orders"),
            lambda: store.get_log("bad"),
            lambda: store.check_epoch(log_id, 1),
        ):
            with pytest.raises(CorruptEntryError, match="metadata record"):
                call()
    finally:
        store.close()


def test_keys_of_the_layout_without_the_separator_are_refused(
    etcd_server: Any, etcd_prefix: str
) -> None:
    """A prefix written by the earlier layout (`{prefix}/store_id`) is not read as empty."""
    other = _open(etcd_server, f"{etcd_prefix}-other")
    try:
        other._txn("test", [], [put(f"{etcd_prefix}/store_id", "an-old-store")], [])
    finally:
        other.close()
    with pytest.raises(wp.ConfigError, match="earlier version"):
        _open(etcd_server, etcd_prefix)

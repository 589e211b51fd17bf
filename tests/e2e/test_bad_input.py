"""Bad input is refused before anything is queued (issue 11 item 9).

Every refused call must raise a `WoodpeckerError` naming the argument, and write nothing: each test
reads the log back to prove it. A wait that ends before the ack is not a refusal: it raises our
`WriteTimeoutError` (the write is still pending, a retry joins it).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import (
    InvalidArgumentError,
    InvalidTypeError,
    PayloadTooLargeError,
    WoodpeckerError,
    WriteTimeoutError,
)
from woodpecker_idem.config import KEYS, load_config
from woodpecker_idem.testing import FaultInjectingTransport

QUIET = {
    "idempotency.snapshot_interval_s": 3600,
    "idempotency.snapshot_threshold": 10**8,
    "append.max_entry_bytes": 1024,
    "append.linger_ms": 0,
}

# Every bad value a number of seconds can take: wrong types (bool is not a number here), NaN,
# infinities, negatives.
BAD_TIMEOUTS = ["1", b"1", True, False, [1], math.nan, math.inf, -math.inf, -1, -0.001]


def payloads(log: wp.LogHandle) -> list[bytes]:
    return [m.payload for m in log.open_reader("earliest")]


@pytest.fixture
def log(tmp_path: Path, wp_connect) -> wp.LogHandle:
    return wp_connect(tmp_path, QUIET).open_log("bad", create=True)


def refused(exc: pytest.ExceptionInfo, argument: str) -> None:
    assert isinstance(exc.value, WoodpeckerError), repr(exc.value)
    assert argument in str(exc.value), f"{exc.value!r} does not name {argument!r}"


# --- write_many: every row checked before any row is queued ------------------------------------


@pytest.mark.parametrize(
    ("rows", "ids", "error", "argument"),
    [
        ([b"r0", b"r1", b"x" * 2000], None, PayloadTooLargeError, "payloads[2]"),
        ([b"r0", b"r1", "text"], None, InvalidTypeError, "payloads[2]"),
        ([b"r0", b"r1", None], None, InvalidTypeError, "payloads[2]"),
        ([b"r0", b"r1", b"x" * 2000], ["a", "b", "c"], PayloadTooLargeError, "payloads[2]"),
        ([b"r0", b"r1", b"r2"], ["a", "b", ""], InvalidArgumentError, "ids[2]"),
        ([b"r0", b"r1", b"r2"], ["a", "b", 3], InvalidTypeError, "ids[2]"),
        ([b"r0", b"r1", b"r2"], ["a", "b"], InvalidArgumentError, "ids"),
        (b"r0r1", None, InvalidTypeError, "payloads"),
    ],
)
def test_write_many_with_a_bad_row_writes_nothing(log, rows, ids, error, argument) -> None:
    with log.open_writer(idempotent=True) as writer:
        with pytest.raises(error) as exc:
            writer.write_many(rows, ids)
        refused(exc, argument)
        writer.flush(5)
        assert writer.metrics_snapshot()["pending"] == 0
    assert payloads(log) == []


@pytest.mark.parametrize("timeout", [0, *BAD_TIMEOUTS])
def test_write_many_bad_timeout_writes_nothing(log, timeout) -> None:
    with log.open_writer(idempotent=True) as writer:
        with pytest.raises(WoodpeckerError) as exc:
            writer.write_many([b"a", b"b"], timeout=timeout)
        refused(exc, "timeout")
    assert payloads(log) == []


@pytest.mark.parametrize("rows", [iter([b"a"]), (p for p in [b"a"]), 5, None])
def test_write_many_needs_sequences(log, rows) -> None:
    with log.open_writer(idempotent=True) as writer:
        with pytest.raises(InvalidTypeError, match="payloads"):
            writer.write_many(rows)
        with pytest.raises(InvalidTypeError, match="ids"):
            writer.write_many([b"a"], iter(["a"]))
    assert payloads(log) == []


# --- write / write_async arguments ---------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize(
    ("message", "kwargs", "error", "argument"),
    [
        ("text", {}, InvalidTypeError, "payload"),
        (5, {}, InvalidTypeError, "payload"),
        (None, {}, InvalidTypeError, "payload"),
        (b"x" * 2000, {}, PayloadTooLargeError, "max_entry_bytes"),
        (b"p", {"properties": [("a", "b")]}, InvalidTypeError, "properties"),
        (b"p", {"properties": "a=b"}, InvalidTypeError, "properties"),
        (b"p", {"properties": {"a": 1}}, InvalidTypeError, "properties"),
        (b"p", {"properties": {1: "a"}}, InvalidTypeError, "properties"),
        (wp.WriteMessage(b"p", properties=[1]), {}, InvalidTypeError, "properties"),
    ],
)
def test_bad_write_arguments_write_nothing(log, idempotent, message, kwargs, error, argument):
    with log.open_writer(idempotent=idempotent) as writer:
        for call in (writer.write, writer.write_async):
            with pytest.raises(error) as exc:
                call(message, **kwargs)
            refused(exc, argument)
    assert payloads(log) == []


@pytest.mark.parametrize(
    ("ident", "error"),
    [
        (5, InvalidTypeError),
        (True, InvalidTypeError),
        ("", InvalidArgumentError),
        ("x" * 1025, InvalidArgumentError),
        (b"", InvalidArgumentError),
    ],
)
def test_bad_idempotency_id_writes_nothing(log, ident, error) -> None:
    with log.open_writer(idempotent=True) as writer:
        with pytest.raises(error) as exc:
            writer.write(b"p", idempotency_id=ident)
        refused(exc, "idempotency_id")
    with log.open_writer() as plain:  # a plain writer takes no id at all
        with pytest.raises(InvalidArgumentError) as exc:
            plain.write(b"p", idempotency_id="k")
        refused(exc, "idempotency_id")
    assert payloads(log) == []


# --- write(timeout=...) ------------------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("timeout", [0, 0.0, *BAD_TIMEOUTS])
def test_write_bad_timeout_is_refused_before_queueing(log, idempotent, timeout) -> None:
    """`write(timeout=0)` used to queue the write, let it land and raise a bare TimeoutError;
    `timeout='1'` raised TypeError after the write landed."""
    with log.open_writer(idempotent=idempotent) as writer:
        kwargs = {"idempotency_id": "k"} if idempotent else {}
        with pytest.raises((InvalidArgumentError, InvalidTypeError)) as exc:
            writer.write(b"payload", timeout=timeout, **kwargs)
        refused(exc, "timeout")
    assert payloads(log) == []


@pytest.mark.parametrize("timeout", [1, 0.5, 10**6])
def test_write_good_timeouts_are_accepted(log, timeout) -> None:
    with log.open_writer(idempotent=True) as writer:
        assert not writer.write(b"p", idempotency_id=f"k{timeout}", timeout=timeout).duplicate
    assert payloads(log) == [b"p"]


def test_a_wait_that_times_out_raises_write_timeout_error_and_a_retry_joins(
    tmp_path: Path, wp_connect
) -> None:
    client = wp_connect(tmp_path, QUIET)
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    log = client.open_log("slow", create=True)
    with log.open_writer(idempotent=True) as writer:
        faults.delay("node-0", 400)
        with pytest.raises(WriteTimeoutError) as exc:
            writer.write(b"p", idempotency_id="k", timeout=0.05)
        assert type(exc.value) is WriteTimeoutError and isinstance(exc.value, TimeoutError)
        assert "still pending" in str(exc.value) and "joins" in str(exc.value)
        assert exc.value.retriable
        faults.heal_all()
        again = writer.write(b"p", idempotency_id="k", timeout=10)
        assert again.duplicate  # joined the pending entry (or found it committed)
    assert payloads(log) == [b"p"]


def test_write_many_timeout_is_one_deadline_for_the_batch(tmp_path: Path, wp_connect) -> None:
    client = wp_connect(tmp_path, QUIET)
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    log = client.open_log("slow", create=True)
    with log.open_writer(idempotent=True) as writer:
        faults.delay("node-0", 400)
        with pytest.raises(WriteTimeoutError, match="still pending"):
            writer.write_many([b"a", b"b", b"c"], timeout=0.05)
        faults.heal_all()
        result = writer.write_many([b"a", b"b", b"c"], timeout=10)
        assert list(result.duplicate) == [1, 1, 1]
    assert payloads(log) == [b"a", b"b", b"c"]


# --- flush / close / read_next timeouts --------------------------------------------------------


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
def test_flush_close_and_read_next_refuse_bad_timeouts(log, timeout) -> None:
    writer = log.open_writer(idempotent=True)
    future = writer.write_async(b"queued", idempotency_id="q")
    for call in (writer.flush, writer.close, log.open_reader().read_next):
        with pytest.raises((InvalidArgumentError, InvalidTypeError)) as exc:
            call(timeout=timeout)
        refused(exc, "timeout")
    with pytest.raises((InvalidArgumentError, InvalidTypeError)) as exc:
        log.client.close(timeout=timeout)
    refused(exc, "timeout")
    assert not writer.fenced and not log.client.closed  # refused: nothing closed
    assert future.result(10).message_id == (0, 0)
    writer.close(0)  # 0 is fine for close: do not wait
    assert payloads(log) == [b"queued"]


# --- open_writer window options ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("window_duration_s", math.nan, InvalidArgumentError),
        ("window_duration_s", math.inf, InvalidArgumentError),
        ("window_duration_s", -math.inf, InvalidArgumentError),
        ("window_duration_s", 0, InvalidArgumentError),
        ("window_duration_s", -1.5, InvalidArgumentError),
        ("window_duration_s", 10**9, InvalidArgumentError),
        ("window_duration_s", True, InvalidTypeError),
        ("window_duration_s", "60", InvalidTypeError),
        ("window_max_keys", 0, InvalidArgumentError),
        ("window_max_keys", -1, InvalidArgumentError),
        ("window_max_keys", 10**9, InvalidArgumentError),  # would preallocate 32 GB
        ("window_max_keys", 100.0, InvalidTypeError),
        ("window_max_keys", math.nan, InvalidTypeError),
        ("window_max_keys", True, InvalidTypeError),
        ("window_max_keys", "100", InvalidTypeError),
    ],
)
def test_window_options_are_checked_before_the_takeover(log, option, value, error) -> None:
    """NaN used to raise ValueError and inf OverflowError, from inside the writer's setup."""
    first = log.open_writer(idempotent=True)
    first.write(b"before", idempotency_id="before")
    with pytest.raises(error) as exc:
        log.open_writer(idempotent=True, **{option: value})
    refused(exc, option)
    assert not first.fenced  # no takeover happened: the refused call changed nothing
    first.write(b"after", idempotency_id="after")
    first.close()
    assert payloads(log) == [b"before", b"after"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"idempotent": "yes"}, "idempotent"),
        ({"idempotent": 1}, "idempotent"),
        ({"window_max_keys": 5}, "window_max_keys"),  # a plain writer has no window
    ],
)
def test_open_writer_bad_arguments(log, kwargs, argument) -> None:
    with pytest.raises(WoodpeckerError) as exc:
        log.open_writer(**kwargs)
    refused(exc, argument)


def test_open_writer_misspelt_option_is_a_type_error_at_the_call(log) -> None:
    """The window options are named parameters: a typo fails before any takeover."""
    with pytest.raises(TypeError, match="window"):
        log.open_writer(idempotent=True, window=5)  # type: ignore[call-overload]


def test_window_options_at_their_bounds_are_accepted(log) -> None:
    writer = log.open_writer(idempotent=True, window_duration_s=0.001, window_max_keys=1)
    assert writer.window.window_ms == 1 and writer.window.max_keys == 1
    writer.close()
    writer = log.open_writer(idempotent=True, window_duration_s=365 * 86_400, window_max_keys=5)
    assert writer.window.window_ms == 365 * 86_400_000
    writer.close()


# --- configuration: non-finite numbers fail at load, naming the key ----------------------------

NUMBER_KEYS = [k.name for k in KEYS if k.kind in ("number", "int", "size") and not k.choices]


@pytest.mark.parametrize("name", NUMBER_KEYS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True])
def test_config_refuses_non_finite_and_bool_numbers(name, value) -> None:
    with pytest.raises(wp.ConfigError, match=name):
        load_config(overrides={name: value}, env={})


@pytest.mark.parametrize(
    ("env_text", "yaml_text"),
    [("nan", ".nan"), ("NaN", ".NaN"), ("inf", ".inf"), ("-inf", "-.inf"), ("1e999", "1.0e+999")],
)
def test_config_refuses_non_finite_numbers_from_env_and_yaml(
    tmp_path: Path, env_text, yaml_text
) -> None:
    key = next(k for k in KEYS if k.name == "idempotency.window_duration_s")
    with pytest.raises(wp.ConfigError, match=key.env_name):
        load_config(env={key.env_name: env_text})
    path = tmp_path / "c.yaml"
    path.write_text(f"idempotency:\n  window_duration_s: {yaml_text}\n")
    with pytest.raises(wp.ConfigError, match=r"idempotency\.window_duration_s .*from file"):
        load_config(path, env={})

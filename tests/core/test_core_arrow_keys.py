"""Keys, canonical JSON and routes over Arrow data (`_core.arrow_*`, `route_keys`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
import pytest

from woodpecker_idem import InvalidArgumentError, InvalidTypeError, content_key, explicit_key
from woodpecker_idem._core import (
    arrow_canonical_json,
    arrow_content_keys,
    arrow_explicit_keys,
    arrow_first_misrouted,
    arrow_rows,
    route_keys,
)


def keys_of(ids) -> bytes:
    return b"".join(explicit_key(i) for i in ids)


# --- explicit keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "typ", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]
)
def test_integer_ids_are_their_decimal_text(typ):
    values = [0, 7, 100] + ([-12] if typ.id in (pa.int8().id, pa.int64().id) else [])
    assert arrow_explicit_keys(pa.array(values, typ)) == keys_of([str(v) for v in values])


def test_integer_extremes():
    values = [-(2**63), 2**63 - 1]
    assert arrow_explicit_keys(pa.array(values, pa.int64())) == keys_of([str(v) for v in values])
    assert arrow_explicit_keys(pa.array([2**64 - 1], pa.uint64())) == keys_of([str(2**64 - 1)])


@pytest.mark.parametrize(
    "typ", [pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary()]
)
def test_string_and_binary_ids_are_their_bytes(typ):
    ids = ["order-1", "é", "x" * 1024]
    arr = pa.array(
        [i.encode() if pa.types.is_binary(typ) or typ == pa.large_binary() else i for i in ids], typ
    )
    assert arrow_explicit_keys(arr) == keys_of([i.encode() for i in ids])


def test_chunked_and_sliced_columns():
    chunked = pa.chunked_array([["a", "b"], ["c"]])
    assert arrow_explicit_keys(chunked) == keys_of(["a", "b", "c"])
    sliced = pa.array(["a", "b", "c", "d"]).slice(1, 2)
    assert arrow_explicit_keys(sliced) == keys_of(["b", "c"])


def test_a_null_key_names_its_row_across_chunks():
    chunked = pa.chunked_array([["a", "b"], ["c", None]])
    with pytest.raises(InvalidArgumentError, match="null at row 3"):
        arrow_explicit_keys(chunked)


@pytest.mark.parametrize(("ids", "row"), [(["a", ""], 1), (["x" * 1025], 0)])
def test_bad_ids_name_their_row(ids, row):
    with pytest.raises(InvalidArgumentError, match=f"row {row}"):
        arrow_explicit_keys(pa.array(ids))


def test_wrong_types_are_refused():
    with pytest.raises(InvalidTypeError, match="string, binary or integer"):
        arrow_explicit_keys(pa.array([1.5]))
    with pytest.raises(InvalidTypeError, match="Arrow data"):
        arrow_explicit_keys(["a", "b"])
    with pytest.raises(InvalidTypeError, match="binary or string"):
        arrow_content_keys(pa.array([1]))


def test_content_keys_are_md5_of_the_values():
    values = [b"", b"abc", b"x" * 5000]
    expected = b"".join(hashlib.md5(v).digest() for v in values)
    assert arrow_content_keys(pa.array(values, pa.binary())) == expected
    assert arrow_content_keys(pa.array(values, pa.large_binary())) == expected
    assert arrow_content_keys(pa.array(["abc"])) == content_key(b"abc")
    with pytest.raises(InvalidArgumentError, match="null at row 1"):
        arrow_content_keys(pa.array([b"a", None]))


def test_many_rows_hash_in_parallel_and_match():
    ids = [f"id-{i}" for i in range(20_000)]
    assert arrow_explicit_keys(pa.array(ids)) == keys_of(ids)


# --- canonical JSON -------------------------------------------------------------------------------


def es_number(v: float) -> str:
    """ECMAScript Number.prototype.toString (RFC 8785), from Python's shortest repr."""
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    _, tup, exp = Decimal(repr(abs(v))).normalize().as_tuple()
    digits = "".join(map(str, tup))
    n = len(digits) + exp  # value = 0.digits * 10**n
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    mant = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mant}e{'+' if e > 0 else '-'}{abs(e)}"


def reference_json(row: dict) -> bytes:
    """The canonical JSON spec, written independently in Python (flat rows)."""

    def value(v) -> str:
        if isinstance(v, float):
            return es_number(v)
        return json.dumps(v, ensure_ascii=False)

    items = sorted(row.items(), key=lambda kv: kv[0].encode())
    body = ",".join(json.dumps(k, ensure_ascii=False) + ":" + value(v) for k, v in items)
    return ("{" + body + "}").encode()


@pytest.mark.parametrize(
    "v",
    [
        1.0,
        -1.5,
        0.1,
        100.0,
        1e21,
        1e20,
        1.5e-7,
        1e-6,
        123456789.125,
        5e-324,
        1.7976931348623157e308,
        2.0**53,
        1 / 3,
    ],
)
def test_floats_follow_ecmascript(v):
    out = arrow_canonical_json(pa.record_batch({"v": pa.array([v])}))
    assert out == [reference_json({"v": v})]


def test_rows_match_the_python_reference():
    rows = [
        {"order_id": 1, "name": 'a"b\\c\n\t\x01é/€', "ok": True, "amount": 12.5, "note": None},
        {"order_id": -7, "name": "", "ok": False, "amount": 0.1, "note": "x"},
    ]
    batch = pa.RecordBatch.from_pylist(rows)
    assert arrow_canonical_json(batch) == [reference_json(r) for r in rows]


def test_the_same_row_in_other_arrow_types_gives_the_same_bytes_and_key():
    a = pa.record_batch(
        {
            "id": pa.array([1, 2], pa.int32()),
            "s": pa.array(["x", None], pa.string()),
            "f": pa.array([0.5, 0.1], pa.float64()),
            "t": pa.array([1_500_000, 0], pa.timestamp("us", tz="UTC")),
            "b": pa.array([b"\x00\xff", b""], pa.binary()),
        }
    )
    b = pa.record_batch(
        {
            "b": pa.array([b"\x00\xff", b""], pa.large_binary()),
            "t": pa.array([1_500, 0], pa.timestamp("ms")),
            "f": pa.array([0.5, 0.1], pa.float32()),
            "s": pa.array(["x", None], pa.large_string()),
            "id": pa.array([1, 2], pa.uint64()),
            "route": pa.array([3, 3], pa.int32()),
        }
    )
    ja, jb = arrow_canonical_json(a), arrow_canonical_json(b, exclude=["route"])
    assert ja == jb
    assert ja[0] == b'{"b":"AP8=","f":0.5,"id":1,"s":"x","t":"1970-01-01T00:00:01.500Z"}'
    assert arrow_rows(a)[1] == arrow_rows(b, exclude=["route"])[1]
    assert arrow_rows(a)[1] == b"".join(content_key(j) for j in ja)


def test_dates_decimals_lists_and_structs():
    batch = pa.record_batch(
        {
            "d": pa.array([dt.date(2024, 2, 29)], pa.date32()),
            "m": pa.array([Decimal("1.50")], pa.decimal128(10, 2)),
            "l": pa.array([[3, 1]], pa.list_(pa.int64())),
            "s": pa.array([{"z": 1, "a": "q"}]),
        }
    )
    assert arrow_canonical_json(batch) == [
        b'{"d":"2024-02-29","l":[3,1],"m":1.50,"s":{"a":"q","z":1}}'
    ]


def test_json_refuses_what_it_cannot_represent():
    with pytest.raises(InvalidArgumentError, match="row 1"):
        arrow_canonical_json(pa.record_batch({"v": [1.0, math.nan]}))
    with pytest.raises(InvalidTypeError, match="does not cover"):
        arrow_canonical_json(pa.record_batch({"v": pa.array([1], pa.duration("s"))}))
    with pytest.raises(InvalidTypeError, match="record batch"):
        arrow_canonical_json(pa.array([1]))


def test_keys_are_identical_in_other_processes():
    code = (
        "import pyarrow as pa, sys\n"
        "from woodpecker_idem._core import arrow_rows\n"
        "b = pa.record_batch({'k': [3, 1], 'v': [0.1, 2.5], 's': ['é', 'x']})\n"
        "sys.stdout.write(arrow_rows(b)[1].hex() + arrow_rows(b, key='k')[1].hex())\n"
    )
    here = pa.record_batch({"k": [3, 1], "v": [0.1, 2.5], "s": ["é", "x"]})
    expected = (arrow_rows(here)[1] + arrow_rows(here, key="k")[1]).hex()
    env = dict(os.environ, PYTHONHASHSEED="12345")
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        assert out.stdout == expected
        env["PYTHONHASHSEED"] = "999"


# --- arrow_rows --------------------------------------------------------------------------------


def test_rows_with_key_and_payload_columns():
    batch = pa.record_batch({"id": ["a", "b"], "body": [b"p1", b"p2"], "n": [1, 2]})
    payloads, keys = arrow_rows(batch, key="id", payload="body")
    assert payloads == [b"p1", b"p2"]
    assert keys == keys_of(["a", "b"])
    payloads, keys = arrow_rows(batch, payload="body")
    assert keys == content_key(b"p1") + content_key(b"p2")
    column_payloads, column_keys = arrow_rows(pa.array([b"p1", b"p2"]), key=pa.array(["a", "b"]))
    assert (column_payloads, column_keys) == ([b"p1", b"p2"], keys_of(["a", "b"]))
    table = pa.Table.from_batches([batch, batch])
    assert arrow_rows(table, key="id", payload="body")[0] == [b"p1", b"p2"] * 2


def test_rows_refuse_bad_batches_whole():
    batch = pa.record_batch({"id": ["a", None], "body": [b"p1", b"p2"]})
    with pytest.raises(InvalidArgumentError, match="key column 'id' is null at row 1"):
        arrow_rows(batch, key="id", payload="body")
    with pytest.raises(InvalidArgumentError, match="no column 'nope'.*id, body"):
        arrow_rows(batch, key="nope")
    with pytest.raises(InvalidArgumentError, match="3 rows but there are 2"):
        arrow_rows(pa.array([b"a", b"b"]), key=pa.array(["x", "y", "z"]))
    with pytest.raises(InvalidArgumentError, match="single column"):
        arrow_rows(pa.array([b"a"]), key="id")


def test_empty_inputs():
    assert arrow_rows(pa.record_batch({"a": pa.array([], pa.int64())})) == ([], b"")
    assert arrow_rows(pa.table({"a": pa.array([], pa.int64())})) == ([], b"")


# --- routes ------------------------------------------------------------------------------------


def test_routes_are_the_big_endian_head_of_the_key_modulo_p():
    keys = keys_of([f"k{i}" for i in range(1000)])
    for p in (1, 3, 4, 7, 1000):
        got = pa.py_buffer(route_keys(keys, p))
        routes = pa.Array.from_buffers(pa.int32(), 1000, [None, got]).to_pylist()
        want = [int.from_bytes(keys[16 * i : 16 * i + 8], "big") % p for i in range(1000)]
        assert routes == want
        assert arrow_first_misrouted(keys, p, pa.array(want)) is None
    four = [int.from_bytes(keys[16 * i : 16 * i + 8], "big") % 4 for i in range(1000)]
    bad = list(four)
    bad[5] = (bad[5] + 1) % 4
    assert arrow_first_misrouted(keys, 4, pa.array(bad)) == (5, bad[5], four[5])
    assert arrow_first_misrouted(keys, 4, pa.array(four[:3] + [None] + four[4:])) == (
        3,
        None,
        four[3],
    )
    with pytest.raises(InvalidArgumentError, match="partitions"):
        route_keys(keys, 0)
    with pytest.raises(InvalidTypeError, match="integer column"):
        arrow_first_misrouted(keys, 4, pa.array(["0"] * 1000))

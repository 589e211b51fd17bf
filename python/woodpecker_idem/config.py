"""Configuration: one table of keys (docs/operations.md) and a frozen `Config` built from it.

Why one table: defaults, validation, environment parsing, error messages and the docs all read
`KEYS`, so a key cannot be documented one way and validated another. Units are in the key names
(`_ms`, `_s`, `_bytes`), so a value never needs a unit to be read correctly.

Precedence, lowest first: defaults < YAML file < environment (`WOODPECKER_APPEND_LINGER_MS=5`) <
overrides. Invalid values and unknown keys fail at load with `ConfigError`.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from .errors import ConfigError

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
#: AddEntries batches a writer's in-flight room holds by default (`append.max_inflight_entries`
#: is this many `append.max_batch_entries`). Batches of up to 10,000 entries: with 100 B rows and
#: an fdatasync per batch, batches of 1,000 made the syncs about half of a bulk write's CPU.
BATCHES_IN_FLIGHT = 4

ENV_PREFIX = "WOODPECKER_"

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024 * GiB,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_INT_RE = re.compile(r"^[+-]?\d+$")


class _Invalid(Exception):
    """Internal: a value failed its check; `allowed` says what would pass."""

    def __init__(self, allowed: str) -> None:
        super().__init__(allowed)
        self.allowed = allowed


# --- value kinds ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its kind, default, allowed values and meaning."""

    name: str
    kind: str  # int | size | number | bool | choice | fsync | str | optional_str | str_list
    default: Any
    meaning: str
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    choices: tuple[Any, ...] = ()  # optional_str: None among them means null is allowed
    check: Callable[[Any], None] | None = None  # extra rule; raises _Invalid

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.name.upper().replace(".", "_")

    def allowed(self) -> str:
        """The allowed range in words, for error messages and docs."""
        if self.choices:
            return "one of " + ", ".join("null" if c is None else str(c) for c in self.choices)
        if self.kind == "fsync":
            return "always, never or batch_ms:N with N in 1..60000"
        if self.kind in ("int", "size", "number"):
            noun = {"int": "an integer", "size": "a size in bytes", "number": "a number"}[self.kind]
            lo = _fmt_bound(self.min, self.kind)
            hi = _fmt_bound(self.max, self.kind)
            if self.min is not None and self.max is not None:
                if self.min_exclusive:
                    return f"{noun} > {lo} and <= {hi}"
                return f"{noun} in {lo}..{hi}"
            if self.min is not None:
                return f"{noun} {'>' if self.min_exclusive else '>='} {lo}"
            return noun
        if self.kind == "bool":
            return "true or false"
        if self.kind == "optional_str":
            return "a string or null"
        if self.kind == "str_list":
            return "a list of strings"
        return "a string"

    def default_text(self) -> str:
        if self.kind == "str_list":
            return "[]"
        if self.kind == "bool":
            return "true" if self.default else "false"
        if self.kind == "size" and isinstance(self.default, int):
            return _fmt_size(self.default)
        return repr(self.default) if isinstance(self.default, str) else str(self.default)


def _fmt_size(n: int) -> str:
    for unit, mult in (("TiB", 1024 * GiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return str(n)


def _fmt_bound(v: float | None, kind: str) -> str:
    if v is None:
        return ""
    if kind == "size":
        return _fmt_size(int(v))
    if float(v).is_integer():
        return str(int(v))
    return str(v)


def _check_root(value: str) -> None:
    if value.startswith("/") or value.endswith("/") or ".." in value.split("/"):
        raise _Invalid("a relative key prefix: no leading or trailing '/', no '..'")


def _check_prefix(value: str) -> None:
    if not value.startswith("/") or "#" in value.split("/"):
        raise _Invalid("a key prefix starting with '/', without a path component '#' (reserved)")


def _check_url(value: str | None) -> None:
    if value is not None and not re.match(r"^https?://[^/\s]+", value):
        raise _Invalid("an http:// or https:// URL, or null")


_ENDPOINT_RE = re.compile(r"^(https?://)?(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+):\d{1,5}/?$")


def _check_endpoints(value: tuple[str, ...]) -> None:
    if not all(_ENDPOINT_RE.match(v) for v in value):
        raise _Invalid("a list of host:port or http(s)://host:port")


def _nonempty_optional(value: str | None) -> None:
    if value is not None and not value:
        raise _Invalid("a non-empty string or null")


def _choice_hint(value: object, choices: tuple[Any, ...]) -> str:
    """The hint `; did you mean 'AES256'?` for a near miss of one of `choices` (case aside)."""
    if not isinstance(value, str):
        return ""
    by_lower = {c.lower(): c for c in choices if isinstance(c, str)}
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


#: The names AWS's documentation uses for the two `objectstore.sse` values, which people type.
_SSE_NAMES = {"sse-s3": "AES256", "sse-kms": "aws:kms"}


def _check_sse(value: str | None) -> None:
    if isinstance(value, str) and value.lower() in _SSE_NAMES:
        raise _Invalid(
            f"one of null, AES256, aws:kms; {value} is written {_SSE_NAMES[value.lower()]!r}"
        )


_DAY_S = 86_400


def _int(name: str, default: int, lo: int, hi: int, meaning: str) -> Key:
    return Key(name, "int", default, meaning, lo, hi)


def _size(name: str, default: int, lo: int, hi: int, meaning: str) -> Key:
    return Key(name, "size", default, meaning, lo, hi)


def _secs(name: str, default: float, hi: float, meaning: str) -> Key:
    """Seconds: a number > 0 (fractions allowed), at most `hi`."""
    return Key(name, "number", default, meaning, 0, hi, min_exclusive=True)


def _opt(name: str, meaning: str, check: Callable[[Any], None] = _nonempty_optional) -> Key:
    return Key(name, "optional_str", None, meaning, check=check)


# The single source of truth. Sections are the part before the dot.
KEYS: tuple[Key, ...] = (
    Key("quorum.es", "int", 1, "ensemble size; wq = es, aq = es // 2 + 1", choices=(1, 3, 5)),
    _opt(
        "quorum.tls_ca_cert",
        "service mode: PEM file of the CA that signed the LogStore nodes' certificates; set, "
        "nodes are reached over TLS",
    ),
    _opt(
        "quorum.tls_client_cert",
        "service mode: PEM client certificate for nodes that ask "
        "for one (with quorum.tls_client_key)",
    ),  # fmt: skip
    _opt("quorum.tls_client_key", "service mode: PEM private key of quorum.tls_client_cert"),
    Key(
        "quorum.nodes",
        "choice",
        "embedded",
        "where the LogStore nodes are: embedded (es of them in this process) or registry (node "
        "processes registered in the metadata store, over gRPC: service mode)",
        choices=("embedded", "registry"),
    ),
    _int(
        "quorum.call_timeout_ms",
        30_000,
        1,
        3_600_000,
        "deadline of a write's call to a LogStore node: unanswered by then, the node counts as "
        "unavailable for it (the batch is resent, then the node is dropped from the segment); "
        "calls that may scan a segment (fence, read, complete) get 10 times as long",
    ),
    _int(
        "writer.lease_ms",
        30_000,
        1_000,
        3_600_000,
        "a writer's lease on its log in the metadata store, renewed every third of it while the "
        "writer lives: drop-group refuses a log whose writer's lease is live, and a group "
        "writer's routes move to the other members once its lease (and membership) runs out",
    ),
    _int(
        "append.max_batch_entries",
        10_000,
        1,
        100_000,
        "most entries in one AddEntries batch (unset: at most append.max_inflight_entries)",
    ),
    _size("append.max_batch_bytes", 2 * MiB, KiB, 64 * MiB, "most bytes in one AddEntries batch"),
    _int("append.linger_ms", 2, 0, 1000, "most wait behind a batch a node is retrying"),
    _int(
        "append.max_inflight_entries",
        BATCHES_IN_FLIGHT * 10_000,
        1,
        10**7,
        "backpressure: entries not yet acked (unset: at least four append.max_batch_entries)",
    ),
    _size("append.max_inflight_bytes", 64 * MiB, KiB, 16 * GiB, "backpressure: bytes not acked"),
    _int("append.timeout_ms", 10_000, 1, 3_600_000, "per AppendOp: time to reach the ack quorum"),
    _int("append.max_retries", 3, 0, 100, "per AppendOp: resends to a node before giving up"),
    _size("append.max_entry_bytes", 16 * MiB, 1, 256 * MiB, "larger payloads are refused"),
    Key(
        "append.compression",
        "choice",
        "none",
        "compress each batch frame once, natively, in the writer (stored as sent; readers and "
        "the window rebuild decompress): none, lz4 (fast) or zstd (smaller)",
        choices=("none", "lz4", "zstd"),
    ),
    _size("segment.max_size_bytes", 256 * MiB, KiB, 64 * GiB, "roll the segment at this size"),
    _secs("segment.max_interval_s", 600, 7 * _DAY_S, "roll the segment after this age"),
    _int("segment.max_entries", 1_000_000, 1, 2**32 - 1, "roll after this many entries"),
    _secs("idempotency.window_duration_s", 600, 365 * _DAY_S, "window age bound"),
    _int("idempotency.window_max_keys", 100_000, 1, 10**8, "window capacity (keys)"),
    _secs("idempotency.snapshot_interval_s", 30, _DAY_S, "snapshot at least this often"),
    _int(
        "idempotency.snapshot_threshold",
        10_000,
        1,
        10**8,
        "snapshot after this many new keys (or half the last snapshot's keys, if more; "
        "1 s apart at least)",
    ),
    _int("idempotency.snapshots_kept", 2, 1, 100, "dedup snapshots retained per log"),
    Key(
        "retention.max_age_s",
        "number",
        0,
        "drop completed segments older than this (never inside the idempotency window); "
        "0: no age bound",
        0,
        100 * 365 * _DAY_S,
    ),
    _size(
        "retention.max_bytes",
        0,
        0,
        1024 * 1024 * GiB,
        "drop the oldest completed segments while a log holds more (never inside the "
        "idempotency window); 0: no size bound",
    ),
    _secs(
        "retention.check_interval_s",
        60,
        _DAY_S,
        "how often a client applies retention to the logs it writes",
    ),
    Key(
        "storage.type",
        "choice",
        "object",
        "LogStore mode: object (nodes keep segments in the object store) or staged (a node keeps "
        "the segments it holds on its local disk, storage.staged_dir, and uploads each one to "
        "the object store when it completes; the segment is SEALED once uploaded)",
        choices=("object", "staged"),
    ),
    _opt(
        "storage.staged_dir",
        "staged: a node's local directory for the segments it holds (node N under "
        "<staged_dir>/<store id>/N); required by `logstore serve`; null in process: "
        "<data_dir>/staged",
    ),
    _secs(
        "storage.staged_grace_s",
        60,
        _DAY_S,
        "staged: how long a node keeps its local copy of a segment once it is SEALED (readers "
        "reading it there finish); then it is read from the object store",
    ),
    Key(
        "storage.fsync",
        "fsync",
        "always",
        "local segment files: always (ack after fdatasync), batch_ms:N (ack once written; "
        "fdatasync every N ms in the background: a power loss may lose N ms of acks) or never",
    ),
    Key("objectstore.type", "choice", "local", "object storage backend", choices=("local", "s3")),
    _opt("objectstore.path", "local directory; null: <data_dir>/objects"),
    _opt("objectstore.endpoint_url", "S3 endpoint URL; null: the AWS default", _check_url),
    _opt("objectstore.bucket", "S3 bucket (required for s3)"),
    Key(
        "objectstore.root",
        "str",
        "woodpecker",
        "key prefix inside the bucket or objectstore.path; one metadata store owns it",
        check=_check_root,
    ),
    _opt("objectstore.region", "S3 region; null: the SDK default"),
    _opt("objectstore.access_key_id", "S3 access key; null: the AWS credential chain"),
    _opt("objectstore.secret_access_key", "S3 secret key (with access_key_id); never logged"),
    _opt("objectstore.profile", "AWS profile for S3 credentials; null: the default chain"),
    Key(
        "objectstore.sse",
        "optional_str",
        None,
        "S3 server-side encryption header on every object written: AES256 (SSE-S3) or aws:kms "
        "(SSE-KMS); null: no header, the bucket's default encryption applies",
        choices=(None, "AES256", "aws:kms"),
        check=_check_sse,
    ),
    _opt(
        "objectstore.sse_kms_key_id",
        "KMS key id, ARN or alias for objectstore.sse: aws:kms; null: the AWS-managed aws/s3 key",
    ),
    Key(
        "objectstore.create_bucket",
        "bool",
        False,
        "create a missing S3 bucket at connect; false: a missing bucket is an error",
    ),
    _secs("objectstore.probe_timeout_s", 5, 600, "connect() gives up on S3 after this long"),
    _secs("objectstore.connect_timeout_s", 2, 600, "S3: one TCP connect attempt's limit"),
    _secs("objectstore.read_timeout_s", 5, 600, "S3: one response read's limit"),
    _secs("objectstore.retry_budget_s", 30, 3600, "S3: time one operation retries before failing"),
    Key("meta.type", "choice", "sqlite", "metadata backend", choices=("sqlite", "etcd")),
    _opt("meta.path", "SQLite file; null: <data_dir>/meta.sqlite"),
    Key(
        "meta.endpoints",
        "str_list",
        (),
        "etcd endpoints (host:port or http(s)://host:port)",
        check=_check_endpoints,
    ),
    Key("meta.prefix", "str", "/woodpecker", "etcd key prefix", check=_check_prefix),
    _int("meta.timeout_ms", 5_000, 1, 600_000, "etcd: deadline of every metadata call"),
    _opt(
        "meta.ca_cert",
        "etcd: PEM file of the CA that signed etcd's certificate (host:port endpoints then use "
        "https); null: the system CAs",
    ),
    _opt("meta.client_cert", "etcd: PEM client certificate (with meta.client_key)"),
    _opt("meta.client_key", "etcd: PEM private key of meta.client_cert"),
    _opt("meta.user", "etcd: user name, when etcd authentication is enabled"),
    _opt("meta.password", "etcd: password of meta.user; never logged"),
)

_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
#: Values never shown in messages or reprs.
_SECRETS = frozenset({"objectstore.secret_access_key", "meta.password"})
_BY_ENV: dict[str, Key] = {k.env_name: k for k in KEYS}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(k.name.split(".", 1)[0] for k in KEYS))


class FsyncPolicy(NamedTuple):
    """`storage.fsync` parsed: mode is always | never | batch; batch_ms only for batch."""

    mode: str
    batch_ms: int = 0


def parse_fsync(value: str) -> FsyncPolicy:
    """Parse a validated `storage.fsync` value."""
    if value.startswith("batch_ms:"):
        return FsyncPolicy("batch", int(value.split(":", 1)[1]))
    return FsyncPolicy(value)


# --- parsing and validation ---------------------------------------------------------------------


def parse_size(value: object) -> int:
    """Bytes from an int or a string like "2MiB", "512 KiB", "1.5GiB" or "10MB".

    KiB/MiB/GiB are 1024-based, KB/MB/GB 1000-based. `ValueError` for anything else, bool included.
    """
    if isinstance(value, bool):
        raise ValueError("a bool is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            number, unit = m.group(1), _SIZE_UNITS[m.group(2).lower()]
            if "." not in number:
                return int(number) * unit
            whole, frac = number.split(".")
            scaled = int(whole + frac) * unit
            div = 10 ** len(frac)
            if scaled % div == 0:
                return scaled // div
            raise ValueError(f"{value!r} is not a whole number of bytes")
    raise ValueError(f"{value!r} is not a size")


def _bad(key: Key, value: object, source: str, allowed: str | None = None) -> ConfigError:
    where = f" (from {source})" if source else ""
    shown = "<hidden>" if key.name in _SECRETS else repr(value)
    return ConfigError(
        f"invalid config {key.name} = {shown}{where}: must be {allowed or key.allowed()}"
    )


def _validate(key: Key, value: object, source: str) -> Any:
    """Check one value against its key; returns the normalised value."""
    try:
        return _normalise(key, value)
    except _Invalid as exc:
        raise _bad(key, value, source, exc.allowed) from None


def check_value(name: str, value: object, source: str = "") -> Any:
    """One key's value checked (type, range, finiteness) and normalised, as a config file's would
    be; `ConfigError` names the key. For options that mirror a key (`open_writer`'s window)."""
    key = _BY_NAME.get(name)
    if key is None:
        raise _unknown_key(name, source)
    return _validate(key, value, source)


def parse_text(name: str, text: str, source: str = "") -> Any:
    """One key's value given as text (as an environment variable would give it: "etcd",
    "a:1,b:2", "true", "2MiB"), typed, checked and normalised; `ConfigError` names the key. For
    string-only carriers of config keys, such as Spark data source options."""
    key = _BY_NAME.get(name)
    if key is None:
        raise _unknown_key(name, source)
    return _validate(key, _parse_env(key, text, source), source)


def _check_range(key: Key, v: float) -> None:
    lo, hi = key.min, key.max
    if lo is not None and (v <= lo if key.min_exclusive else v < lo):
        raise _Invalid(key.allowed())
    if hi is not None and v > hi:
        raise _Invalid(key.allowed())


def _normalise(key: Key, value: object) -> Any:
    kind = key.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(key.allowed())
        if key.choices and value not in key.choices:
            raise _Invalid(key.allowed())
        _check_range(key, value)
        return value
    if kind == "size":
        try:
            n = parse_size(value)
        except ValueError:
            raise _Invalid(key.allowed() + ' (an int or a string like "2MiB")') from None
        _check_range(key, n)
        return n
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(key.allowed())
        if not math.isfinite(value):
            raise _Invalid(key.allowed())
        _check_range(key, value)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _Invalid(key.allowed())
        return value
    if kind == "choice":
        if key.check is not None:
            key.check(value)
        if not isinstance(value, str) or value not in key.choices:
            raise _Invalid(key.allowed() + _choice_hint(value, key.choices))
        return value
    if kind == "fsync":
        if not isinstance(value, str):
            raise _Invalid(key.allowed())
        if value in ("always", "never"):
            return value
        m = re.fullmatch(r"batch_ms:(\d+)", value)
        if m and 1 <= int(m.group(1)) <= 60_000:
            return f"batch_ms:{int(m.group(1))}"
        raise _Invalid(key.allowed())
    if kind in ("str", "optional_str"):
        if value is None and kind == "optional_str":
            out = None
        elif isinstance(value, str):
            out = value
        else:
            raise _Invalid(key.allowed())
        if key.check is not None:
            key.check(out)
        if key.choices and out not in key.choices:
            raise _Invalid(key.allowed() + _choice_hint(out, key.choices))
        return out
    if kind == "str_list":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise _Invalid(key.allowed())
        if not all(isinstance(v, str) and v for v in value):
            raise _Invalid("a list of non-empty strings")
        if key.check is not None:
            key.check(tuple(value))
        return tuple(value)
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover


def _parse_env(key: Key, text: str, source: str) -> Any:
    """Environment values are strings: turn them into the key's type before validating."""
    s = text.strip()
    kind = key.kind
    try:
        if kind == "int":
            if not _INT_RE.match(s):
                raise ValueError
            return int(s)
        if kind == "number":
            v: float = float(s)
            return int(v) if _INT_RE.match(s) else v
        if kind == "bool":
            lowered = s.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind == "optional_str":
            return s or None
        if kind == "str_list":
            return [p.strip() for p in s.split(",") if p.strip()]
    except ValueError:
        raise _bad(key, text, source) from None
    return s  # size (parsed by its validator), choice, fsync, str


def _unknown_key(name: str, source: str) -> ConfigError:
    where = f" (from {source})" if source else ""
    if name in SECTIONS:
        keys = ", ".join(k.name for k in KEYS if k.name.startswith(name + "."))
        return ConfigError(f"config {name!r}{where} is a section, not a key; its keys: {keys}")
    close = difflib.get_close_matches(name, list(_BY_NAME), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown config key {name!r}{where}{hint}")


def _flatten(data: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """Dotted keys from nested dicts and/or dotted keys; a key given twice is an error."""
    out: dict[str, Any] = {}
    for raw, value in data.items():
        if not isinstance(raw, str):
            raise ConfigError(f"config keys must be strings, got {raw!r} (from {source})")
        name = f"{prefix}{raw}"
        if isinstance(value, Mapping):
            items = _flatten(value, source, name + ".")
        else:
            items = {name: value}
        for k, v in items.items():
            if k in out:
                raise ConfigError(f"config key {k!r} is given twice (from {source})")
            out[k] = v
    return out


def _check_known(flat: Mapping[str, Any], source: str) -> None:
    for name in flat:
        if name not in _BY_NAME:
            raise _unknown_key(name, source)


# --- Config --------------------------------------------------------------------------------------


class Section:
    """Read-only view of one section: `cfg.append.linger_ms`."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        full = f"{self._name}.{attr}"
        if full in self._values:
            return self._values[full]
        if self._name == "quorum" and attr in ("wq", "aq"):
            es = self._values["quorum.es"]
            return es if attr == "wq" else es // 2 + 1
        raise AttributeError(str(_unknown_key(full, "")))

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError("Config is frozen; use Config.with_overrides()")

    def __dir__(self) -> list[str]:
        return [k.split(".", 1)[1] for k in self._values if k.startswith(self._name + ".")]

    def __repr__(self) -> str:
        items = ", ".join(f"{a}={getattr(self, a)!r}" for a in self.__dir__())
        return f"{self._name}({items})"


class Config:
    """Frozen, validated configuration. Build with `load_config` or `Config.from_dict`.

    Keeps the explicitly set values apart from the defaults (`is_set`, and what pickles).
    """

    __slots__ = ("_explicit", "_values")
    _explicit: Mapping[str, Any]
    _values: Mapping[str, Any]

    def __init__(self, explicit: Mapping[str, Any] | None = None, *, _source: str = "") -> None:
        explicit = dict(explicit or {})
        _check_known(explicit, _source)
        values: dict[str, Any] = {}
        for key in KEYS:
            if key.name in explicit:
                values[key.name] = _validate(key, explicit[key.name], _source)
            else:
                values[key.name] = key.default
        _fit_batches(values, explicit)
        _check_together(values)
        _check_backend_keys(explicit, values)
        norm = {k: values[k] for k in explicit}
        object.__setattr__(self, "_explicit", MappingProxyType(norm))
        object.__setattr__(self, "_values", MappingProxyType(values))

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (Spark ships it to executors): rebuilt, and so re-validated, from its keys."""
        return (Config, (dict(self._explicit),))

    # construction
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "dict") -> Config:
        """From dotted keys and/or nested sections: {"append.linger_ms": 5, "quorum": {"es": 3}}."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config ({source}) must be a mapping, got {type(data).__name__}")
        return cls(_flatten(data, source), _source=source)

    def with_overrides(self, mapping: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Config:
        """A new Config with some keys changed. Keyword form: `append__linger_ms=5` or
        `append={"linger_ms": 5}`."""
        extra = dict(_flatten(mapping or {}, "overrides"))
        for k, v in _flatten(
            {k.replace("__", "."): v for k, v in kwargs.items()}, "overrides"
        ).items():
            if k in extra:
                raise ConfigError(f"config key {k!r} is given twice (from overrides)")
            extra[k] = v
        _check_known(extra, "overrides")
        merged = {**self._explicit, **extra}
        return Config(merged, _source="overrides")

    # access
    def get(self, name: str) -> Any:
        """The value of a dotted key (`"append.linger_ms"`)."""
        try:
            return self._values[name]
        except KeyError:
            raise _unknown_key(name, "") from None

    def __getattr__(self, attr: str) -> Section:
        if attr in SECTIONS:
            return Section(attr, self._values)
        close = difflib.get_close_matches(attr, SECTIONS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise AttributeError(f"Config has no section {attr!r}{hint}")

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError("Config is frozen; use Config.with_overrides()")

    def __dir__(self) -> list[str]:
        return [*SECTIONS, "get", "to_dict", "with_overrides", "from_dict", "is_set"]

    def is_set(self, name: str) -> bool:
        """True if the key was given explicitly (file, environment or overrides), not defaulted."""
        if name not in _BY_NAME:
            raise _unknown_key(name, "")
        return name in self._explicit

    def to_dict(self) -> dict[str, Any]:
        """Every key, dotted, with its effective value (lists as lists, ready for YAML/JSON)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._values.items()}

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        shown = {k: "<hidden>" if k in _SECRETS else v for k, v in self._explicit.items()}
        return f"Config({shown!r})"

    # derived paths
    def meta_path(self, data_dir: str | os.PathLike[str]) -> Path:
        """`meta.path`, or `<data_dir>/meta.sqlite` when not set."""
        p = self._values["meta.path"]
        return Path(p) if p is not None else Path(data_dir) / "meta.sqlite"

    def objectstore_path(self, data_dir: str | os.PathLike[str]) -> Path:
        """`objectstore.path`, or `<data_dir>/objects` when not set."""
        p = self._values["objectstore.path"]
        return Path(p) if p is not None else Path(data_dir) / "objects"


def _fit_batches(v: dict[str, Any], explicit: Mapping[str, Any]) -> None:
    """The batch and in-flight limits a config leaves unset follow the one it sets: a batch
    never larger than what may be in flight, and room for `BATCHES_IN_FLIGHT` batches (one
    being stored and synced while the next ones fill)."""
    batch, in_flight = "append.max_batch_entries", "append.max_inflight_entries"
    if batch in explicit and in_flight not in explicit:
        v[in_flight] = max(v[in_flight], BATCHES_IN_FLIGHT * v[batch])
    elif in_flight in explicit and batch not in explicit:
        v[batch] = min(v[batch], v[in_flight])


def _check_together(v: Mapping[str, Any]) -> None:
    """Rules that involve two keys; the message names both."""
    if v["append.max_entry_bytes"] > v["append.max_inflight_bytes"]:
        raise ConfigError(
            f"invalid config append.max_entry_bytes = {v['append.max_entry_bytes']}: must be <= "
            f"append.max_inflight_bytes ({v['append.max_inflight_bytes']}), or one entry could "
            "never be in flight"
        )
    if v["append.max_batch_entries"] > v["append.max_inflight_entries"]:
        raise ConfigError(
            f"invalid config append.max_batch_entries = {v['append.max_batch_entries']}: must be "
            f"<= append.max_inflight_entries ({v['append.max_inflight_entries']})"
        )
    if v["meta.type"] == "etcd" and not v["meta.endpoints"]:
        raise ConfigError(
            "invalid config meta.endpoints = []: must be a non-empty list of host:port "
            "when meta.type is etcd"
        )
    if v["objectstore.type"] == "s3" and not v["objectstore.bucket"]:
        raise ConfigError(
            "invalid config objectstore.bucket = None: must be set when objectstore.type is s3"
        )
    if (v["objectstore.access_key_id"] is None) != (v["objectstore.secret_access_key"] is None):
        raise ConfigError(
            "invalid config: objectstore.access_key_id and objectstore.secret_access_key go "
            "together (set both, or neither to use objectstore.profile or the AWS chain)"
        )
    for a, b in (
        ("meta.client_cert", "meta.client_key"),
        ("meta.user", "meta.password"),
        ("quorum.tls_client_cert", "quorum.tls_client_key"),
    ):
        if (v[a] is None) != (v[b] is None):
            raise ConfigError(f"invalid config: {a} and {b} go together (set both, or neither)")
    if v["objectstore.sse"] is not None and v["objectstore.type"] != "s3":
        # Before the rule for every S3-only key (_check_backend_keys), with its own reason: it is
        # a promise about data at rest, and a local store would leave the files in the clear.
        raise ConfigError(
            f"invalid config objectstore.sse = {v['objectstore.sse']!r}: server-side encryption "
            f"is S3's, and objectstore.type is {v['objectstore.type']!r}; local segment files "
            "and snapshots are not encrypted by woodpecker_idem: use an encrypted file system "
            "(docs/security.md), and leave objectstore.sse unset"
        )
    if v["objectstore.sse_kms_key_id"] is not None and v["objectstore.sse"] != "aws:kms":
        # A key id without aws:kms would be dropped silently (or refused by S3 at the first put).
        raise ConfigError(
            f"invalid config objectstore.sse_kms_key_id = {v['objectstore.sse_kms_key_id']!r}: "
            "set it only with objectstore.sse: aws:kms (objectstore.sse is "
            f"{'null' if v['objectstore.sse'] is None else repr(v['objectstore.sse'])})"
        )
    if v["objectstore.profile"] is not None and v["objectstore.access_key_id"] is not None:
        raise ConfigError(
            "invalid config: objectstore.profile and objectstore.access_key_id both set; "
            "use one way to give S3 credentials"
        )


# Keys only one backend reads (by the key that picks the backend): set while another backend is
# picked, they would do nothing, so they are refused. objectstore.root serves both stores.
_BACKEND_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "objectstore.type": {
        "local": ("objectstore.path",),
        "s3": (
            "objectstore.endpoint_url",
            "objectstore.bucket",
            "objectstore.region",
            "objectstore.access_key_id",
            "objectstore.secret_access_key",
            "objectstore.profile",
            "objectstore.sse",
            "objectstore.sse_kms_key_id",
            "objectstore.create_bucket",
            "objectstore.probe_timeout_s",
            "objectstore.connect_timeout_s",
            "objectstore.read_timeout_s",
            "objectstore.retry_budget_s",
        ),
    },
    "storage.type": {"staged": ("storage.staged_dir", "storage.staged_grace_s")},
    "quorum.nodes": {
        "registry": ("quorum.tls_ca_cert", "quorum.tls_client_cert", "quorum.tls_client_key"),
    },
    "meta.type": {
        "sqlite": ("meta.path",),
        "etcd": (
            "meta.endpoints",
            "meta.prefix",
            "meta.timeout_ms",
            "meta.ca_cert",
            "meta.client_cert",
            "meta.client_key",
            "meta.user",
            "meta.password",
        ),
    },
}


def _check_backend_keys(explicit: Mapping[str, Any], v: Mapping[str, Any]) -> None:
    """Refuse a key set for a backend the config does not use (it would be ignored). A key
    given its default (`objectstore.endpoint_url: null`) changes nothing, and passes."""
    for picker, backends in _BACKEND_KEYS.items():
        for backend, names in backends.items():
            if v[picker] == backend:
                continue
            for name in names:
                if name in explicit and v[name] != _BY_NAME[name].default:
                    shown = "<hidden>" if name in _SECRETS else repr(v[name])
                    raise ConfigError(
                        f"invalid config {name} = {shown}: only {picker} {backend} reads it, "
                        f"and {picker} is {v[picker]!r}; remove it, or set {picker}: {backend}"
                    )


# --- loading -------------------------------------------------------------------------------------


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {os.fspath(path)!r}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {os.fspath(path)!r} must hold a mapping of keys, "
            f"got {type(data).__name__}"
        )
    return _flatten(data, f"file {os.fspath(path)}")


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = _BY_ENV.get(name)
        if key is None:
            # Other tools (Woodpecker CI among them) use this prefix too, so unknown names are
            # not errors; a near miss of one of ours is worth a warning.
            close = difflib.get_close_matches(name, list(_BY_ENV), n=1, cutoff=0.8)
            if close:
                log.warning("ignoring environment variable %s; did you mean %s?", name, close[0])
            continue
        out[key.name] = _parse_env(key, text, f"env {name}")
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Defaults < YAML file at `path` < environment (`os.environ` if `env` is None) < overrides."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        layers.append((f"file {os.fspath(path)}", _read_yaml(path)))
    layers.append(("environment", _from_env(os.environ if env is None else env)))
    if overrides:
        layers.append(("overrides", _flatten(overrides, "overrides")))
    merged: dict[str, Any] = {}
    for source, flat in layers:
        _check_known(flat, source)
        for name, value in flat.items():
            # Validate each layer on its own so the error names where the bad value came from.
            src = source
            if source == "environment":
                src = f"env {_BY_NAME[name].env_name}"
            _validate(_BY_NAME[name], value, src)
            merged[name] = value
    cfg = Config(merged, _source="merged config")
    log.debug("loaded config %r", cfg)
    return cfg


def config_table_markdown() -> str:
    """The key table as Markdown, for docs (generated, so it cannot drift from validation)."""
    lines = ["| key | default | allowed | meaning | env |", "|---|---|---|---|---|"]
    for k in KEYS:
        lines.append(
            f"| `{k.name}` | {k.default_text()} | {k.allowed()} | {k.meaning} | `{k.env_name}` |"
        )
    return "\n".join(lines)


__all__ = [
    "KEYS",
    "SECTIONS",
    "Config",
    "FsyncPolicy",
    "Key",
    "Section",
    "check_value",
    "config_table_markdown",
    "load_config",
    "parse_fsync",
    "parse_text",
    "parse_size",
]

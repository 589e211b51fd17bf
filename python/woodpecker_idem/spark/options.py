"""The `woodpecker` data source's options, checked on the driver, and the log group they name.

A write's options travel to the executors with the writer (`SinkOptions` is pickled with it): the
configuration is resolved once, on the driver, so executors need no config file.
"""

from __future__ import annotations

import difflib
import math
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client.group import log_name
from ..config import SECTIONS, Config, load_config, parse_text
from ..connect import connect
from ..errors import InvalidArgumentError, LogExistsError, LogGroupSizeMismatchError
from .batches import JOB_APP_PREFIX, STREAM_APP_PREFIX, BatchId
from .routing import MAX_PARTITIONS

# The options each use reads (besides config keys such as meta.type); SPARK_OPTIONS are Spark's
# own, which reach the source too.
READ_OPTIONS = ("log", "dataDir", "config")
BATCH_READ_OPTIONS = (*READ_OPTIONS, "startingOffsets", "endingOffsets")
STREAM_READ_OPTIONS = (*READ_OPTIONS, "startingOffsets", "maxEntriesPerTrigger")
WRITE_OPTIONS = (
    *READ_OPTIONS,
    "partitions",
    "idempotencyKey",
    "payloadColumn",
    "windowMaxKeys",
    "windowDurationS",
    "reportFile",
    "idempotent",
    "txnAppId",
    "txnVersion",
    "compression",
)
# Spark's own: a stream's checkpoint
SPARK_OPTIONS = ("checkpointLocation",)
ALL_OPTIONS = tuple(dict.fromkeys((*WRITE_OPTIONS, *BATCH_READ_OPTIONS, *STREAM_READ_OPTIONS)))

# The sink's window capacity per log unless windowMaxKeys (or the config key) says otherwise: a
# Spark task writes a whole route at once (10M rows in 4 routes: 2.5M keys each), where the
# config's default suits a service's steady stream. The ring is reserved as address space and
# its pages are touched as keys land: a window holds ~45 bytes of memory per key it holds.
SINK_WINDOW_MAX_KEYS = 4_194_304
COMPRESSIONS = ("none", "lz4", "zstd")  # the `compression` option: append.compression

if TYPE_CHECKING:
    from ..client.client import WoodpeckerClient


@dataclass(frozen=True)
class SinkOptions:
    """The data source options, checked on the driver before any task runs. The configuration is
    resolved there too (the `config` file, the driver's WOODPECKER_* environment, then config keys
    given as options) and travels to the executors with the writer: they need no config file."""

    log: str
    partitions: int | None
    settings: Config = field(default_factory=Config)
    key: str | None = None
    payload: str | None = None
    data_dir: str | None = None
    window_max_keys: int | None = None
    window_duration_s: float | None = None
    report_file: str | None = None
    idempotent: bool = True  # false: plain writers, no keys kept (the benches' baseline)
    batch_id: BatchId | None = None  # txnAppId / txnVersion (streaming: the micro-batch's own)
    # batch_id is the job's own (no txnAppId given): its records are dropped when the job ends
    job_scoped: bool = False

    @classmethod
    def parse(
        cls, options: Any, need_partitions: bool, known: tuple[str, ...] = WRITE_OPTIONS
    ) -> SinkOptions:
        """`known`: the option names this use takes (config keys are checked as config keys);
        any other is refused, with the nearest known name."""
        check_names(options, known)

        by_lower = {str(k).lower(): v for k, v in options.items()}  # as Spark's own map

        def get(name: str) -> str | None:
            value = by_lower.get(name.lower())
            return None if value is None or value == "" else str(value)

        name = get("log")
        if name is None:
            raise InvalidArgumentError('option "log" is required: the log group name')
        settings = load_config(get("config"), overrides=_config_options(options))
        compression = get("compression")
        if compression is not None:
            # the writers' append.compression: every writer a task opens (kept, taken over, plain)
            # is opened from these settings
            if compression.lower() not in COMPRESSIONS:
                raise InvalidArgumentError(
                    f'option "compression" must be one of {", ".join(COMPRESSIONS)}, '
                    f"not {compression!r}"
                )
            settings = settings.with_overrides({"append.compression": compression.lower()})
        data_dir = get("dataDir")
        if data_dir is None:
            _check_shared(settings)
        parts = get("partitions")
        if parts is None and need_partitions:
            raise InvalidArgumentError(
                'option "partitions" is required: the P given to prepare(df, key, P)'
            )
        idempotent = (get("idempotent") or "true").lower()
        if idempotent not in ("true", "false"):
            raise InvalidArgumentError(
                f'option "idempotent" must be true or false, not {idempotent!r}'
            )
        batch_id = _batch_id(get("txnAppId"), get("txnVersion"))
        if batch_id is not None and idempotent == "false":
            raise InvalidArgumentError(
                'options "txnAppId" and "txnVersion" need the idempotent sink (the plain one '
                'keeps no keys to find what a cut-short batch wrote): drop idempotent="false"'
            )
        return cls(
            log=name,
            partitions=None
            if parts is None
            else int_option("partitions", parts, 1, MAX_PARTITIONS),
            settings=settings,
            key=get("idempotencyKey"),
            payload=get("payloadColumn"),
            data_dir=data_dir,
            window_max_keys=int_option("windowMaxKeys", get("windowMaxKeys"), 1, 10**8),
            window_duration_s=_float_option("windowDurationS", get("windowDurationS")),
            report_file=get("reportFile"),
            idempotent=idempotent == "true",
            batch_id=batch_id,
        )

    def connect(self) -> WoodpeckerClient:
        """A client of this task (or driver call), opened here, after the executor forked. Shared
        stores (etcd, S3) use no local directory: the temp directory stands in for dataDir."""
        return connect(self.data_dir or tempfile.gettempdir(), self.settings)

    def writer_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.window_max_keys is not None:
            out["window_max_keys"] = self.window_max_keys
        elif not self.settings.is_set("idempotency.window_max_keys"):
            out["window_max_keys"] = SINK_WINDOW_MAX_KEYS
        if self.window_duration_s is not None:
            out["window_duration_s"] = self.window_duration_s
        return out


def check_names(options: Any, known: tuple[str, ...]) -> None:
    """Refuse an option no use of this source reads: Spark passes every option through, and a
    misspelt one (windowDuration, reportfil) would be silently ignored. Names are compared
    case-insensitively, as Spark compares them."""
    by_lower = {k.lower(): k for k in (*known, *SPARK_OPTIONS)}
    for raw in list(options):
        name = str(raw)
        low = name.lower()
        if low in by_lower or ("." in low and low.split(".", 1)[0] in SECTIONS):
            continue  # config keys (meta.type, ...) are checked by the config's own rules
        if low == "path":
            raise InvalidArgumentError(
                'the woodpecker source takes no path: name the log group with option("log", '
                'name) and its data directory with option("dataDir", dir)'
            )
        elsewhere = {k.lower(): k for k in ALL_OPTIONS}
        if low in elsewhere:  # another use's option (Spark hands it over lowercased)
            raise InvalidArgumentError(
                f'option "{elsewhere[low]}" does not apply here (options here: '
                f"{', '.join(known)}, and config keys such as meta.type)"
            )
        close = difflib.get_close_matches(low, list(by_lower), n=1, cutoff=0.6)
        hint = f'; did you mean "{by_lower[close[0]]}"?' if close else ""
        raise InvalidArgumentError(
            f'unknown option "{name}" for format("woodpecker"){hint} (options here: '
            f"{', '.join(known)}, and config keys such as meta.type)"
        )


def int_option(name: str, text: str | None, lo: int, hi: int | None = None) -> int | None:
    if text is None:
        return None
    value = text.strip()
    bounds = f">= {lo}" if hi is None else f"{lo}..{hi}"
    if not value.lstrip("-").isdigit():
        raise InvalidArgumentError(f'option "{name}" must be an int {bounds}, not {text!r}')
    n = int(value)
    if n < lo or (hi is not None and n > hi):
        raise InvalidArgumentError(f'option "{name}" must be an int {bounds}, not {text!r}')
    return n


def _float_option(name: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f'option "{name}" must be a number of seconds > 0, not {text!r}')
    return value


def _batch_id(app_id: str | None, version: str | None) -> BatchId | None:
    """Delta Lake's idempotent writes: both options or neither."""
    if app_id is None and version is None:
        return None
    if app_id is None or version is None:
        missing = "txnVersion" if version is None else "txnAppId"
        raise InvalidArgumentError(
            f'option "{missing}" is required with "txnAppId"/"txnVersion": a batch is named by '
            "both (the application, and this run's version: an int >= 0 that grows run by run)"
        )
    if app_id.startswith((STREAM_APP_PREFIX, JOB_APP_PREFIX)):
        raise InvalidArgumentError(
            f'option "txnAppId" must not start with {STREAM_APP_PREFIX!r} or {JOB_APP_PREFIX!r} '
            "(the sink names streaming queries and unnamed jobs so)"
        )
    number = int_option("txnVersion", version, 0)
    assert number is not None
    return BatchId(app_id, number)


def _config_options(options: Any) -> dict[str, Any]:
    """Options named like config keys (`meta.type`, `objectstore.bucket`, ...), typed: text as
    an environment variable gives it ("a:1,b:2" for a list), other values checked as they are."""
    out: dict[str, Any] = {}
    for raw, value in options.items():
        name = str(raw).lower()
        if "." not in name or name.split(".", 1)[0] not in SECTIONS or value is None:
            continue
        source = f"option {name}"
        out[name] = parse_text(name, value, source) if isinstance(value, str) else value
    return out


def _check_shared(settings: Config) -> None:
    """Without dataDir every store must be one all executors reach: etcd or an explicit SQLite
    file, S3 or an explicit directory. A default under each executor's own working directory
    would split the log group between hosts."""
    missing = []
    if settings.meta.type == "sqlite" and settings.meta.path is None:
        missing.append("meta.type=etcd (or meta.path)")
    if settings.objectstore.type == "local" and settings.objectstore.path is None:
        missing.append("objectstore.type=s3 (or objectstore.path)")
    if missing:
        raise InvalidArgumentError(
            'option "dataDir" (embedded: a directory every executor sees) is required unless the '
            'config (the "config" file or config keys as options) names stores every executor '
            f"shares; missing: {', '.join(missing)}"
        )


def ensure_log_group(client: WoodpeckerClient, name: str, partitions: int) -> None:
    """Create the group and its P logs, or check that the existing group has P partitions."""
    now = client.clock.now_ms()
    try:
        client.meta.create_log_group(name, partitions, now)
    except LogGroupSizeMismatchError as exc:
        have = client.meta.get_log_group(name)
        size = have.partitions if have is not None else "another number of"
        raise LogGroupSizeMismatchError(
            f"{exc}. The route of a key depends on P, so a group keeps its P: write with "
            f'option("partitions", {size}) after prepare(df, key, {size}), or write to a new '
            "log name"
        ) from exc
    for p in range(partitions):
        try:
            client.meta.create_log(log_name(name, p), now, group=name)
        except LogExistsError:
            pass

"""The `woodpecker` data source's options, checked on the driver, and the log group they name.

A write's options travel to the executors with the writer (`SinkOptions` is pickled with it): the
configuration is resolved once, on the driver, so executors need no config file.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import SECTIONS, Config, load_config, parse_text
from ..connect import connect
from ..errors import InvalidArgumentError, LogExistsError, LogGroupSizeMismatchError
from .routing import check_partitions

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

    @classmethod
    def parse(cls, options: Any, need_partitions: bool) -> SinkOptions:
        def get(name: str) -> str | None:
            value = options.get(name)
            return None if value is None or value == "" else str(value)

        name = get("log")
        if name is None:
            raise InvalidArgumentError('option "log" is required: the log group name')
        settings = load_config(get("config"), overrides=_config_options(options))
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
        max_keys = get("windowMaxKeys")
        duration = get("windowDurationS")
        try:
            return cls(
                log=name,
                partitions=check_partitions(parts) if parts is not None else None,
                settings=settings,
                key=get("idempotencyKey"),
                payload=get("payloadColumn"),
                data_dir=data_dir,
                window_max_keys=int(max_keys) if max_keys is not None else None,
                window_duration_s=float(duration) if duration is not None else None,
                report_file=get("reportFile"),
                idempotent=idempotent == "true",
            )
        except ValueError as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(
                f"windowMaxKeys must be an int and windowDurationS a number: {exc}"
            ) from exc

    def connect(self) -> WoodpeckerClient:
        """A client of this task (or driver call), opened here, after the executor forked. Shared
        stores (etcd, S3) use no local directory: the temp directory stands in for dataDir."""
        return connect(self.data_dir or tempfile.gettempdir(), self.settings)

    def writer_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.window_max_keys is not None:
            out["window_max_keys"] = self.window_max_keys
        if self.window_duration_s is not None:
            out["window_duration_s"] = self.window_duration_s
        return out


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


def log_name(group: str, route: int) -> str:
    return f"{group}-{route}"


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

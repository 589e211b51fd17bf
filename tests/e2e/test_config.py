"""Configuration: defaults, precedence, validation of every kind of value, YAML, environment."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from woodpecker_idem.config import (
    KEYS,
    SECTIONS,
    Config,
    FsyncPolicy,
    check_value,
    config_table_markdown,
    load_config,
    parse_fsync,
    parse_size,
)
from woodpecker_idem.errors import ConfigError, WoodpeckerError

MiB = 1024 * 1024


def test_defaults_match_the_design_table() -> None:
    cfg = load_config(env={})
    assert cfg == Config()
    expected = {
        "quorum.es": 1,
        "quorum.tls_ca_cert": None,
        "quorum.tls_client_cert": None,
        "quorum.tls_client_key": None,
        "quorum.nodes": "embedded",
        "quorum.call_timeout_ms": 30_000,
        "writer.lease_ms": 30_000,
        # the design's 1,000 / 10,000 made an fdatasync per 1,000 100 B rows about half of a
        # bulk write's CPU (docs/operations.md, "Throughput: which call")
        "append.max_batch_entries": 10_000,
        "append.max_batch_bytes": 2 * MiB,
        "append.linger_ms": 2,
        "append.max_inflight_entries": 40_000,
        "append.max_inflight_bytes": 64 * MiB,
        "append.timeout_ms": 10_000,
        "append.max_retries": 3,
        "append.max_entry_bytes": 16 * MiB,
        "append.compression": "none",
        "segment.max_size_bytes": 256 * MiB,
        "segment.max_interval_s": 600,
        "segment.max_entries": 1_000_000,
        "idempotency.window_duration_s": 600,
        "idempotency.window_max_keys": 100_000,
        "idempotency.snapshot_interval_s": 30,
        "idempotency.snapshot_threshold": 10_000,
        "idempotency.snapshots_kept": 2,
        "retention.max_age_s": 0,
        "retention.max_bytes": 0,
        "retention.check_interval_s": 60,
        "storage.type": "object",
        "storage.staged_dir": None,
        "storage.staged_grace_s": 60,
        "storage.fsync": "always",
        "objectstore.type": "local",
        "objectstore.path": None,
        "objectstore.endpoint_url": None,
        "objectstore.bucket": None,
        "objectstore.root": "woodpecker",
        "objectstore.region": None,
        "objectstore.access_key_id": None,
        "objectstore.secret_access_key": None,
        "objectstore.profile": None,
        "objectstore.sse": None,
        "objectstore.sse_kms_key_id": None,
        "objectstore.create_bucket": False,
        "objectstore.probe_timeout_s": 5,
        "objectstore.connect_timeout_s": 2,
        "objectstore.read_timeout_s": 5,
        "objectstore.retry_budget_s": 30,
        "meta.type": "sqlite",
        "meta.path": None,
        "meta.endpoints": [],
        "meta.prefix": "/woodpecker",
        "meta.timeout_ms": 5000,
        "meta.ca_cert": None,
        "meta.client_cert": None,
        "meta.client_key": None,
        "meta.user": None,
        "meta.password": None,
    }
    assert cfg.to_dict() == expected
    assert cfg.append.linger_ms == 2 and cfg.get("append.linger_ms") == 2
    assert cfg.quorum.es == 1 and cfg.quorum.wq == 1 and cfg.quorum.aq == 1
    assert cfg.meta.endpoints == ()
    assert not cfg.is_set("append.linger_ms")


def test_every_key_is_documented() -> None:
    table = config_table_markdown()
    for key in KEYS:
        assert f"`{key.name}`" in table
        assert key.meaning and key.allowed()
        assert key.name.split(".")[0] in SECTIONS
        Config.from_dict({key.name: key.default})  # the default passes its own validation


def test_config_is_frozen_and_hashable() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.append = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.append.linger_ms = 5
    with pytest.raises(AttributeError, match="did you mean 'append'"):
        cfg.apend  # noqa: B018
    with pytest.raises(AttributeError, match="linger_ms"):
        cfg.append.linger  # noqa: B018
    assert hash(cfg) == hash(Config())
    assert {cfg: 1}[Config()] == 1


def test_config_pickles() -> None:
    import copy
    import pickle

    cfg = Config.from_dict(
        {"meta": {"type": "etcd", "endpoints": ["h:2379"]}, "append.linger_ms": 0}
    )
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and again.meta.type == "etcd" and not again.is_set("quorum.es")
    assert copy.deepcopy(cfg) == cfg


def test_from_dict_dotted_and_nested() -> None:
    a = Config.from_dict({"append.linger_ms": 5, "quorum": {"es": 3}})
    b = Config.from_dict({"append": {"linger_ms": 5}, "quorum.es": 3})
    assert a == b
    assert a.append.linger_ms == 5 and a.quorum.es == 3 and a.quorum.aq == 2
    with pytest.raises(ConfigError, match="given twice"):
        Config.from_dict({"append.linger_ms": 5, "append": {"linger_ms": 6}})
    assert Config.from_dict(a.to_dict()) == a


def test_precedence_defaults_file_env_overrides(tmp_path: Path) -> None:
    f = tmp_path / "wp.yaml"
    f.write_text(
        "append:\n  linger_ms: 10\n  max_retries: 7\n  timeout_ms: 100\nquorum.es: 3\n",
        encoding="utf-8",
    )
    env = {"WOODPECKER_APPEND_LINGER_MS": "20", "WOODPECKER_APPEND_MAX_RETRIES": "8"}
    cfg = load_config(f, overrides={"append.linger_ms": 30}, env=env)
    assert cfg.append.linger_ms == 30  # overrides win
    assert cfg.append.max_retries == 8  # env beats file
    assert cfg.append.timeout_ms == 100  # file beats default
    assert cfg.quorum.es == 3
    assert cfg.append.max_batch_entries == 10_000  # default
    assert load_config(f, env={}).append.linger_ms == 10
    assert load_config(str(f), env=env).append.linger_ms == 20


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WOODPECKER_APPEND_LINGER_MS", "7")
    assert load_config().append.linger_ms == 7


def test_env_parsing_per_type() -> None:
    env = {
        "WOODPECKER_APPEND_MAX_BATCH_BYTES": "4MiB",
        "WOODPECKER_APPEND_MAX_INFLIGHT_BYTES": "134217728",
        "WOODPECKER_IDEMPOTENCY_WINDOW_DURATION_S": "2.5",
        "WOODPECKER_SEGMENT_MAX_INTERVAL_S": "60",
        "WOODPECKER_STORAGE_TYPE": "object",
        "WOODPECKER_STORAGE_FSYNC": "batch_ms:5",
        "WOODPECKER_META_TYPE": "etcd",
        "WOODPECKER_META_ENDPOINTS": "h1:2379, h2:2379,",
        "WOODPECKER_OBJECTSTORE_PATH": "",
        "WOODPECKER_QUORUM_ES": " 5 ",
        "HOME": "/root",  # not ours: ignored
    }
    cfg = load_config(env=env)
    assert cfg.append.max_batch_bytes == 4 * MiB
    assert cfg.append.max_inflight_bytes == 128 * MiB
    assert cfg.idempotency.window_duration_s == 2.5
    assert cfg.segment.max_interval_s == 60 and isinstance(cfg.segment.max_interval_s, int)
    assert cfg.storage.type == "object"
    assert parse_fsync(cfg.storage.fsync) == FsyncPolicy("batch", 5)
    assert cfg.meta.endpoints == ("h1:2379", "h2:2379")
    assert cfg.objectstore.path is None
    assert cfg.quorum.es == 5


def test_env_errors_name_the_variable() -> None:
    for name, value in [
        ("WOODPECKER_APPEND_LINGER_MS", "fast"),
        ("WOODPECKER_APPEND_LINGER_MS", "2.5"),
        ("WOODPECKER_APPEND_LINGER_MS", "5000"),
        ("WOODPECKER_IDEMPOTENCY_WINDOW_DURATION_S", "nan"),
        ("WOODPECKER_IDEMPOTENCY_WINDOW_DURATION_S", "0"),
        ("WOODPECKER_APPEND_MAX_BATCH_BYTES", "2 parsecs"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(env={name: value})
        assert name in str(info.value)
        assert value in str(info.value)


def test_unknown_env_var_is_ignored_with_a_hint(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="woodpecker_idem.config"):
        cfg = load_config(env={"WOODPECKER_APPEND_LINGER": "5", "WOODPECKER_CI": "true"})
    assert cfg == Config()
    assert "WOODPECKER_APPEND_LINGER_MS" in caplog.text
    assert "WOODPECKER_CI" not in caplog.text


def test_with_overrides() -> None:
    cfg = Config()
    a = cfg.with_overrides({"append.linger_ms": 9})
    b = cfg.with_overrides(append__linger_ms=9)
    c = cfg.with_overrides(append={"linger_ms": 9})
    assert a == b == c and a.append.linger_ms == 9
    assert cfg.append.linger_ms == 2  # the original is unchanged
    assert a.with_overrides(append__max_retries=0).append.linger_ms == 9
    with pytest.raises(ConfigError, match="did you mean 'append.linger_ms'"):
        cfg.with_overrides(append__linger=1)
    with pytest.raises(ConfigError, match="append.linger_ms"):
        cfg.with_overrides(append__linger_ms=-1)


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("append.linger_ms", -1, "0..1000"),
        ("append.linger_ms", 1001, "0..1000"),
        ("append.linger_ms", "5", "0..1000"),  # a string is not an int outside the environment
        ("append.linger_ms", 2.0, "0..1000"),
        ("append.linger_ms", None, "0..1000"),
        ("append.max_batch_entries", 0, "1..100000"),
        ("append.max_batch_entries", 100_001, "1..100000"),
        ("append.max_batch_bytes", 1023, "1 KiB..64 MiB"),
        ("append.max_batch_bytes", "65MiB", "1 KiB..64 MiB"),
        ("append.max_batch_bytes", "lots", "1 KiB..64 MiB"),
        ("append.max_batch_bytes", "1.0000001KiB", "1 KiB..64 MiB"),
        ("append.max_batch_bytes", -5, "1 KiB..64 MiB"),
        ("append.timeout_ms", 0, "1..3600000"),
        ("append.max_retries", 101, "0..100"),
        ("append.max_entry_bytes", 0, "1..256 MiB"),
        ("append.max_entry_bytes", "257MiB", "1..256 MiB"),
        ("segment.max_entries", 2**32, "1..4294967295"),
        ("idempotency.window_duration_s", 0, "> 0"),
        ("idempotency.window_duration_s", -1.5, "> 0"),
        ("idempotency.window_duration_s", float("inf"), "> 0"),
        ("idempotency.window_duration_s", "600", "> 0"),
        ("idempotency.window_max_keys", 0, "1..100000000"),
        ("idempotency.window_max_keys", 10**8 + 1, "1..100000000"),
        ("idempotency.snapshots_kept", 0, "1..100"),
        ("quorum.es", 2, "1, 3, 5"),
        ("quorum.es", "3", "1, 3, 5"),
        ("storage.type", "disk", "one of object, staged"),
        ("storage.type", None, "one of object, staged"),
        ("storage.fsync", "sometimes", "batch_ms:N"),
        ("storage.fsync", "batch_ms:0", "batch_ms:N"),
        ("storage.fsync", "batch_ms:x", "batch_ms:N"),
        ("objectstore.type", "gcs", "local, s3"),
        ("objectstore.endpoint_url", "minio:9000", "http"),
        ("objectstore.root", "/abs", "relative"),
        ("objectstore.root", "a/../b", "relative"),
        ("objectstore.path", 5, "string"),
        ("objectstore.path", "", "non-empty"),
        ("objectstore.sse", "aes256", "null, AES256, aws:kms; did you mean 'AES256'"),
        ("objectstore.sse", "SSE-S3", "null, AES256, aws:kms"),
        ("objectstore.sse", 256, "null, AES256, aws:kms"),
        ("objectstore.sse_kms_key_id", "", "non-empty"),
        ("meta.type", "zookeeper", "sqlite, etcd"),
        ("meta.endpoints", "h1:2379", "list"),
        ("meta.endpoints", ["h1:2379", 5], "list"),
        ("meta.endpoints", ["h1"], "host:port"),
        ("meta.endpoints", ["h1:2379", "ftp://h2:2379"], "host:port"),
        ("meta.timeout_ms", 0, "1..600000"),
        ("meta.prefix", "woodpecker", "'/'"),
    ],
)
def test_invalid_values_name_key_value_and_range(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides={key: value}, env={})
    text = str(info.value)
    assert key in text and repr(value) in text and allowed in text
    assert isinstance(info.value, ValueError) and isinstance(info.value, WoodpeckerError)
    assert info.value.code == "INVALID_CONFIG"


@pytest.mark.parametrize(
    "key",
    ["append.linger_ms", "append.max_batch_bytes", "quorum.es", "idempotency.window_duration_s"],
)
def test_bool_is_not_a_number(key: str) -> None:
    for value in (True, False):
        with pytest.raises(ConfigError, match=key):
            Config.from_dict({key: value})


@pytest.mark.parametrize(
    ("given", "batch", "in_flight"),
    [
        ({}, 10_000, 40_000),
        ({"append.max_inflight_entries": 24}, 24, 24),  # a batch never exceeds what may fly
        ({"append.max_inflight_entries": 100_000}, 10_000, 100_000),
        ({"append.max_batch_entries": 200}, 200, 40_000),
        ({"append.max_batch_entries": 50_000}, 50_000, 200_000),  # room for four batches
        ({"append.max_batch_entries": 300, "append.max_inflight_entries": 600}, 300, 600),
    ],
)
def test_the_batch_and_in_flight_limits_left_unset_follow_the_one_set(given, batch, in_flight):
    append = Config.from_dict(given).append
    assert (append.max_batch_entries, append.max_inflight_entries) == (batch, in_flight)


def test_cross_key_rules() -> None:
    with pytest.raises(ConfigError, match="append.max_inflight_bytes"):
        Config.from_dict({"append.max_entry_bytes": "32MiB", "append.max_inflight_bytes": "16MiB"})
    with pytest.raises(ConfigError, match="append.max_inflight_entries"):
        Config.from_dict({"append.max_batch_entries": 5000, "append.max_inflight_entries": 100})
    with pytest.raises(ConfigError, match="meta.endpoints"):
        Config.from_dict({"meta.type": "etcd"})
    with pytest.raises(ConfigError, match="objectstore.bucket"):
        Config.from_dict({"objectstore.type": "s3"})
    with pytest.raises(ConfigError, match="objectstore.sse_kms_key_id .*objectstore.sse is null"):
        Config.from_dict({"objectstore.sse_kms_key_id": "alias/wal"})
    on_s3 = {"objectstore.type": "s3", "objectstore.bucket": "b"}
    with pytest.raises(ConfigError, match="objectstore.sse: aws:kms .*objectstore.sse is 'AES256'"):
        Config.from_dict(
            {**on_s3, "objectstore.sse": "AES256", "objectstore.sse_kms_key_id": "alias/wal"}
        )
    kms = Config.from_dict(
        {**on_s3, "objectstore.sse": "aws:kms", "objectstore.sse_kms_key_id": "k"}
    )
    assert kms.objectstore.sse_kms_key_id == "k"
    # encryption asked of a local store is refused, not silently ignored
    with pytest.raises(
        ConfigError, match="objectstore.sse = 'AES256': .*objectstore.type is 'local'"
    ):
        Config.from_dict({"objectstore.sse": "AES256"})
    s3 = Config.from_dict({"objectstore": {"type": "s3", "bucket": "b", "region": "eu-west-1"}})
    assert s3.objectstore.bucket == "b"


def test_unknown_keys_with_suggestions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'append.linger_ms'"):
        Config.from_dict({"append.lingr_ms": 1})
    with pytest.raises(ConfigError, match="did you mean 'append.linger_ms'"):
        Config.from_dict({"apend": {"linger_ms": 1}})
    with pytest.raises(ConfigError, match="unknown config key 'zzz'"):
        Config.from_dict({"zzz": 1})
    with pytest.raises(ConfigError, match="is a section"):
        Config.from_dict({"append": 5})
    with pytest.raises(ConfigError, match="did you mean 'append.linger_ms'"):
        Config().get("append.linger")
    f = tmp_path / "wp.yaml"
    f.write_text("idempotency:\n  window_duration: 60\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    assert "window_duration_s" in str(info.value) and str(f) in str(info.value)


def test_sizes() -> None:
    assert parse_size(5) == 5
    assert parse_size("2MiB") == 2 * MiB
    assert parse_size("2 mib") == 2 * MiB
    assert parse_size("512 KiB") == 512 * 1024
    assert parse_size("1.5GiB") == 3 * 512 * MiB
    assert parse_size("10MB") == 10_000_000
    assert parse_size("100") == 100
    assert parse_size("100B") == 100
    for bad in (True, "1.5B", "MiB", "2 MiB/s", 2.0, None, "-1KiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    cfg = Config.from_dict({"segment.max_size_bytes": "1GiB", "append.max_batch_bytes": "1KiB"})
    assert cfg.segment.max_size_bytes == 1024 * MiB
    assert cfg.append.max_batch_bytes == 1024


def test_fsync_policy() -> None:
    assert parse_fsync("always") == FsyncPolicy("always")
    assert parse_fsync("never") == FsyncPolicy("never", 0)
    cfg = Config.from_dict({"storage.fsync": "batch_ms:005"})
    assert cfg.storage.fsync == "batch_ms:5"
    assert parse_fsync(cfg.storage.fsync) == FsyncPolicy("batch", 5)


def test_es_default_is_one_with_either_metadata_backend() -> None:
    """Shared mode (etcd + S3) runs one in-process LogStore per client, as embedded mode does:
    es=3 needs LogStore processes (service mode), so etcd alone does not change the default."""
    assert Config().quorum.es == 1
    etcd = Config.from_dict({"meta": {"type": "etcd", "endpoints": ["h:2379"]}})
    assert etcd.quorum.es == 1 and etcd.quorum.aq == 1 and not etcd.is_set("quorum.es")
    assert etcd.with_overrides(quorum__es=3).quorum.aq == 2
    assert Config.from_dict({"quorum.es": 5}).quorum.aq == 3
    with pytest.raises(ConfigError, match="quorum.es"):
        Config.from_dict({"quorum.es": None})


@pytest.mark.parametrize(
    "load",
    [
        lambda: load_config(env={"WOODPECKER_STORAGE_TYPE": "staged"}),
        lambda: Config().with_overrides({"storage.type": "staged"}),
    ],
    ids=["env", "overrides"],
)
def test_staged_storage_is_a_storage_type_with_its_own_keys(load) -> None:
    cfg = load()
    assert cfg.storage.type == "staged"
    assert check_value("storage.type", "staged") == "staged"
    staged = cfg.with_overrides({"storage.staged_dir": "/d", "storage.staged_grace_s": 0.5})
    assert staged.storage.staged_dir == "/d" and staged.storage.staged_grace_s == 0.5


def test_the_staged_keys_are_refused_with_object_storage() -> None:
    """They would do nothing there: the message names the key that picks the mode."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"storage.staged_dir": "/d"})
    assert "storage.staged_dir" in str(info.value) and "storage.type" in str(info.value)


def test_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "wp.yaml"
    f.write_text(
        """
quorum:
  es: 3
append:
  max_batch_bytes: 4MiB
  linger_ms: 0
segment.max_interval_s: 1.5
storage:
  type: object
  fsync: never
objectstore:
  type: s3
  bucket: wal
  endpoint_url: http://localhost:9000
meta:
  type: etcd
  endpoints: [a:2379, b:2379]
  prefix: /wp
""",
        encoding="utf-8",
    )
    cfg = load_config(f, env={})
    assert cfg.quorum.es == 3 and cfg.append.max_batch_bytes == 4 * MiB
    assert cfg.append.linger_ms == 0 and cfg.segment.max_interval_s == 1.5
    assert cfg.storage.type == "object" and cfg.storage.fsync == "never"
    assert cfg.objectstore.endpoint_url == "http://localhost:9000"
    assert cfg.meta.endpoints == ("a:2379", "b:2379") and cfg.meta.prefix == "/wp"
    assert cfg.is_set("meta.prefix")


def test_yaml_file_problems(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert load_config(empty, env={}) == Config()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("append: [1, 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken, env={})
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy, env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("append:\n  linger_ms: yes\n", encoding="utf-8")  # YAML 1.1: a bool
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    assert "append.linger_ms = True" in str(info.value) and str(bad) in str(info.value)


def test_derived_paths(tmp_path: Path) -> None:
    cfg = Config()
    assert cfg.meta_path(tmp_path) == tmp_path / "meta.sqlite"
    assert cfg.objectstore_path(tmp_path) == tmp_path / "objects"
    set_ = cfg.with_overrides(meta__path="/x/m.db", objectstore__path="/x/o")
    assert set_.meta_path(tmp_path) == Path("/x/m.db")
    assert set_.objectstore_path(tmp_path) == Path("/x/o")


# --- S3 credentials and failure budget (issue 13) ------------------------------------------------


S3 = {"objectstore.type": "s3", "objectstore.bucket": "b"}
S3_ENV = {"WOODPECKER_OBJECTSTORE_TYPE": "s3", "WOODPECKER_OBJECTSTORE_BUCKET": "b"}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"objectstore.bucket": "b"}, r"objectstore.bucket = 'b': only objectstore.type s3 reads"),
        ({"objectstore.read_timeout_s": 9}, r"objectstore.read_timeout_s = 9(\.0)?: only"),
        (
            {**S3, "objectstore.path": "/data/objects"},
            r"objectstore.path = '/data/objects': only objectstore.type local reads it, and "
            r"objectstore.type is 's3'",
        ),
        ({"meta.endpoints": ["h:2379"]}, r"meta.endpoints = .*only meta.type etcd reads it"),
        (
            {"meta.type": "etcd", "meta.endpoints": ["h:2379"], "meta.path": "/m.sqlite"},
            r"meta.path = '/m.sqlite': only meta.type sqlite reads it, and meta.type is 'etcd'; "
            r"remove it, or set meta.type: sqlite",
        ),
    ],
)
def test_a_key_of_a_backend_not_in_use_is_refused(given, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(given)


def test_a_backend_key_left_at_its_default_passes() -> None:
    assert Config({"objectstore.endpoint_url": None, "meta.prefix": "/woodpecker"})


def test_credentials_of_a_backend_not_in_use_are_refused_and_the_secret_unshown() -> None:
    with pytest.raises(ConfigError, match="meta.user = 'u': only meta.type etcd") as info:
        Config({"meta.user": "u", "meta.password": "pw-1234"})
    assert "pw-1234" not in str(info.value)
    with pytest.raises(ConfigError, match="objectstore.access_key_id = 'AKIA2'") as info:
        Config({"objectstore.access_key_id": "AKIA2", "objectstore.secret_access_key": "s3-99"})
    assert "s3-99" not in str(info.value)


def test_create_bucket_is_a_bool_from_yaml_and_env() -> None:
    assert load_config(env=S3_ENV).objectstore.create_bucket is False
    env = {**S3_ENV, "WOODPECKER_OBJECTSTORE_CREATE_BUCKET": "true"}
    assert load_config(env=env).objectstore.create_bucket is True
    env = {**S3_ENV, "WOODPECKER_OBJECTSTORE_CREATE_BUCKET": "off"}
    assert load_config(env=env).objectstore.create_bucket is False
    with pytest.raises(ConfigError, match="objectstore.create_bucket.*true or false"):
        load_config(env={**S3_ENV, "WOODPECKER_OBJECTSTORE_CREATE_BUCKET": "maybe"})
    with pytest.raises(ConfigError, match="objectstore.create_bucket.*true or false"):
        Config({**S3, "objectstore.create_bucket": "yes"})


def test_s3_budgets_are_validated() -> None:
    assert Config({**S3, "objectstore.probe_timeout_s": 0.5}).objectstore.probe_timeout_s == 0.5
    for key in ("probe_timeout_s", "connect_timeout_s", "read_timeout_s", "retry_budget_s"):
        with pytest.raises(ConfigError, match=f"objectstore.{key}"):
            Config({**S3, f"objectstore.{key}": 0})


def test_s3_credentials_go_together_and_the_secret_is_never_shown() -> None:
    cfg = Config(
        {**S3, "objectstore.access_key_id": "AKIA1", "objectstore.secret_access_key": "s3cr3t"}
    )
    assert cfg.objectstore.secret_access_key == "s3cr3t"
    assert "s3cr3t" not in repr(cfg) and "AKIA1" in repr(cfg)
    with pytest.raises(ConfigError, match="go together"):
        Config({**S3, "objectstore.access_key_id": "AKIA1"})
    with pytest.raises(ConfigError, match="go together"):
        Config({**S3, "objectstore.secret_access_key": "s3cr3t"})
    with pytest.raises(ConfigError, match="profile") as info:
        Config(
            {
                **S3,
                "objectstore.profile": "p",
                "objectstore.access_key_id": "AKIA1",
                "objectstore.secret_access_key": "s3cr3t",
            }
        )
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(ConfigError, match="secret_access_key") as info:
        Config({**S3, "objectstore.secret_access_key": 12345678})
    assert "12345678" not in str(info.value)

"""node.toml parsing: defaults, and a one-line reason naming the setting for each mistake."""
from __future__ import annotations

import pytest

import dataclasses
import os
import re
import subprocess

import vrepl.node
from vrepl.child import python_argv
from vrepl.errors import ConfigError
from vrepl.node.config import load_config, parse_config
from vrepl.restore.config import RestoreConfig


def base(**over):
    doc = {"node_id": 1, "data_dir": "/tmp/vrepl-x", "secret": "s",
           "nodes": [{"id": 1, "replication": "127.0.0.1:7001", "http": "127.0.0.1:7101"},
                     {"id": 2, "replication": "127.0.0.1:7002", "http": "127.0.0.1:7102"},
                     {"id": 3, "replication": "127.0.0.1:7003", "http": "127.0.0.1:7103"}],
           "vgroups": [{"id": 1, "replicas": [1, 2, 3], "quorum": 2}]}
    doc.update(over)
    return doc


def test_defaults():
    cfg = parse_config(base())
    assert cfg.http_listen == ("127.0.0.1", 7101)
    assert cfg.http.max_body_bytes == 8 * 1024 * 1024
    assert (cfg.http.header_timeout_ms, cfg.http.body_timeout_ms, cfg.http.idle_timeout_ms) == (
        10_000, 10_000, 60_000)
    assert cfg.http.token is None and not cfg.http.tls
    assert cfg.vnode.max_memtable_rows == 1_000_000
    sc = cfg.sync_config(cfg.vgroups[0])
    assert sc.self_index == 0 and sc.quorum == 2 and sc.data_path.endswith("vg1")
    assert (cfg.log_format, cfg.log_file) == ("text", None)


def test_log_settings_relative_to_the_config_file():
    cfg = parse_config(base(log_format="json", log_file="logs/n1.log"), "/etc/vrepl/node.toml")
    assert (cfg.log_format, cfg.log_file) == ("json", "/etc/vrepl/logs/n1.log")


ROUTABLE = [{"id": 1, "replication": "10.0.0.1:7001", "http": "10.0.0.1:7101"},
            {"id": 2, "replication": "10.0.0.2:7001", "http": "10.0.0.2:7101"}]


@pytest.mark.parametrize("http,listen,expect", [
    ("10.0.0.1:7101", None, ("127.0.0.1", 7101)),           # routable: loopback by default
    ("node1.example:7101", None, ("127.0.0.1", 7101)),
    ("127.0.0.2:7101", None, ("127.0.0.2", 7101)),          # already loopback: as given
    ("[::1]:7101", None, ("::1", 7101)),
    ("localhost:7101", None, ("localhost", 7101)),
    ("10.0.0.1:7101", "0.0.0.0:7101", ("0.0.0.0", 7101)),   # the operator's choice
    ("10.0.0.1:7101", "10.0.0.1:7101", ("10.0.0.1", 7101)),
])
def test_listen_defaults_to_loopback(http, listen, expect):
    nodes = [dict(ROUTABLE[0], http=http), ROUTABLE[1]]
    doc = base(nodes=nodes, vgroups=[{"id": 1, "replicas": [1, 2]}])
    if listen:
        doc["http"] = {"listen": listen}
    assert parse_config(doc).http_listen == expect


def test_token_and_tls_files(tmp_path):
    from vrepl.testing.tls import make_tls_files

    f = make_tls_files(str(tmp_path / "tls"))
    (tmp_path / "token").write_text("  abc-DEF_123.~+/=  \n")
    cfg = parse_config(base(http={"token_file": "token", "tls_cert": f.cert, "tls_key": f.key}),
                       str(tmp_path / "node.toml"))
    assert cfg.http.token == b"abc-DEF_123.~+/=" and cfg.http.tls
    assert cfg.http.token_file == str(tmp_path / "token")      # relative to the config file
    assert "abc" not in repr(cfg.http)


def test_token_and_tls_refusals(tmp_path):
    from vrepl.testing.tls import make_tls_files

    f = make_tls_files(str(tmp_path / "tls"))
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "spaced").write_text("two words\n")
    for http, words in [
        ({"token_file": "nope"}, "http.token_file"),
        ({"token_file": "empty"}, "the token is empty"),
        ({"token_file": "spaced"}, "a space"),
        ({"token_file": ""}, "http.token_file is empty"),
        ({"token_file": 5}, "http.token_file must be str"),
        ({"token": "inline"}, "unknown setting http.token"),
        ({"tls_cert": f.cert}, "give both http.tls_cert and http.tls_key"),
        ({"tls_cert": "nope.pem", "tls_key": f.key}, "http.tls_cert"),
        ({"tls_cert": f.cert, "tls_key": f.other_key}, "does not match"),
        ({"header_timeout_ms": 0}, "http.header_timeout_ms must be > 0"),
        ({"body_timeout_ms": -1}, "http.body_timeout_ms must be > 0"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_config(base(http=http), str(tmp_path / "node.toml"))
        assert words in str(exc.value) and "\n" not in str(exc.value), (http, str(exc.value))


BAD = [
    ({"node_id": "1"}, "node_id must be int"),
    ({"node_id": 9}, "node_id 9 is not in [[nodes]]"),
    ({"secret": ""}, "secret"),
    ({"log_level": "LOUD"}, "log_level"),
    ({"log_format": "xml"}, "log_format 'xml' is not one of text, json"),
    ({"bogus": 1}, "unknown setting bogus"),
    ({"http": {"max_body_bytes": 0}}, "http.max_body_bytes must be > 0"),
    ({"http": {"listen": "nowhere"}}, "http.listen 'nowhere' is not host:port"),
    ({"http": {"speed": 1}}, "unknown setting http.speed"),
    ({"vnode": {"precision": "ns"}}, "precision"),
    ({"vnode": {"max_memtable_rows": "many"}}, "vnode.max_memtable_rows must be int"),
    ({"sync": {"tick_ms": "fast"}}, "sync.tick_ms must be int"),
    ({"sync": {"nope": 1}}, "unknown setting sync.nope"),
    ({"sync": {"max_wal_file_bytes": 0}}, "vgroup 1: max_wal_file_bytes must be >= 36"),
    ({"sync": {"max_wal_inline_sync_bytes": -1}}, "vgroup 1: max_wal_inline_sync_bytes must be >= 0"),
    ({"sync": {"max_wal_inline_commit_us": -1}}, "vgroup 1: max_wal_inline_commit_us must be >= 0"),
    ({"restore": {"io_timeout_s": 0}}, "restore.io_timeout_s must be > 0"),
    ({"restore": {"max_concurrent_restores": 0}}, "restore.max_concurrent_restores must be >= 1"),
    ({"restore": {"enabled": 1}}, "restore.enabled must be bool"),
    ({"restore": {"connect_timeout_s": "5"}}, "restore.connect_timeout_s must be float"),
    ({"restore": {"speed": 1}}, "unknown setting restore.speed"),
    ({"restore": 3}, "[restore] must be a table"),
    ({"vgroups": [{"id": 1, "replicas": [1, 2, 7]}]}, "node 7 is not in [[nodes]]"),
    ({"vgroups": [{"id": 1, "replicas": [2, 3]}]}, "do not include this node"),
    ({"vgroups": [{"id": 1, "replicas": [1, 2, 3], "quorum": 5}]}, "quorum 5"),
    ({"vgroups": []}, "[[vgroups]] is missing"),
    ({"nodes": [{"id": 1, "replication": "127.0.0.1:7001", "http": "127.0.0.1:7001"}]},
     "used twice"),
]


@pytest.mark.parametrize("over,words", BAD, ids=[w for _, w in BAD])
def test_wrong_setting_is_one_line_naming_it(over, words):
    with pytest.raises(ConfigError) as exc:
        parse_config(base(**over))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_restore_settings_reach_every_vgroup():
    cfg = parse_config(base(restore={"min_lag_versions": 50, "io_timeout_s": 7,
                                     "poll_interval_s": 0.5, "allow_backup": False}))
    assert cfg.restore == RestoreConfig(min_lag_versions=50, io_timeout_s=7.0,
                                        poll_interval_s=0.5, allow_backup=False)
    assert parse_config(base()).restore == RestoreConfig()


EXAMPLE = os.path.join(os.path.dirname(vrepl.node.__file__), "node.example.toml")


def test_the_shipped_example_is_valid_and_shows_the_defaults(tmp_path):
    """vrepl/node/node.example.toml (installed with the package, named by `vrepl node
    --help`) loads, and every setting it writes out is the default."""
    text = open(EXAMPLE).read()
    secret_line = 'secret_file = "/etc/vrepl/cluster.secret"'
    assert secret_line in text
    (tmp_path / "cluster.secret").write_text("s3cret\n")
    path = tmp_path / "node.toml"
    path.write_text(text.replace(secret_line, 'secret_file = "cluster.secret"'))
    cfg = load_config(str(path))
    assert (cfg.node_id, cfg.data_dir, cfg.secret) == (1, "/var/lib/vrepl", b"s3cret")
    assert [n.replication_endpoint for n in cfg.nodes.values()] == [
        "10.0.0.1:6101", "10.0.0.2:6101", "10.0.0.3:6101"]
    assert [(g.id, g.replicas) for g in cfg.vgroups] == [(1, (1, 2, 3))]
    defaults = parse_config(base())
    for section in ("http", "vnode", "restore", "txn"):
        assert getattr(cfg, section) == getattr(defaults, section), section
    default_sync = defaults.sync_config(defaults.vgroups[0])
    assert cfg.sync and {k: getattr(default_sync, k) for k in cfg.sync} == cfg.sync
    assert (cfg.log_level, cfg.log_file, cfg.flush_check_ms, cfg.stop_timeout_ms) == (
        defaults.log_level, defaults.log_file, defaults.flush_check_ms, defaults.stop_timeout_ms)
    assert cfg.log_format == defaults.log_format


def test_the_shipped_example_names_every_setting():
    """docs/operations.md calls the example complete: every key of [http], [vnode], [sync]
    (but those [[vgroups]] sets), [restore] and [txn] is in it, set or commented out."""
    text = open(EXAMPLE).read()
    written = set(re.findall(r"^#? *([a-z_]+) *=", text, re.M))
    from vrepl.config import SyncConfig
    from vrepl.node.config import HttpSettings
    from vrepl.vnode import VnodeConfig
    per_vgroup = {"vgroup_id", "replicas", "self_index", "data_path", "secret", "quorum",
                  "initial_version", "initial_epoch", "arbitrator"}
    from vrepl.txn.config import TxnConfig
    wanted = {f.name for cls in (VnodeConfig, RestoreConfig, TxnConfig) for f in dataclasses.fields(cls)}
    wanted |= {f.name for f in dataclasses.fields(SyncConfig)} - per_vgroup
    wanted |= {f.name for f in dataclasses.fields(HttpSettings)} - {"token"}
    wanted |= {"log_file", "log_format", "log_level", "flush_check_ms", "stop_timeout_ms"}
    assert wanted - written == set()


@pytest.mark.parametrize("senders,reason", [
    ([{"secret": "x" * 16}], "ship.senders[0].id is missing"),
    ([{"id": 0, "secret": "x" * 16}], "ship.senders[0].id must be in 1..2^31-1, got 0"),
    ([{"id": 7, "secret": "x" * 16}, {"id": 7, "secret": "y" * 16}], "ship.senders[1].id 7 appears twice"),
    ([{"id": 7, "secret": "x" * 16, "secret_file": "s"}], "ship.senders[0]: give secret or secret_file, not both"),
    (["x"], "ship.senders[0] must be a table"),
])
def test_ship_sender_mistakes_are_one_line_naming_the_entry(senders, reason):
    with pytest.raises(ConfigError) as exc:
        parse_config(base(ship={"senders": senders}))
    assert reason in str(exc.value) and "\n" not in str(exc.value)
    assert ".:" not in str(exc.value)


def test_vrepl_node_refuses_a_wal_file_limit_below_one_record_header(tmp_path):
    """docs/operations.md §Configuration: an out-of-range value stops the node at start with
    exit code 2 and one line naming the key (the WAL used to refuse it only once opened:
    a traceback, exit 1)."""
    conf = tmp_path / "node.toml"
    conf.write_text('node_id = 1\ndata_dir = "d"\nsecret = "s"\n'
                    '[[nodes]]\nid = 1\nreplication = "127.0.0.1:7001"\nhttp = "127.0.0.1:7101"\n'
                    '[[vgroups]]\nid = 1\nreplicas = [1]\n[sync]\nmax_wal_file_bytes = 0\n')
    p = subprocess.run(python_argv("-m", "vrepl.cli", "node", "--config", str(conf)),
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stderr.splitlines()) == (2, [
        f"vrepl: error: {conf}: vgroup 1: max_wal_file_bytes must be >= 36 (one record header)"])
    assert not (tmp_path / "d").exists()

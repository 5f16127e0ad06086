"""node.toml parsing: defaults, and a one-line reason naming the setting for each mistake."""
from __future__ import annotations

import pytest

from vrepl.errors import ConfigError
from vrepl.node.config import parse_config


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
    assert cfg.vnode.memtable_max_rows == 1_000_000
    sc = cfg.sync_config(cfg.vgroups[0])
    assert sc.self_index == 0 and sc.quorum == 2 and sc.data_path.endswith("vg1")


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
    ({"bogus": 1}, "unknown setting bogus"),
    ({"http": {"max_body_bytes": 0}}, "http.max_body_bytes must be > 0"),
    ({"http": {"listen": "nowhere"}}, "http.listen 'nowhere' is not host:port"),
    ({"http": {"speed": 1}}, "unknown setting http.speed"),
    ({"vnode": {"precision": "ns"}}, "precision"),
    ({"vnode": {"memtable_max_rows": "many"}}, "vnode.memtable_max_rows must be int"),
    ({"sync": {"tick_ms": "fast"}}, "sync.tick_ms must be int"),
    ({"sync": {"nope": 1}}, "unknown setting sync.nope"),
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

"""One naming order for limits, `max_<what>_<unit>` (vrepl/renamed.py), and the old names of
the renamed ones still accepted: in node.toml, as keywords of VnodeConfig and SyncConfig, and
as attributes, each with one RenamedSetting warning naming the new name
(docs/operations.md §Configuration)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import warnings
from pathlib import Path

import pytest

from arbitrator.server import ArbitratorConfig
from vrepl.child import python_argv
from vrepl.config import RENAMED_SYNC_SETTINGS, SyncConfig
from vrepl.errors import ConfigError, RenamedSetting
from vrepl.node.config import HttpSettings, parse_config
from vrepl.restore.config import RestoreConfig
from vrepl.vnode.config import RENAMED_VNODE_SETTINGS, VnodeConfig

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_CLASSES = (SyncConfig, VnodeConfig, RestoreConfig, HttpSettings, ArbitratorConfig)
# A value range, not a limit: the accepted ts lies in [ts_min, ts_max] (and the archived
# files' index columns are named so on disk).
NOT_LIMITS = {"ts_min", "ts_max"}


def sync(**kw):
    return SyncConfig(vgroup_id=1, replicas=((1, "127.0.0.1:7001"),), self_index=0,
                      data_path="/tmp/x", secret=b"s", **kw)


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_every_limit_is_named_max_first(cls):
    names = [f.name for f in dataclasses.fields(cls) if f.name not in NOT_LIMITS]
    assert not [n for n in names if re.search(r"_max(_|$)", n)], names


@pytest.mark.parametrize("old, new", sorted(RENAMED_SYNC_SETTINGS.items()))
def test_sync_config_accepts_and_reads_the_old_name(old, new):
    value = getattr(sync(), new) + 1
    with pytest.warns(RenamedSetting, match=rf"SyncConfig: {old} is now {new}"):
        cfg = sync(**{old: value})
    assert getattr(cfg, new) == value and getattr(cfg, old) == value
    with pytest.warns(RenamedSetting):
        assert getattr(cfg.replace(**{old: value + 1}), new) == value + 1
    with pytest.raises(TypeError, match=f"give {new}"):
        sync(**{old: value, new: value})


@pytest.mark.parametrize("old, new", sorted(RENAMED_VNODE_SETTINGS.items()))
def test_vnode_config_accepts_and_reads_the_old_name(old, new):
    with pytest.warns(RenamedSetting, match=rf"VnodeConfig: {old} is now {new}"):
        cfg = VnodeConfig(**{old: 7})
    assert getattr(cfg, new) == 7 and getattr(cfg, old) == 7


def test_the_new_names_give_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sync(max_record_bytes=1024).max_record_bytes == 1024
        assert VnodeConfig(max_memtable_rows=5).max_memtable_rows == 5


def node_doc(**over):
    doc = {"node_id": 1, "data_dir": "/tmp/vrepl-x", "secret": "s",
           "nodes": [{"id": 1, "replication": "127.0.0.1:7001", "http": "127.0.0.1:7101"}],
           "vgroups": [{"id": 1, "replicas": [1]}]}
    doc.update(over)
    return doc


def test_node_toml_old_names_are_mapped_with_a_warning():
    doc = node_doc(vnode={"memtable_max_rows": 500, "dedup_max_entries": 9},
                   sync={"wal_max_file_bytes": 65536, "record_max_bytes": 1 << 25})
    with pytest.warns(RenamedSetting) as got:
        cfg = parse_config(doc, "/etc/vrepl/node.toml")
    assert {str(w.message) for w in got} == {
        f"/etc/vrepl/node.toml: {s}.{o} is now {s}.{n} (the old name is deprecated)"
        for s, o, n in (("vnode", "memtable_max_rows", "max_memtable_rows"),
                        ("vnode", "dedup_max_entries", "max_dedup_entries"),
                        ("sync", "wal_max_file_bytes", "max_wal_file_bytes"),
                        ("sync", "record_max_bytes", "max_record_bytes"))}
    assert (cfg.vnode.max_memtable_rows, cfg.vnode.max_dedup_entries) == (500, 9)
    sc = cfg.sync_config(cfg.vgroups[0])
    assert (sc.max_wal_file_bytes, sc.max_record_bytes) == (65536, 1 << 25)


@pytest.mark.parametrize("over, message", [
    ({"vnode": {"memtable_max_rows": 0}},
     "vnode.max_memtable_rows (written memtable_max_rows) must be a positive integer, got 0"),
    ({"vnode": {"memtable_max_age_ms": "1s"}},
     "vnode.max_memtable_age_ms (written memtable_max_age_ms) must be int, got '1s'"),
    ({"sync": {"record_max_bytes": 1000}},
     "vnode.max_payload_bytes is above sync.max_record_bytes (written record_max_bytes)"),
    ({"sync": {"send_queue_max_bytes": 1}},
     "max_send_queue_bytes (written send_queue_max_bytes) must be >= send_queue_high_bytes"),
    ({"vnode": {"memtable_max_rows": 5, "max_memtable_rows": 5}},
     "vnode.memtable_max_rows and vnode.max_memtable_rows are one setting"),
    # the replication core checks these three under their old names: the line names the new one
    ({"sync": {"max_record_bytes": 0}}, "vgroup 1: max_record_bytes must be >= 1"),
    ({"sync": {"sync_cache_max_records": 0}},
     "vgroup 1: max_sync_cache_records (written sync_cache_max_records) must be >= 1"),
    ({"sync": {"max_sync_cache_bytes": 0}}, "vgroup 1: max_sync_cache_bytes must be >= 1"),
])
def test_node_toml_errors_name_the_setting_as_written(over, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedSetting)
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_config(node_doc(**over))


def test_vrepl_node_prints_the_warning_as_one_line(tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_text('node_id = 1\ndata_dir = "d"\nsecret = "s"\n'
                    '[[nodes]]\nid = 1\nreplication = "127.0.0.1:7001"\nhttp = "127.0.0.1:7101"\n'
                    '[[vgroups]]\nid = 1\nreplicas = [1]\n[vnode]\nmemtable_max_rows = 0\n')
    p = subprocess.run(python_argv("-m", "vrepl.cli", "node", "--config", str(conf)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        f"vrepl: warning: {conf}: vnode.memtable_max_rows is now vnode.max_memtable_rows"
        " (the old name is deprecated)",
        f"vrepl: error: {conf}: vnode.max_memtable_rows (written memtable_max_rows) must be a"
        " positive integer, got 0"]


def test_the_docs_give_each_renamed_setting_its_former_name():
    ops = (ROOT / "docs" / "operations.md").read_text()
    for old, new in {**RENAMED_SYNC_SETTINGS, **RENAMED_VNODE_SETTINGS}.items():
        assert f"`{new}` (formerly `{old}`)" in ops, new
    example = (ROOT / "vrepl" / "node" / "node.example.toml").read_text()
    assert not [old for old in {**RENAMED_SYNC_SETTINGS, **RENAMED_VNODE_SETTINGS}
                if re.search(rf"^#? ?{old} =", example, re.M)]

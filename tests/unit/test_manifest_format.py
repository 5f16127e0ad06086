"""vrepl/manifest.py: an archived file's manifest entry names every field of ArchivedFile,
in its order, and the entry of a flushed file stays manifest format 1's."""
from __future__ import annotations

import dataclasses
import json

from vrepl.manifest import ArchivedFile, Manifest

INGEST_FIELDS = ("ingest_version", "ingest_epoch", "origin")


def _file(i: int, ingested: bool) -> ArchivedFile:
    return ArchivedFile(f"data/t{i}/b{i}-i7-{i}.parquet", 1000 + i, 0x1234 + i, f"t{i}", i,
                        i * 10, i * 10 + 9, 1, 3, 10 + i,
                        *((7, 2, "ship:7") if ingested else ()))


def test_an_entry_names_every_field_in_order():
    """A field added to ArchivedFile must reach the manifest (to_json writes them one by
    one): compare with the dataclass's own list."""
    f = _file(3, ingested=True)
    fields = [fl.name for fl in dataclasses.fields(ArchivedFile)]
    doc = f.to_json(5)
    assert list(doc) == ["index", *fields]
    assert doc == {"index": 5, **dataclasses.asdict(f)}


def test_a_flushed_files_entry_is_format_1s():
    f = _file(4, ingested=False)
    doc = f.to_json(0)
    assert not set(INGEST_FIELDS) & set(doc)
    assert doc == {"index": 0, **{k: v for k, v in dataclasses.asdict(f).items() if k not in INGEST_FIELDS}}


def test_the_manifest_reads_back_what_it_wrote():
    m = Manifest("ms", 86_400_000, 9, 2, {"t1": {"v": "float"}},
                 [_file(i, ingested=bool(i % 2)) for i in range(1, 6)])
    data = m.to_bytes()
    assert Manifest.from_bytes(data, "manifest.json") == m
    assert json.loads(data)["files"][0]["origin"] == "ship:7"      # _file(1): ingested

"""Turn a pytest-benchmark JSON file into the tables of docs/benchmarks.md.

Usage: python bench/report.py RESULTS.json
Prints markdown: throughput per benchmark (records/s, GB/s from the median) and the ratios
the issue targets name, all from the same run.
"""
from __future__ import annotations

import json
import sys


def load(path: str) -> dict[str, dict]:
    with open(path) as fh:
        data = json.load(fh)
    return {b["name"]: b for b in data["benchmarks"]}, data.get("machine_info", {})


def rate(b: dict) -> tuple[float, float]:
    median_s = b["stats"]["median"]
    info = b.get("extra_info", {})
    return info.get("records", 0) / median_s, info.get("bytes", 0) / median_s


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    benches, machine = load(argv[1])
    cpu = machine.get("cpu", {}).get("brand_raw", "?")
    print(f"Machine: {cpu}, {machine.get('cpu', {}).get('count', '?')} cores, "
          f"Python {machine.get('python_version', '?')}\n")
    print("| benchmark | median | records/s | GB/s |")
    print("|---|---:|---:|---:|")
    for name, b in benches.items():
        recs, byts = rate(b)
        med = b["stats"]["median"]
        unit = f"{med * 1e6:,.1f} µs" if med < 1e-2 else f"{med * 1e3:,.2f} ms"
        print(f"| {name} | {unit} | {recs:,.0f} | {byts / 1e9:.2f} |")
    pairs = [
        ("WAL group commit (1 fsync/batch) vs raw write+fsync per batch",
         "test_wal_append_batch[group]", "test_raw_write_batch[fsync-per-batch]", 0.8),
        ("WAL durability none vs raw write", "test_wal_append_batch[none]",
         "test_raw_write_batch[no-fsync]", None),
        ("WAL fsync per record vs raw write+fsync per record",
         "test_wal_append_fsync_per_record", "test_raw_write_fsync_per_record", None),
        ("decode+verify vs encode, 128 B", "test_decode_verify_128", "test_encode_batch_128", 1.0),
        ("decode+verify vs encode, 4 KiB", "test_decode_verify_4k", "test_encode_batch_4k", 1.0),
        ("CRC-32C hardware vs slicing-by-8", "test_crc32c_64mib_hw", "test_crc32c_64mib_sw", None),
    ]
    print("\n| ratio (same run, medians) | value | target |")
    print("|---|---:|---:|")
    for label, a, b, target in pairs:
        if a in benches and b in benches:
            ratio = benches[b]["stats"]["median"] / benches[a]["stats"]["median"]
            tgt = f">= {target}" if target else "-"
            print(f"| {label} | {ratio:.2f} | {tgt} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

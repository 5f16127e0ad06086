#!/usr/bin/env bash
# Runs the foundation micro-benchmarks (codec, CRC-32C, WAL) and prints the markdown tables
# recorded in docs/benchmarks.md. Usage: bash bench/run_foundation.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/vrepl-bench-foundation.json}
python -m pytest bench/bench_codec.py bench/bench_wal.py -q -p no:cacheprovider \
  -o python_files='bench_*.py' -o testpaths=bench --benchmark-json="$out" >/dev/null
python bench/report.py "$out"

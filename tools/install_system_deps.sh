#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing:
#   iproute2, nftables      network namespaces and partitions for tests/chaos
#   openjdk-17-jre-headless Java for the Spark validation (tests/spark)
#   rsync                   the baseline of bench/bench_ship.py (an rsync daemon on loopback)
# Needs root (apt-get); without root it only reports what is missing, and the tests that need
# a missing tool skip with a reason (or, for chaos, fall back to loopback).
set -euo pipefail
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; then
  need+=(openjdk-17-jre-headless)
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "system dependencies: all present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system dependencies missing (install as root): ${need[*]}" >&2
  exit 0
fi
echo "installing: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

"""Instruction counts of the Cython hot path (issue 8, deliver item 2: callgrind for the
Cython parts), and its wall time.

One "round trip" is what the codecs do for a batch of N records forwarded to one slave:
    master: wire.encode_records (the WAL block) + wire.encode_forward_frame (the frame)
    slave:  FrameBuffer.feed + next_frame (framing) + wire.decode_forward_body (split and
            check) + record.scan (the WAL append's check)

    python bench/callgrind_codecs.py                 # callgrind, 100 records of 116 B
    python bench/callgrind_codecs.py --size 11600    # 100 records of 11.6 KB
    python bench/callgrind_codecs.py --time          # wall time only, no valgrind

Callgrind runs the loop twice (--iterations and twice as many) and prints the difference
divided by --iterations: the instructions of one round trip, per function, with start-up
and import costs cancelled out. Needs valgrind (Debian package valgrind); callgrind_annotate
comes with it.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vrepl.child import python_argv  # noqa: E402


def round_trips(count: int, records: int, size: int) -> None:
    from vrepl._core import record as rec
    from vrepl._core import wire
    from vrepl._core.framebuf import FrameBuffer
    payloads = [bytes([i % 251]) * size for i in range(records)]
    epochs = [3] * records
    fb = FrameBuffer()
    for k in range(count):
        first = 1 + k * records
        block = wire.encode_records(first, epochs, payloads)
        frame = wire.encode_forward_frame(35, first, 3, 3, block)   # 35: FORWARD_BATCH
        fb.feed(frame)
        f = fb.next_frame()
        _, _, _, body_block = wire.decode_forward_body(f.payload, first, 1 << 24)
        scan = rec.scan(body_block, expect_version=first)
        if scan.count != records:
            raise SystemExit(f"scan found {scan.count} records, expected {records}")


def callgrind_profile(iterations: int, records: int, size: int) -> dict[str, float]:
    """Instructions per round trip, per function (callgrind_annotate's self cost)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="vrepl-cg-") as tmp:
        for n in (iterations, 2 * iterations):
            path = os.path.join(tmp, f"cg.{n}")
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={path}",
                            *python_argv(os.path.abspath(__file__)), "--run", str(n),
                            "--records", str(records), "--size", str(size)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            text = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no",
                                   "--threshold=100", path],
                                  check=True, capture_output=True, text=True).stdout
            costs = {}
            for line in text.splitlines():   # "  1,234 ( 5.6%)  file:function [object]"
                m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
                if m:
                    name = m.group(2).split(" [")[0]
                    costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
            out[n] = costs
    a, b = out[iterations], out[2 * iterations]
    return {k: (b.get(k, 0) - a.get(k, 0)) / iterations for k in set(a) | set(b)}


def short(name: str) -> str:
    """'/path/frame.c:__pyx_f_5vrepl_5_core_5frame_write_record.part.0' ->
    'frame.c: write_record.part.0' (Cython prefixes each module path part with its length;
    a wrapper's name keeps the counter Cython puts before it, e.g. '3encode_records')."""
    path, _, func = name.rpartition(":")
    m = re.match(r"__pyx_[a-z]+_", func)
    if m:
        rest = func[m.end():]
        for _ in range(3):   # vrepl, _core, the module; what follows is the function
            d = re.match(r"_?(\d+)", rest)
            if not d:
                break
            k = int(d.group(1))
            rest = rest[d.end() + k:]
        func = rest.lstrip("_") or func
    return f"{os.path.basename(path)}: {func}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--size", type=int, default=116, help="payload bytes per record")
    ap.add_argument("--time", action="store_true", help="wall time only")
    ap.add_argument("--run", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.iterations, args.records) < 1 or args.size < 0:
        ap.error("--iterations and --records must be >= 1, --size >= 0")
    if args.run is not None:   # the child run under valgrind
        round_trips(args.run, args.records, args.size)
        return 0
    from vrepl._core import crc32c
    round_trips(100, args.records, args.size)
    n = max(200, 2_000_000 // max(1, args.records * max(args.size, 64)))
    t0 = time.perf_counter()
    round_trips(n, args.records, args.size)
    per = (time.perf_counter() - t0) / n
    print(f"wall: {per * 1e6:.1f} µs per round trip of {args.records} records of {args.size} B "
          f"({per / args.records * 1e9:.0f} ns per record; crc32c: {crc32c.implementation()})")
    if args.time:
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind/callgrind_annotate not found: apt-get install valgrind", file=sys.stderr)
        return 2
    per_fn = callgrind_profile(args.iterations, args.records, args.size)
    total = per_fn.pop("PROGRAM TOTALS", None) or sum(v for v in per_fn.values() if v > 0)
    if total <= 0:   # other threads (numpy's OpenBLAS pool) moved more than the loop did
        print(f"the program total moved by {total:,.0f} instructions per round trip: too few"
              " iterations to cancel the other threads' noise; raise --iterations",
              file=sys.stderr)
        return 3
    print(f"callgrind: {total:,.0f} instructions per round trip, "
          f"{total / args.records:,.0f} per record")
    for name, ir in sorted(per_fn.items(), key=lambda kv: -kv[1])[:12]:
        if ir <= 0:
            break
        print(f"  {ir:>10,.0f}  {100 * ir / total:5.1f}%  {short(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.compare`: run every system through both workloads, in both fsync modes.

For each system: install it (or skip it with the reason), then for each fsync mode start 3
nodes in a fresh directory, run workload (a) then (b), stop every process it started, and go
on even if that system failed. At the end: raw JSON, the generated section of
docs/compare.md, docs/img/compare.png, and a check that no process survived.

Exit status: 0 when every system that was not skipped was measured and nothing was left
running; 1 when a system failed; 2 for bad arguments; 3 when a process survived the stop.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/compare/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "bench.compare"

from bench.compare import report  # noqa: E402
from bench.compare.drivers.base import LatencySpec, Skip, ThroughputSpec  # noqa: E402
from bench.compare.drivers.etcd_driver import EtcdDriver  # noqa: E402
from bench.compare.drivers.pysyncobj_driver import PySyncObjDriver  # noqa: E402
from bench.compare.drivers.redis_driver import RedisDriver  # noqa: E402
from bench.compare.drivers.vrepl_driver import vrepl_drivers  # noqa: E402
from bench.compare.install import ensure_pip  # noqa: E402
from bench.compare.procs import ProcessRegistry, install_exit_handlers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


def all_drivers() -> list:
    """Every system, vrepl first."""
    return [*vrepl_drivers(), RedisDriver(), PySyncObjDriver(), EtcdDriver()]


def machine_description() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{mem_kb / 2**20:.0f} GiB"
    except OSError:
        mem = "?"
    return (f"{os.cpu_count()} cores ({cpu}), {mem}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="short run: 1000 latency writes, 2 s throughput (default: 5000, 10 s)")
    ap.add_argument("--systems", default=None,
                    help="comma-separated subset of: " + ",".join(d.name for d in all_drivers()))
    ap.add_argument("--modes", default="fsync,nofsync", help="fsync,nofsync or one of them")
    ap.add_argument("--count", type=int, help="measured writes in workload (a)")
    ap.add_argument("--warmup", type=int, help="warm-up writes in workload (a)")
    ap.add_argument("--duration", type=float, help="measured seconds of workload (b)")
    ap.add_argument("--warmup-s", type=float, help="warm-up seconds of workload (b)")
    ap.add_argument("--clients", type=int, default=8, help="writers in workload (b)")
    ap.add_argument("--batch", type=int, default=100, help="writes per batch in workload (b)")
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value")
    ap.add_argument("--latency-limit-s", type=float, default=120.0,
                    help="stop workload (a) of one system after this many seconds")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to create the run's temporary directory (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    ap.add_argument("--json", type=Path, default=None,
                    help="raw results (default bench/compare/results/compare-{quick,full}.json)")
    ap.add_argument("--md", type=Path, default=REPO_ROOT / "docs/compare.md")
    ap.add_argument("--png", type=Path, default=REPO_ROOT / "docs/img/compare.png")
    ap.add_argument("--no-docs", action="store_true", help="write only the JSON")
    ap.add_argument("--no-install", action="store_true",
                    help="never apt-get/pip install; skip what is missing")
    args = ap.parse_args(argv)
    q = args.quick
    args.count = args.count or (1000 if q else 5000)
    args.warmup = args.warmup if args.warmup is not None else (200 if q else 500)
    args.duration = args.duration or (2.0 if q else 10.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (0.5 if q else 2.0)
    args.json = args.json or REPO_ROOT / f"bench/compare/results/compare-{'quick' if q else 'full'}.json"
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("fsync", "nofsync") for m in args.modes):
        ap.error("--modes takes fsync, nofsync or both")
    if min(args.count, args.clients, args.batch, args.value_size) < 1 or args.duration <= 0:
        ap.error("counts, sizes and the duration must be positive")
    return args


def run_mode(driver, fsync: bool, args, procs: ProcessRegistry, base: Path) -> dict:
    mode = "fsync" if fsync else "nofsync"
    setting = driver.fsync_setting(fsync)
    if isinstance(setting, Skip):
        return {"skipped": setting.reason}
    out = {"setting": {"description": setting.description, "per_write": setting.per_write},
           "loadavg_1min": round(os.getloadavg()[0], 1)}
    procs.phase = f"{driver.name}-{mode}"
    workdir = base / procs.phase
    workdir.mkdir()
    lat_spec = LatencySpec(count=args.count, warmup=args.warmup, value_size=args.value_size,
                           time_limit_s=args.latency_limit_s)
    thr_spec = ThroughputSpec(clients=args.clients, batch=args.batch,
                              value_size=args.value_size, duration_s=args.duration,
                              warmup_s=args.warmup_s)
    t0 = time.monotonic()
    try:
        driver.start(workdir, fsync, procs)
        print(f"  [{procs.phase}] started in {time.monotonic() - t0:.1f} s; latency...",
              flush=True)
        out["latency"] = driver.run_latency(lat_spec)
        lat = out["latency"]
        print(f"  [{procs.phase}] latency p50 {lat['p50_us']:.0f} µs, p99 {lat['p99_us']:.0f} "
              f"µs, p99.9 {lat['p999_us']:.0f} µs ({lat['count']} writes, {lat['errors']} "
              f"errors{', TRUNCATED' if lat.get('truncated') else ''}); throughput...",
              flush=True)
        out["throughput"] = driver.run_throughput(thr_spec)
        thr = out["throughput"]
        print(f"  [{procs.phase}] throughput {thr['writes_per_s']:,.0f} writes/s "
              f"({thr['errors']} errors)", flush=True)
        dead = procs.exited()
        if dead:
            raise RuntimeError("server exited during the run: " + ", ".join(dead))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  [{procs.phase}] FAILED: {out['error']}", flush=True)
        traceback.print_exc()
        for name in procs.names():
            tail = procs.log_tail(name, 600)
            if tail:
                print(f"  --- {name} log tail ---\n{tail}", flush=True)
    finally:
        try:
            driver.stop()
        finally:
            procs.stop_all()
            driver.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    drivers = all_drivers()
    if args.systems:
        wanted = [s.strip() for s in args.systems.split(",")]
        unknown = set(wanted) - {d.name for d in drivers}
        if unknown:
            print(f"unknown system(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        drivers = [d for d in drivers if d.name in wanted]
    base = Path(tempfile.mkdtemp(prefix="vrepl-compare-", dir=args.workdir))
    procs = ProcessRegistry(base)
    install_exit_handlers(procs)
    command = "python -m bench.compare " + " ".join(shlex.quote(a) for a in
                                                    (argv if argv is not None else sys.argv[1:]))
    results = {
        "meta": {"command": command.strip(), "machine": machine_description(),
                 "loadavg_start": round(os.getloadavg()[0], 1),
                 "started_at": time.strftime("%Y-%m-%d %H:%M %Z"),
                 "params": {"quick": args.quick, "latency_count": args.count,
                            "latency_warmup": args.warmup, "clients": args.clients,
                            "batch": args.batch, "value_size": args.value_size,
                            "duration_s": args.duration, "warmup_s": args.warmup_s,
                            "modes": args.modes}},
        "systems": {},
    }
    failed = False
    status_interrupted = None
    print(f"work directory {base}", flush=True)
    try:
        for driver in drivers:
            entry = {"is_vrepl": driver.is_vrepl, "client_mode": driver.client_mode,
                     "skipped": None, "modes": {}}
            results["systems"][driver.name] = entry
            print(f"[{driver.name}]", flush=True)
            reason = driver.prepare(not args.no_install)
            if reason:
                entry["skipped"] = reason
                print(f"  skipped: {reason}", flush=True)
                continue
            entry["version"] = driver.version()
            for mode in args.modes:
                entry["modes"][mode] = run_mode(driver, mode == "fsync", args, procs, base)
                failed |= "error" in entry["modes"][mode]
    except (KeyboardInterrupt, SystemExit) as exc:
        # Ctrl-C, or SIGTERM/SIGHUP turned into SystemExit by install_exit_handlers: stop
        # the servers, keep what was measured, exit 128 + signal.
        status_interrupted = exc.code if isinstance(exc, SystemExit) else 130
        results["meta"]["interrupted"] = True
        print("interrupted: stopping servers", file=sys.stderr, flush=True)
    finally:
        procs.stop_all()
        for d in drivers:
            d.cleanup()
    results["meta"]["loadavg_end"] = round(os.getloadavg()[0], 1)
    time.sleep(0.2)
    left = procs.leftovers()
    results["leftover_processes"] = left
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.json}")
    if not args.no_docs and status_interrupted is None:
        section = report.render_markdown(results)
        report.update_doc(args.md, section)
        why = (ensure_pip("matplotlib", "matplotlib", not args.no_install)
               or report.plot(results, args.png))
        print(f"tables: {args.md}" + (f"; plot not drawn: {why}" if why else f"; plot: {args.png}"))
        print(section)
    if left:
        print("LEFTOVER PROCESSES:\n  " + "\n  ".join(left), file=sys.stderr)
        return 3
    if status_interrupted is not None:
        return status_interrupted
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`vrepl demo` (docs/operations.md §demo).

Owns: the demo's script: a 3-replica vgroup (quorum 2) of real `vrepl node` processes on
127.0.0.1 in a temporary directory; rows written through `vrepl.client` with a progress bar;
the master killed with SIGKILL and the election timed; more rows; the old master restarted
until it is a slave that caught up; every replica queried and compared (plus any extra
validation registered in VALIDATIONS, e.g. the Spark job); everything it started stopped and
removed, also on Ctrl-C or failure.
Must not: touch anything outside its directory or bind beyond loopback.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vrepl.client import Client, OutcomeUnknownError
from vrepl.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from vrepl.node.local import LocalCluster
from vrepl.node.statusview import print_view, view_from_cluster_status
from vrepl.untrusted import printable

# Extra end-of-demo checks: fn(cluster, tables, summary) -> (ok, one-line description).
# The Spark validation registers itself here (vrepl.spark) once it lands.
VALIDATIONS: list[Callable[[LocalCluster, list[str], dict], tuple[bool, str]]] = []

DEMO_VNODE = {"max_memtable_rows": 20_000}   # small, so the demo also flushes Parquet files
TS0 = 1_700_000_000_000


def spark_validation(cluster: LocalCluster, base: str, console: Console) -> tuple[bool, str]:
    """Run `vrepl validate` on the vgroup's replica directories; (agree, one-line result)."""
    import os

    try:
        from vrepl.spark import InputError, SparkJobError, validate
    except ImportError as exc:
        return False, f"Spark validation skipped: {exc} (python3 -m pip install pyspark)"
    dirs = [os.path.join(node.dir, "data", "vg1") for node in cluster.nodes.values()]
    console.print("validating the replicas with Spark (local[2]; JVM start included) ...")
    t0 = time.perf_counter()
    from vrepl.spark.session import stop_jvm
    try:
        report = validate({1: dirs}, master="local[2]",
                          log_path=os.path.join(base, "spark.log"))
    except (InputError, SparkJobError) as exc:
        return False, f"Spark validation could not run: {exc}"
    finally:
        stop_jvm()      # the demo stops everything it started, the JVM included
    took = time.perf_counter() - t0
    if report.exit_code == 0:
        return True, f"Spark validation: the 3 replicas agree (rows, files, versions, epochs; {took:.1f} s)"
    return False, f"Spark validation found differences (exit {report.exit_code}); see {base}"


def spark_missing() -> str | None:
    """Why the closing Spark validation cannot run on this machine (no pyspark, no Java or
    one too old), or None; checked before any node starts."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (python3 -m pip install pyspark)"
    from vrepl.spark.session import java_missing
    return java_missing()


def make_console() -> Console:
    """A console; 120 columns when the output is not a terminal (pipes, tests, logs)."""
    c = Console(soft_wrap=True)
    return c if c.is_terminal else Console(soft_wrap=True, width=120)


def print_cluster_status(cluster: dict[str, Any], console: Console | None = None) -> None:
    """The cluster as `vrepl status` shows it, from Client.cluster_status()."""
    print_view(view_from_cluster_status(cluster), console or make_console())


def _rows(table: str, first_ts: int, n: int, seq0: int) -> list[list]:
    return [[table, first_ts + i, {"seq": seq0 + i, "temp": 20.0 + (seq0 + i) % 100 / 10,
                                   "site": "demo-site-%03d" % ((seq0 + i) % 997)}]
            for i in range(n)]


def _write_phase(console: Console, client: Client, vgroup: int, label: str, tables: list[str],
                 next_ts: dict[str, int], rows: int, batch: int, seq: list[int],
                 acked: dict[str, set[int]], on_batch: Callable[[int], None] | None = None
                 ) -> None:
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console,
                  transient=False) as bar:
        task = bar.add_task(label, total=rows, rate="")
        done, t0 = 0, time.perf_counter()
        i = 0
        while done < rows:
            table = tables[i % len(tables)]
            n = min(batch, rows - done)
            ts = next_ts[table]
            body = _rows(table, ts, n, seq[0])
            try:
                client.write(vgroup, body)
            except OutcomeUnknownError as exc:   # never silently: say so, and do not count it
                console.print(f"[yellow]outcome unknown[/]: {escape(printable(exc))}")
            else:
                acked[table].update(range(ts, ts + n))
            next_ts[table] = ts + n
            seq[0] += n
            done += n
            i += 1
            bar.update(task, completed=done,
                       rate=f"{done / max(1e-9, time.perf_counter() - t0):,.0f} rows/s")
            if on_batch is not None:
                on_batch(done)


def run_demo(args: argparse.Namespace) -> int:
    console = make_console()
    if not args.no_spark:
        reason = spark_missing()
        if reason is not None:
            print(f"vrepl: error: the demo ends with a Spark validation of the replicas: {reason};"
                  " or skip it with `vrepl demo --no-spark`", file=sys.stderr)
            return EXIT_USAGE      # the validation cannot run here: nothing was started
    base = args.dir or tempfile.mkdtemp(prefix="vrepl-demo-")
    own = args.dir is None
    summary: dict[str, Any] = {"ok": False}
    cluster = LocalCluster(base, 3, vgroup=1, quorum=2, vnode=DEMO_VNODE)
    client: Client | None = None
    t_start = time.perf_counter()
    try:
        console.print(f"[bold]vrepl demo[/]: 3 replicas of vgroup 1 (quorum 2) on 127.0.0.1,"
                      f" data in {base}")
        cluster.start()
        cluster.wait_ready()
        master = cluster.wait_master(slaves=2, timeout_s=20)
        console.print("nodes up: " + ", ".join(f"n{n.id} http {n.http}"
                                               for n in cluster.nodes.values())
                      + f"; master n{master}")
        print_cluster_status(Client(cluster.endpoints).cluster_status(), console)
        client = cluster.client(timeout_s=20)
        tables = [f"sensor_{i}" for i in range(args.tables)]
        next_ts = {t: TS0 for t in tables}
        acked: dict[str, set[int]] = {t: set() for t in tables}
        seq = [0]
        _write_phase(console, client, 1, f"writing (master n{master})", tables, next_ts,
                     args.rows, args.batch, seq, acked)

        console.print(f"[bold red]SIGKILL[/] master n{master}")
        t_kill = time.perf_counter()
        cluster.kill(master, signal.SIGKILL)
        new_master = cluster.wait_master(timeout_s=15, exclude=master)
        t_elected = time.perf_counter()
        body = _rows(tables[0], next_ts[tables[0]], 1, seq[0])
        client.write(1, body)
        acked[tables[0]].add(next_ts[tables[0]])
        next_ts[tables[0]] += 1
        seq[0] += 1
        t_first = time.perf_counter()
        summary["election_ms"] = round((t_elected - t_kill) * 1000, 1)
        summary["first_write_ms"] = round((t_first - t_kill) * 1000, 1)
        console.print(f"new master [green]n{new_master}[/]: elected {summary['election_ms']} ms"
                      f" after the kill (as seen by polling /v1/status), first confirmed write"
                      f" {summary['first_write_ms']} ms after it")

        _write_phase(console, client, 1, f"writing (master n{new_master})", tables, next_ts,
                     args.rows, args.batch, seq, acked)

        console.print(f"restarting n{master} (crash recovery from its WAL)")
        t_restart = time.perf_counter()
        cluster.start(master)
        cluster.wait_ready(master)

        def caught_up() -> bool:
            vs = cluster.vgroup_status(master)
            ms = cluster.vgroup_status(new_master)
            return bool(vs and ms and vs["role"] == "slave" and vs["version"] == ms["version"])
        cluster.wait_for(f"n{master} is a slave with the master's version", caught_up, 30)
        summary["rejoin_ms"] = round((time.perf_counter() - t_restart) * 1000, 1)
        console.print(f"n{master} is a slave again and caught up in {summary['rejoin_ms']} ms")
        print_cluster_status(client.cluster_status(), console)

        # Compare every replica, row by row (ts, version, epoch, values).
        ok = True
        total = 0
        for t in tables:
            per_node = {nid: cluster.replica_rows(nid, t) for nid in cluster.nodes}
            ref = per_node[new_master]
            total += len(ref)
            for nid, rows in per_node.items():
                if rows != ref:
                    ok = False
                    console.print(f"[red]table {t}: n{nid} has {len(rows)} rows, n{new_master}"
                                  f" has {len(ref)}; they differ[/]")
            have = {r["ts"] for r in ref}
            missing = acked[t] - have
            if missing:
                ok = False
                console.print(f"[red]table {t}: {len(missing)} confirmed rows are missing[/]")
        summary.update(rows_confirmed=sum(map(len, acked.values())), rows_per_replica=total)
        for check in VALIDATIONS:
            good, text = check(cluster, tables, summary)
            console.print(("[green]ok[/] " if good else "[red]FAILED[/] ") + escape(text))
            ok = ok and good
        summary["identical"] = ok
        if ok:
            console.print(f"[bold green]all 3 replicas hold identical data[/]: {total:,} rows in"
                          f" {len(tables)} tables; every confirmed row is there")
        codes = cluster.stop_all(signal.SIGTERM)
        summary["stop_exit_codes"] = codes
        if not args.no_spark:
            # The nodes are stopped (SIGTERM flushed them): validate the archived files and
            # WALs of the three replicas with the Spark job (docs/validation.md).
            good, text = spark_validation(cluster, base, console)
            summary["spark_validation"] = text
            console.print(("[green]ok[/] " if good else "[red]FAILED[/] ") + escape(text))
            ok = ok and good
            summary["identical"] = ok
        summary["ok"] = ok and all(c == 0 for c in codes.values())
        summary["seconds"] = round(time.perf_counter() - t_start, 1)
        console.print(f"stopped every node (SIGTERM: exit codes {list(codes.values())});"
                      f" demo took {summary['seconds']} s")
        if args.json:
            print(json.dumps(summary))
        return EXIT_OK if summary["ok"] else EXIT_FAILED
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the nodes[/]")
        return EXIT_INTERRUPTED
    except (RuntimeError, TimeoutError) as exc:    # a node exited, or a wait ran out
        console.print(f"[red]FAILED[/] {escape(str(exc))}")
        return EXIT_FAILED
    finally:
        if client is not None:
            client.close()
        cluster.close()
        if own and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        elif args.keep:
            console.print(f"kept {base}")

"""The node's Prometheus metrics: `GET /metrics` (docs/operations.md §Metrics).

Owns: the node's own `CollectorRegistry` (never the global one: several nodes in one process,
or tests, must not share counters), the two histograms fed per event — confirm latency (one
observation per run of forwards confirmed) and WAL group-commit time (one per group
commit), both through `SyncObservers` — and a collector that reads, at scrape time only,
the counters the node keeps anyway: sync.stats(), restore_status(), the vgroup host's write
counters, the HTTP server's response counts and the transport's refusals.
Must not: add work per record or per request beyond a dict increment, or change what it
reads. Runs on the I/O thread (the HTTP handler), like /v1/status.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import vrepl
from vrepl.sync import SyncObservers

if TYPE_CHECKING:
    from vrepl.node.http import HttpServer
    from vrepl.node.vgroup import VgroupHost

# The classic text format that generate_latest writes (every name here is a legacy name),
# pinned rather than CONTENT_TYPE_LATEST, which says version=1.0.0 from prometheus_client
# 0.22 on: the header must not change with the library's version (docs/client-api.md §Metrics).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROLES = ("master", "slave", "syncing", "unsynced")
CONFIRM_STATUSES = ("ok", "timed_out", "failed", "not_master")
WRITE_RESULTS = ("ok", "bad", "not_master", "unknown", "overloaded", "duplicate", "needs_restore")
# Loopback fdatasync takes ~0.1 ms on the project's disks, a quorum confirm ~0.5 ms: buckets
# from 50 µs to 10 s.
CONFIRM_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0)
FSYNC_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)


def _ms_to_s(ms: Any) -> float | None:
    return None if ms is None else ms / 1000.0


class NodeMetrics:
    """One node's registry. `observers(vgroup)` for each SyncInstance; `render()` per scrape."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry()
        self.confirm_latency = Histogram(
            "vrepl_confirm_latency_seconds", "From forward() to the quorum's confirmation, one"
            " observation per run of forwards confirmed OK (master)", ["vgroup"],
            buckets=CONFIRM_BUCKETS, registry=self.registry)
        self.wal_fsync = Histogram(
            "vrepl_wal_fsync_seconds", "One WAL group commit: write and fdatasync", ["vgroup"],
            buckets=FSYNC_BUCKETS, registry=self.registry)
        self.collector = NodeCollector(self)
        self.registry.register(self.collector)
        self.vgroups: dict[int, "VgroupHost"] = {}
        self.http: "HttpServer | None" = None

    def observers(self, vgroup_id: int) -> SyncObservers:
        label = str(vgroup_id)
        return SyncObservers(confirm_latency_s=self.confirm_latency.labels(vgroup=label).observe,
                             wal_fsync_s=self.wal_fsync.labels(vgroup=label).observe)

    def render(self) -> bytes:
        """The Prometheus text exposition of everything (call on the I/O thread)."""
        return generate_latest(self.registry)


class NodeCollector:
    """Reads the node's counters at scrape time (a prometheus_client custom collector)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []   # names are fixed; nothing to read before the node runs

    def collect(self) -> Iterator[Metric]:
        m = self.m
        info = GaugeMetricFamily("vrepl_node_info", "This node: id and vrepl version (always 1)",
                                 labels=["node", "version"])
        info.add_metric([str(m.node_id), vrepl.__version__], 1)
        yield info
        yield from self._http()
        yield from self._vgroups()
        yield from self._txns()

    def _http(self) -> Iterator[Metric]:
        http = self.m.http
        fam = CounterMetricFamily("vrepl_http_requests", "HTTP responses written, by route pattern"
                                  " and status (route none: refused before it was parsed)",
                                  labels=["route", "status"])
        if http is not None:
            for (route, status), n in sorted(http.responses.items()):
                fam.add_metric([route, str(status)], n)
        yield fam

    def _txns(self) -> Iterator[Metric]:
        """Transactions (docs/transactions.md §10): by state, aborts by reason, staged bytes,
        refusals by code and the visible lag (commit forwarded -> VISIBLE, master)."""
        states = GaugeMetricFamily("vrepl_txns", "Transactions this replica knows, by state"
                                   " (finished ones until their label expires)",
                                   labels=["vgroup", "state"])
        aborts = CounterMetricFamily("vrepl_txn_aborts", "Transactions aborted, by reason kind"
                                     " (timeout, client, other)", labels=["vgroup", "reason"])
        staged = GaugeMetricFamily("vrepl_txn_staged_bytes", "Bytes of rows staged by open"
                                   " transactions", labels=["vgroup"])
        staged_files = GaugeMetricFamily("vrepl_txn_staged_file_bytes", "Bytes of Parquet"
                                         " files staged by open transactions (on disk)",
                                         labels=["vgroup"])
        refused = CounterMetricFamily("vrepl_txn_refusals", "Transaction steps refused by this"
                                      " master, by code", labels=["vgroup", "code"])
        lag = GaugeMetricFamily("vrepl_txn_visible_lag_seconds", "From a commit record's forward"
                                " to VISIBLE on this master, over the last 1000 commits",
                                labels=["vgroup", "stat"])
        for vg in self.m.vgroups.values():
            if vg.vnode is None or vg.state != "serving":
                continue
            v = str(vg.id)
            st = vg.txns.status()
            for state, n in st["states"].items():
                states.add_metric([v, state], n)
            for reason, n in sorted(st["aborts"].items()):
                aborts.add_metric([v, reason], n)
            staged.add_metric([v], st["staged_bytes"])
            staged_files.add_metric([v], st["staged_file_bytes"])
            for code, n in sorted(st["refusals"].items()):
                refused.add_metric([v, code], n)
            for stat in ("p50", "max"):
                ms = st[f"visible_lag_ms_{stat}"]
                if ms is not None:
                    lag.add_metric([v, stat], ms / 1000.0)
        yield from (states, aborts, staged, staged_files, refused, lag)

    def _vgroups(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["vgroup", *labels])

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["vgroup", *labels])

        role = gauge("vrepl_role", "1 for the vgroup's current role on this node, 0 for the others",
                     ("role",))
        epoch = gauge("vrepl_epoch", "The epoch this replica promised (the current term)")
        master = gauge("vrepl_master_node", "Node id of the master this replica knows (0: none)")
        versions = {
            "last": gauge("vrepl_last_version", "Last version in this replica's WAL"),
            "durable": gauge("vrepl_durable_version", "Last version fsynced in this replica's WAL"),
            "committed": gauge("vrepl_committed_version",
                               "The commit index: every version up to it is committed (never"
                               " cut from a log) and may be archived"),
            "applied": gauge("vrepl_applied_version", "Last version applied to the vnode"),
            "archived": gauge("vrepl_archived_version", "Last version in the archived (flushed) files"),
        }
        peer = ("peer",)
        connected = gauge("vrepl_peer_connected", "1 while the connection to the peer is up", peer)
        heard = gauge("vrepl_peer_last_heard_seconds", "Seconds since the peer's last frame (absent:"
                      " never heard since start)", peer)
        acked = gauge("vrepl_peer_acked_version", "Highest version the peer acknowledged (master)", peer)
        lag_v = gauge("vrepl_peer_lag_versions", "Versions the peer has not acknowledged (master)", peer)
        lag_s = gauge("vrepl_peer_lag_seconds", "Age of the oldest forward the peer has not"
                      " acknowledged, 0 when it has all (master)", peer)
        forwards = counter("vrepl_forwards", "Records forwarded (forward() calls taken)")
        forward_bytes = counter("vrepl_forward_bytes", "Payload bytes forwarded")
        refused = counter("vrepl_forwards_refused", "forward() calls refused by flow control")
        confirmed = counter("vrepl_forwards_confirmed", "Forward outcomes reported to the app, by"
                            " status", ("status",))
        queued = gauge("vrepl_queued_forwards", "Forwards queued for the I/O thread")
        flow = gauge("vrepl_flow_control", "1 while flow control asks the app to slow down")
        wal_bytes = counter("vrepl_wal_written_bytes", "Bytes written to the WAL")
        commits = counter("vrepl_wal_group_commits", "WAL group commits (one fdatasync each)")
        role_changes = counter("vrepl_role_changes", "Role changes, by the role entered", ("role",))
        epochs = counter("vrepl_epochs", "Epochs this replica promised (elections it took part in)")
        won = counter("vrepl_elections_won", "Times this replica became master")
        r_started = counter("vrepl_restores_started", "Restore sessions started, as sender or"
                            " receiver", ("side",))
        r_ended = counter("vrepl_restores_finished", "Restore sessions finished, by result",
                          ("side", "result"))
        r_bytes = counter("vrepl_restore_bytes", "File bytes moved by restores", ("direction",))
        r_records = counter("vrepl_restore_wal_records", "WAL records moved by restores",
                            ("direction",))
        writes = counter("vrepl_writes", "Client writes answered, by result", ("result",))
        rows = counter("vrepl_rows_written", "Rows in writes confirmed OK")
        pending = gauge("vrepl_pending_writes", "Client writes waiting for their outcome")
        flushes = counter("vrepl_flushes", "Memtable flushes to archived files")
        flush_errors = counter("vrepl_flush_errors", "Memtable flushes that failed")
        mem_rows = gauge("vrepl_memtable_rows", "Rows in the memtable")
        mem_bytes = gauge("vrepl_memtable_bytes", "Estimated bytes of the memtable")
        needs = gauge("vrepl_needs_restore", "1 while the vgroup needs a restore (it serves nothing"
                      " and restores itself from the master), else 0")
        self_restores = counter("vrepl_self_restores", "Self-restores of the vgroup, by result",
                                ("result",))
        i_rounds = counter("vrepl_ingest_rounds", "Rounds of ingested files this node took as"
                           " master, by result: ingested, refused, unknown (outcome not known)",
                           ("result",))
        i_staged = counter("vrepl_ingest_rounds_staged", "Ingest records whose files this replica"
                           " staged (a slave: before it acks)")
        i_files = counter("vrepl_ingest_files", "Files of ingest rounds, by how this replica got or"
                          " gave them: incoming (the master's own), fetched (from a replica),"
                          " served (to a replica)", ("how",))
        i_fetch_fail = counter("vrepl_ingest_fetch_failures", "Fetches of a round's missing files"
                               " that failed (retried)")
        i_crc = counter("vrepl_ingest_checksum_bytes", "Bytes of ingested files this node"
                        " checksummed (CRC-32C), by how: received (as they arrived: an upload,"
                        " a shipped file, a fetch) or reread (read back from disk: a producer's file)",
                        ("how",))
        limiter: dict[str, int] = {}
        refusals: dict[str, int] = {}
        for vg in self.m.vgroups.values():
            # Read even while replication is stopped: that is when it matters.
            needs.add_metric([str(vg.id)], 0 if vg.state == "serving" else 1)
            self_restores.add_metric([str(vg.id), "ok"], vg.counters["self_restores"])
            self_restores.add_metric([str(vg.id), "failed"], vg.counters["self_restore_failures"])
            sync, vnode = vg.sync, vg.vnode
            if sync is None or vnode is None or vg.state != "serving":
                continue
            try:
                st = sync.stats()
                rs = sync.restore_status()
            except Exception:   # not running (failed or stopping): nothing to read
                continue
            v = str(vg.id)
            for name in ROLES:
                role.add_metric([v, name], 1 if vg.role == name else 0)
            epoch.add_metric([v], st["epoch"])
            master.add_metric([v], st["master"] if st["master"] and st["master"] > 0 else 0)
            vst = vnode.status()
            committed = st.get("committed_version")
            if committed is None:   # a core without the commit index: what this master confirmed
                committed = vg.confirmed_through
            for kind, value in (("last", st["last_version"]), ("durable", st["wal"]["durable_version"]),
                                ("committed", committed), ("applied", vst["version"]),
                                ("archived", vst["archived_version"])):
                versions[kind].add_metric([v], value)
            is_master = st["role"] == "master"
            for node, p in sorted(st["peers"].items()):
                labels = [v, str(node)]
                connected.add_metric(labels, 1 if p.get("online") else 0)
                if p.get("last_heard_ms") is not None:
                    heard.add_metric(labels, _ms_to_s(p["last_heard_ms"]))
                if is_master:
                    acked.add_metric(labels, p.get("acked_version", 0))
                    lag_v.add_metric(labels, p.get("lag_versions", 0))
                    lag_s.add_metric(labels, _ms_to_s(p.get("lag_ms") or 0))
            c = st["sync"]
            forwards.add_metric([v], c["forwards"])
            forward_bytes.add_metric([v], c["forward_bytes"])
            refused.add_metric([v], c["forwards_refused_flow_control"])
            for status in CONFIRM_STATUSES:
                confirmed.add_metric([v, status], c["confirmed_" + status])
            queued.add_metric([v], st["queued_forwards"])
            flow.add_metric([v], st["flow_control"])
            wal_bytes.add_metric([v], st["wal"]["appended_bytes"])
            commits.add_metric([v], st["wal"]["group_commits"])
            for name in ROLES:
                role_changes.add_metric([v, name], st.get("role_changes", {}).get(name, 0))
            epochs.add_metric([v], st.get("epochs_promised", 0))
            won.add_metric([v], st["counters"].get("elections_won", 0))
            rc = rs["counters"]
            for side in ("sender", "receiver"):
                r_started.add_metric([v, side], rc[f"{side}_sessions"])
                r_ended.add_metric([v, side, "ok"], rc[f"{side}_ok"])
                r_ended.add_metric([v, side, "failed"], rc[f"{side}_failed"])
            for direction in ("sent", "received"):
                r_bytes.add_metric([v, direction], rc[f"file_bytes_{direction}"])
                r_records.add_metric([v, direction], rc[f"wal_records_{direction}"])
            limiter = rs.get("limiter") or limiter
            for result in WRITE_RESULTS:
                writes.add_metric([v, result], vg.counters["writes_" + result])
            rows.add_metric([v], vg.counters["rows_written"])
            pending.add_metric([v], len(vg.pending))
            flushes.add_metric([v], vg.flushes)
            flush_errors.add_metric([v], vg.flush_errors)
            mem_rows.add_metric([v], vst["memtable_rows"])
            mem_bytes.add_metric([v], vst["memtable_bytes"])
            ic = vg.rounds.counters
            for result in ("ingested", "refused", "unknown"):
                i_rounds.add_metric([v, result], ic["rounds_" + result])
            i_staged.add_metric([v], ic["rounds_staged"])
            for how, key in (("incoming", "files_from_incoming"), ("fetched", "files_fetched"),
                             ("served", "files_served")):
                i_files.add_metric([v, how], ic[key])
            i_fetch_fail.add_metric([v], ic["fetch_failures"])
            for how in ("received", "reread"):
                i_crc.add_metric([v, how], ic["checksum_bytes_" + how])
            refusals = sync.connection_refusals() or refusals  # one server per node: shared
        yield from (role, epoch, master, *versions.values(), connected, heard, acked, lag_v, lag_s,
                    forwards, forward_bytes, refused, confirmed, queued, flow, wal_bytes, commits,
                    role_changes, epochs, won, r_started, r_ended, r_bytes, r_records, writes, rows,
                    pending, flushes, flush_errors, mem_rows, mem_bytes, needs, self_restores,
                    i_rounds, i_staged, i_files, i_fetch_fail, i_crc)
        running = GaugeMetricFamily("vrepl_restores_running", "Restore sessions holding one of the"
                                    " node's max_concurrent_restores slots")
        running.add_metric([], limiter.get("running", 0))
        waiting = GaugeMetricFamily("vrepl_restores_queued", "Restore sessions waiting for a slot")
        waiting.add_metric([], limiter.get("waiting", 0))
        refused_conns = CounterMetricFamily("vrepl_connection_refusals", "Replication connections"
                                            " this node closed for what the other side sent, by"
                                            " reason", labels=["reason"])
        for reason, n in sorted(dict(refusals).items()):
            refused_conns.add_metric([reason], n)
        yield from (running, waiting, refused_conns)

"""The arbitrator's Prometheus metrics, served on `metrics_listen` (docs/arbitrator.md §Metrics).

Owns: the arbitrator's own `CollectorRegistry`, a collector that reads the arbitrator's
counters and lease table at scrape time, and the HTTP listener (prometheus_client's WSGI
server, on its own thread). The lease table belongs to the event loop, so a scrape reads it
there (`Arbitrator.snapshot()` run on the loop), never from the listener's thread.
Must not: touch grants or connections; a scrape that cannot reach the loop answers without
the lease figures rather than block.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import vrepl

if TYPE_CHECKING:
    from arbitrator.server import Arbitrator

log = logging.getLogger("vrepl.arbitrator")
SNAPSHOT_TIMEOUT_S = 2.0


class ArbitratorCollector:
    def __init__(self, arb: "Arbitrator", loop: asyncio.AbstractEventLoop) -> None:
        self.arb = arb
        self.loop = loop

    def describe(self) -> list[Metric]:
        return []

    def _snapshot(self) -> dict[str, Any] | None:
        async def read() -> dict[str, Any]:
            return self.arb.snapshot()
        try:
            return asyncio.run_coroutine_threadsafe(read(), self.loop).result(SNAPSHOT_TIMEOUT_S)
        except Exception as exc:   # the loop is stopping or stuck
            log.warning("arbitrator: metrics scrape without lease figures: %r", exc)
            return None

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("vrepl_arbitrator_info", "The arbitrator: vrepl version and"
                                 " lease_ms (always 1)", labels=["version", "lease_ms"])
        info.add_metric([vrepl.__version__, str(self.arb.config.lease_ms)], 1)
        yield info
        snap = self._snapshot()
        if snap is None:
            return
        conns = GaugeMetricFamily("vrepl_arbitrator_connections", "Client connections open now")
        conns.add_metric([], snap["connections"])
        grants = CounterMetricFamily("vrepl_arbitrator_grants", "Requests granted: new (a new"
                                     " holder or epoch) or renewal", labels=["kind"])
        for kind, n in sorted(snap["grants"].items()):
            grants.add_metric([kind], n)
        refusals = CounterMetricFamily("vrepl_arbitrator_refusals", "Requests refused, by reason",
                                       labels=["reason"])
        for reason, n in sorted(snap["refusals"].items()):
            refusals.add_metric([reason], n)
        closed = CounterMetricFamily("vrepl_arbitrator_connections_closed", "Client connections"
                                     " closed, by reason", labels=["reason"])
        for reason, n in sorted(snap["closed"].items()):
            closed.add_metric([reason], n)
        epoch = GaugeMetricFamily("vrepl_arbitrator_granted_epoch", "Latest epoch granted per"
                                  " vgroup, and to which node", labels=["vgroup", "node"])
        live = GaugeMetricFamily("vrepl_arbitrator_lease_live", "1 while the vgroup's lease is"
                                 " live (its holder may act as master)", labels=["vgroup"])
        for vg, lease in sorted(snap["leases"].items()):
            epoch.add_metric([str(vg), str(lease["node"])], lease["epoch"])
            live.add_metric([str(vg)], 1 if lease["live"] else 0)
        yield from (conns, grants, refusals, closed, epoch, live)


class MetricsListener:
    """GET /metrics on host:port in the Prometheus text format; `close()` stops it."""

    def __init__(self, arb: "Arbitrator", loop: asyncio.AbstractEventLoop, host: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ArbitratorCollector(arb, loop))
        self.httpd, self.thread = start_http_server(port, addr=host, registry=self.registry)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        # shutdown() waits for serve_forever to return; a thread so a hung scrape cannot
        # hold the stop.
        stopper = threading.Thread(target=self.httpd.shutdown, daemon=True)
        stopper.start()
        stopper.join(5)
        self.httpd.server_close()

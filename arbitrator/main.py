"""`vrepl-arbitrator`: run the arbitrator from a TOML config and/or flags.

Owns: configuration parsing and validation (including the lease margin a lease_ms can honour,
docs/arbitrator.md), logging setup (vrepl/logsetup.py, the nodes'
format), the metrics listener's life (arbitrator/metrics.py), signals (SIGHUP reopens the log
file). Exit codes (vrepl/exitcodes.py): 0 stopped by SIGTERM/SIGINT, 2 bad configuration (one
line on stderr), 1 could not start (port in use...).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tomllib

from arbitrator.metrics import MetricsListener
from arbitrator.server import Arbitrator, ArbitratorConfig, max_backed_replica_lease_ms
from vrepl.argparsing import OneLineArgumentParser
from vrepl.errors import ConfigError
from vrepl.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from vrepl.logsetup import LOG_FORMATS, LOG_LEVELS, reopen_logs, setup_logging
from vrepl.replica import Config as ReplicaConfig

KEYS = {"host": str, "port": int, "secret": str, "secret_file": str, "state_dir": str,
        "lease_ms": int, "clock_drift_ratio": float, "lease_allowance_ms": int,
        "max_connections": int, "handshake_timeout_ms": int,
        "idle_timeout_ms": int, "log_level": str, "log_file": str, "log_format": str,
        "metrics_listen": str}
DEFAULT_METRICS_LISTEN = "127.0.0.1:6043"
DEFAULTS = ArbitratorConfig()
# The lease a replica assumes with its default settings (arbitrator_lease_ticks x tick_ms).
DEFAULT_REPLICA_LEASE_MS = ReplicaConfig(vgroup_id=0, replicas=(1,), self_index=0).arbitrator_lease_ms

log = logging.getLogger("vrepl.arbitrator")


def metrics_address(text: str) -> tuple[str, int] | None:
    """`metrics_listen`: "host:port" (port 0: any free port), or "" for no listener."""
    if text == "":
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics_listen {text!r} is not host:port (or \"\" to turn it off)")
    return host.strip("[]"), int(port)


def load_config(path: str | None, overrides: dict) -> tuple[ArbitratorConfig, dict]:
    raw: dict = {}
    if path:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        raw = raw.get("arbitrator", raw)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for key, value in raw.items():
        if key not in KEYS:
            raise ConfigError(f"unknown setting '{key}' (known: {', '.join(sorted(KEYS))})")
        want = (int, float) if KEYS[key] is float else KEYS[key]  # TOML writes 0 for 0.0
        if not isinstance(value, want) or isinstance(value, bool):
            raise ConfigError(f"setting '{key}' must be {KEYS[key].__name__}, got {value!r}")
    secret = raw.get("secret", "").encode()
    if raw.get("secret_file"):
        try:
            with open(raw["secret_file"], "rb") as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"{raw['secret_file']}: cannot read the secret: {exc.strerror}")
    if not secret:
        raise ConfigError("no cluster secret: set 'secret_file' (or 'secret')")
    if not 0 <= raw.get("port", 6042) <= 65535:
        raise ConfigError(f"port {raw['port']} out of range")
    for key in ("lease_ms", "max_connections", "handshake_timeout_ms", "idle_timeout_ms"):
        if key in raw and raw[key] <= 0:
            raise ConfigError(f"setting '{key}' must be positive, got {raw[key]}")
    if not 0 <= raw.get("clock_drift_ratio", 0) < 1:
        raise ConfigError(f"setting 'clock_drift_ratio' must be in [0, 1), got {raw['clock_drift_ratio']}")
    if raw.get("lease_allowance_ms", 0) < 0:
        raise ConfigError(f"setting 'lease_allowance_ms' must be >= 0, got {raw['lease_allowance_ms']}")
    cfg = ArbitratorConfig(
        host=raw.get("host", DEFAULTS.host), port=raw.get("port", DEFAULTS.port), secret=secret,
        state_dir=raw.get("state_dir", DEFAULTS.state_dir),
        lease_ms=raw.get("lease_ms", DEFAULTS.lease_ms),
        clock_drift_ratio=float(raw.get("clock_drift_ratio", DEFAULTS.clock_drift_ratio)),
        lease_allowance_ms=raw.get("lease_allowance_ms", DEFAULTS.lease_allowance_ms),
        max_connections=raw.get("max_connections", DEFAULTS.max_connections),
        handshake_timeout_ms=raw.get("handshake_timeout_ms", DEFAULTS.handshake_timeout_ms),
        idle_timeout_ms=raw.get("idle_timeout_ms", DEFAULTS.idle_timeout_ms))
    if max_backed_replica_lease_ms(cfg) < 1:
        # docs/design.md §5: every request would be refused.
        raise ConfigError(f"lease_ms {cfg.lease_ms} backs no replica lease: it must exceed"
                          f" lease_allowance_ms {cfg.lease_allowance_ms} (plus the clock drift"
                          f" margin of the replica lease)")
    return cfg, raw


def _reopen_logs() -> None:
    if reopen_logs():   # logging to stderr: nothing to reopen
        log.info("arbitrator: log file reopened (SIGHUP)", extra={"event": "log_reopened"})


async def _run(cfg: ArbitratorConfig, metrics_at: tuple[str, int] | None) -> None:
    arb = Arbitrator(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers first: whoever reads "listening" may send SIGTERM at once.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reopen_logs)
    # The metrics listener first: if its address is taken, nothing else started.
    metrics = MetricsListener(arb, loop, *metrics_at) if metrics_at is not None else None
    try:
        await arb.start()
        backed = max_backed_replica_lease_ms(cfg)
        if backed < DEFAULT_REPLICA_LEASE_MS:
            log.warning("arbitrator: lease_ms %d backs replica leases up to %d ms: replicas with"
                        " the default lease (%d ms) will be refused", cfg.lease_ms, backed,
                        DEFAULT_REPLICA_LEASE_MS, extra={"event": "config_warning"})
        print(f"vrepl-arbitrator: listening on {cfg.host}:{arb.port}", flush=True)
        if metrics is not None:
            host, port = metrics.address
            print(f"vrepl-arbitrator: metrics on http://{host}:{port}/metrics", flush=True)
            log.info("arbitrator: metrics on http://%s:%d/metrics", host, port, extra={"event": "listening"})
        await stop.wait()
    finally:
        if metrics is not None:
            metrics.close()
        await arb.stop()
    log.info("arbitrator: stopped (%d grants, %d refusals)", arb.grants, arb.refusals,
             extra={"event": "stopped"})


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineArgumentParser(prog="vrepl-arbitrator", tool="vrepl-arbitrator", description="vrepl arbitrator:"
                                 " grants one master per vgroup and epoch a renewable lease",
                                 epilog="A flag overrides the same key of --config. Exit codes:"
                                 " 0 stopped by SIGTERM/SIGINT, 1 could not start (port in use),"
                                 " 2 bad configuration. Docs: docs/arbitrator.md; example config"
                                 " and systemd unit beside arbitrator/main.py.")
    ap.add_argument("--config", metavar="PATH",
                    help="TOML file (keys as below, optionally under [arbitrator])")
    ap.add_argument("--host", help="address to listen on (127.0.0.1)")
    ap.add_argument("--port", type=int, help="TCP port to listen on; 0 picks a free one (6042)")
    ap.add_argument("--secret-file", dest="secret_file", metavar="PATH",
                    help="file holding the cluster secret (required here or in --config)")
    ap.add_argument("--state-dir", dest="state_dir", metavar="DIR",
                    help="directory where grants survive restarts (.)")
    ap.add_argument("--lease-ms", dest="lease_ms", type=int, metavar="MS",
                    help="how long a grant holds (2500); must exceed the replicas' lease by"
                    " the margin (docs/arbitrator.md §The lease margin)")
    ap.add_argument("--clock-drift-ratio", dest="clock_drift_ratio", type=float, metavar="R",
                    help="clock-rate difference allowed between replica and arbitrator (0.01)")
    ap.add_argument("--lease-allowance-ms", dest="lease_allowance_ms", type=int, metavar="MS",
                    help="fixed allowance for a late tick on the master (400)")
    ap.add_argument("--log-level", dest="log_level", help="debug, info, warning or error (info)")
    ap.add_argument("--log-file", dest="log_file", metavar="PATH", help="log file (stderr)")
    ap.add_argument("--log-format", dest="log_format", choices=LOG_FORMATS,
                    help="text (default) or json: one object per line (docs/operations.md §Logs)")
    ap.add_argument("--metrics-listen", dest="metrics_listen", metavar="HOST:PORT",
                    help=f"address of GET /metrics (default {DEFAULT_METRICS_LISTEN}; port 0: any"
                    " free port; \"\": off)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("host", "port", "secret_file", "state_dir",
                                                "lease_ms", "clock_drift_ratio",
                                                "lease_allowance_ms", "log_level", "log_file",
                                                "log_format", "metrics_listen")}
    logging_ready = False
    try:
        cfg, raw = load_config(args.config, overrides)
        level = raw.get("log_level", "info").upper()
        if level not in LOG_LEVELS:
            raise ConfigError(f"log_level '{raw['log_level']}' is not debug/info/warning/error")
        log_format = raw.get("log_format", "text")
        if log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format '{log_format}' is not text/json")
        metrics_at = metrics_address(raw.get("metrics_listen", DEFAULT_METRICS_LISTEN))
        setup_logging(level=level, log_file=raw.get("log_file"), log_format=log_format)
        # Start-up errors go to the log file too; on stderr the one error line is enough.
        logging_ready = bool(raw.get("log_file"))
        os.makedirs(cfg.state_dir, exist_ok=True)
        asyncio.run(_run(cfg, metrics_at))
    except ConfigError as exc:
        print(f"vrepl-arbitrator: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # unreadable state file
        if logging_ready:
            log.error("arbitrator: cannot start: %s", exc, extra={"event": "config_error"})
        print(f"vrepl-arbitrator: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if logging_ready:
            log.error("arbitrator: cannot start: %s", exc, extra={"event": "start_failed"})
        print(f"vrepl-arbitrator: error: cannot start: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

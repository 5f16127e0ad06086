"""`vrepl-arbitrator`: run the arbitrator from a TOML config and/or flags.

Owns: configuration parsing and validation (including the lease margin a lease_ms can honour,
docs/arbitrator.md), logging setup, signals. Exit codes: 0 stopped by SIGTERM/SIGINT, 2 bad
configuration (one line on stderr), 1 could not start (port in use...).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tomllib

from arbitrator.server import Arbitrator, ArbitratorConfig, max_backed_replica_lease_ms
from vrepl.replica import Config as ReplicaConfig

KEYS = {"host": str, "port": int, "secret": str, "secret_file": str, "state_dir": str,
        "lease_ms": int, "clock_drift_ratio": float, "lease_allowance_ms": int,
        "max_connections": int, "handshake_timeout_ms": int,
        "idle_timeout_ms": int, "log_level": str, "log_file": str}
DEFAULTS = ArbitratorConfig()
# The lease a replica assumes with its default settings (arbitrator_lease_ticks x tick_ms).
DEFAULT_REPLICA_LEASE_MS = ReplicaConfig(vgroup_id=0, replicas=(1,), self_index=0).arbitrator_lease_ms


class ConfigError(Exception):
    pass


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


async def _run(cfg: ArbitratorConfig) -> None:
    arb = Arbitrator(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers first: whoever reads "listening" may send SIGTERM at once.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await arb.start()
    backed = max_backed_replica_lease_ms(cfg)
    if backed < DEFAULT_REPLICA_LEASE_MS:
        logging.getLogger("vrepl.arbitrator").warning(
            "arbitrator: lease_ms %d backs replica leases up to %d ms: replicas with the default"
            " lease (%d ms) will be refused", cfg.lease_ms, backed, DEFAULT_REPLICA_LEASE_MS)
    print(f"vrepl-arbitrator: listening on {cfg.host}:{arb.port}", flush=True)
    await stop.wait()
    await arb.stop()
    logging.getLogger("vrepl.arbitrator").info("arbitrator: stopped (%d grants, %d refusals)",
                                               arb.grants, arb.refusals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vrepl-arbitrator", description="vrepl arbitrator:"
                                 " grants one master per vgroup and epoch a renewable lease")
    ap.add_argument("--config", help="TOML file (keys as below, optionally under [arbitrator])")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--secret-file", dest="secret_file")
    ap.add_argument("--state-dir", dest="state_dir")
    ap.add_argument("--lease-ms", dest="lease_ms", type=int)
    ap.add_argument("--clock-drift-ratio", dest="clock_drift_ratio", type=float)
    ap.add_argument("--lease-allowance-ms", dest="lease_allowance_ms", type=int)
    ap.add_argument("--log-level", dest="log_level")
    ap.add_argument("--log-file", dest="log_file")
    args = ap.parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("host", "port", "secret_file", "state_dir",
                                                "lease_ms", "clock_drift_ratio",
                                                "lease_allowance_ms", "log_level", "log_file")}
    try:
        cfg, raw = load_config(args.config, overrides)
        level = raw.get("log_level", "info").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"log_level '{raw['log_level']}' is not debug/info/warning/error")
        logging.basicConfig(level=level, filename=raw.get("log_file"),
                            format="%(asctime)s %(levelname)s %(message)s")
        os.makedirs(cfg.state_dir, exist_ok=True)
        asyncio.run(_run(cfg))
    except ConfigError as exc:
        print(f"vrepl-arbitrator: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # unreadable state file
        print(f"vrepl-arbitrator: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vrepl-arbitrator: error: cannot start: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

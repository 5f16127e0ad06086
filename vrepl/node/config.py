"""The node process's configuration: one TOML file (docs/operations.md §Configuration).

Owns: reading node.toml into a NodeConfig (this node's id, data directory, cluster secret,
logging, the HTTP API's limits, deadlines, bearer token and TLS files, the cluster's node
table, the vgroups this node hosts, the vnode settings, the sync tunables and the restore
limits), with every setting's default, and the one-line reason a setting is refused
(`ConfigError` naming the file and the key); secret, token and TLS files are read here so
that a bad one stops the node before it starts anything. Must not: open sockets, create
directories or start anything.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from vrepl.client import read_token_file
from vrepl.config import (RENAMED_SYNC_SETTINGS, ReplicaAddress, SyncConfig, parse_endpoint,
                          sync_config_invalid)
from vrepl.errors import ConfigError
from vrepl.logsetup import LOG_FORMATS, LOG_LEVELS
from vrepl.node.http import server_ssl_context
from vrepl.renamed import use_new_names
from vrepl.restore.config import RestoreConfig, restore_config_invalid
from vrepl.txn.config import TxnConfig, txn_config_invalid
from vrepl.vnode.config import RENAMED_VNODE_SETTINGS, VnodeConfig
from vrepl.vnode.config import config_invalid as vnode_config_invalid

# SyncConfig fields the node sets itself; everything else may be tuned under [sync].
_SYNC_FIXED = {"vgroup_id", "replicas", "self_index", "data_path", "secret", "quorum",
               "arbitrator", "initial_version", "initial_epoch"}
SYNC_TUNABLES = {f.name: f for f in dataclasses.fields(SyncConfig) if f.name not in _SYNC_FIXED}
VNODE_SETTINGS = {f.name: f for f in dataclasses.fields(VnodeConfig)}
# [restore]: every RestoreConfig field, by the name of its type ("bool", "int", "float").
RESTORE_SETTINGS = {f.name: str(f.type) for f in dataclasses.fields(RestoreConfig)}


@dataclass(frozen=True)
class NodeAddress:
    """One node of the cluster: its replication server and its HTTP API."""

    id: int
    replication: tuple[str, int]
    http: tuple[str, int]

    @property
    def http_endpoint(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"

    @property
    def replication_endpoint(self) -> str:
        return f"{self.replication[0]}:{self.replication[1]}"


@dataclass(frozen=True)
class ShipSenderConfig:
    """One `[[ship.senders]]` entry: a `vrepl ship` sender this node receives from
    (docs/ship.md §2.1): its id (the HELLO's node field), its own secret, and the vgroups it
    may ship into (empty: every vgroup of this node)."""

    id: int
    secret: bytes = field(repr=False)
    vgroups: tuple[int, ...] = ()


@dataclass(frozen=True)
class VgroupSpec:
    id: int
    replicas: tuple[int, ...]      # node ids
    quorum: int = 0                # 0: a majority
    arbitrator: str | None = None  # "host:port", used for an even replica count


@dataclass(frozen=True)
class HttpSettings:
    listen: tuple[str, int] | None = None   # None: loopback, the port of this node's `http`
    max_body_bytes: int = 8 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024
    idle_timeout_ms: int = 60_000
    header_timeout_ms: int = 10_000         # request line + headers (and a TLS handshake)
    body_timeout_ms: int = 10_000           # a pause in a body; per 64 KiB of it in all
    token_file: str | None = None           # absolute; its content is `token`
    tls_cert: str | None = None             # absolute paths of PEM files
    tls_key: str | None = None
    write_timeout_ms: int = 10_000
    max_query_rows: int = 100_000
    max_pending_writes: int = 10_000        # per vgroup: writes waiting for confirmation
    max_line_bytes: int = 65_536            # one line of InfluxDB line protocol
    token: bytes | None = field(default=None, repr=False)   # read from token_file

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


# [http] keys that name files; `token` is not a key (the token is only ever read from a file).
_HTTP_PATHS = ("token_file", "tls_cert", "tls_key")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class NodeConfig:
    path: str
    node_id: int
    data_dir: str
    secret: bytes
    nodes: dict[int, NodeAddress]
    vgroups: tuple[VgroupSpec, ...]
    http: HttpSettings = field(default_factory=HttpSettings)
    vnode: VnodeConfig = field(default_factory=VnodeConfig)
    sync: dict[str, Any] = field(default_factory=dict)
    restore: RestoreConfig = field(default_factory=RestoreConfig)
    log_level: str = "INFO"
    log_file: str | None = None
    log_format: str = "text"               # "text" or "json" (docs/operations.md §Logs)
    flush_check_ms: int = 1000
    stop_timeout_ms: int = 5000
    ship_senders: dict[int, ShipSenderConfig] = field(default_factory=dict)
    txn: TxnConfig = field(default_factory=TxnConfig)   # [txn]: docs/transactions.md §8

    @property
    def me(self) -> NodeAddress:
        return self.nodes[self.node_id]

    @property
    def http_listen(self) -> tuple[str, int]:
        """Where the HTTP API binds: `http.listen`, else loopback only (docs/security.md §The
        HTTP API): this node's `http` address when that is a loopback one, else 127.0.0.1
        with its port. Serving other hosts is the operator's explicit choice."""
        if self.http.listen is not None:
            return self.http.listen
        host, port = self.me.http
        return (host, port) if _is_loopback(host) else ("127.0.0.1", port)

    def vgroup_path(self, vgroup_id: int) -> str:
        return os.path.join(self.data_dir, f"vg{vgroup_id}")

    def sync_config(self, spec: VgroupSpec) -> SyncConfig:
        replicas = tuple(ReplicaAddress(n, *self.nodes[n].replication) for n in spec.replicas)
        return SyncConfig(vgroup_id=spec.id, replicas=replicas,
                          self_index=spec.replicas.index(self.node_id),
                          data_path=self.vgroup_path(spec.id), secret=self.secret,
                          quorum=spec.quorum, arbitrator=spec.arbitrator, **self.sync)


# ---------------------------------------------------------------------------------------------

def _type_ok(value: Any, want: type) -> bool:
    if want is bool:
        return type(value) is bool
    if want is int:
        return type(value) is int
    if want is str:
        return type(value) is str
    if want is float:
        return type(value) in (int, float)  # TOML writes 0 for 0.0
    return isinstance(value, want)


def _get(table: dict, key: str, want: type, default: Any, where: str) -> Any:
    if key not in table:
        return default
    v = table[key]
    if not _type_ok(v, want):
        raise ConfigError(f"{where}{key} must be {want.__name__}, got {v!r}")
    return v


def _positive(v: int, name: str) -> int:
    if v <= 0:
        raise ConfigError(f"{name} must be > 0, got {v}")
    return v


def _endpoint(text: Any, name: str) -> tuple[str, int]:
    if type(text) is not str:
        raise ConfigError(f"{name} must be a \"host:port\" string, got {text!r}")
    try:
        return parse_endpoint(text)
    except ConfigError:
        raise ConfigError(f"{name} {text!r} is not host:port") from None


def _unknown(table: dict, known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise ConfigError(f"unknown setting {where}{extra[0]}")


def parse_config(doc: dict[str, Any], path: str = "node.toml") -> NodeConfig:
    """NodeConfig from a parsed TOML document; ConfigError (one line) if a setting is wrong."""
    base_dir = os.path.dirname(os.path.abspath(path))
    _unknown(doc, {"node_id", "data_dir", "secret", "secret_file", "log_level", "log_file",
                   "log_format", "flush_check_ms", "stop_timeout_ms", "http", "nodes", "vgroups",
                   "vnode", "sync", "restore", "ship", "txn"}, "")
    if "node_id" not in doc:
        raise ConfigError("node_id is missing")
    node_id = _get(doc, "node_id", int, None, "")
    if "data_dir" not in doc:
        raise ConfigError("data_dir is missing")
    data_dir = _get(doc, "data_dir", str, None, "")
    data_dir = os.path.join(base_dir, data_dir) if not os.path.isabs(data_dir) else data_dir
    secret_text = _get(doc, "secret", str, None, "")
    secret_file = _get(doc, "secret_file", str, None, "")
    if secret_text and secret_file:
        raise ConfigError("give secret or secret_file, not both")
    if secret_file:
        sf = secret_file if os.path.isabs(secret_file) else os.path.join(base_dir, secret_file)
        try:
            with open(sf, "rb") as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"secret_file {sf}: {exc.strerror}") from None
    else:
        secret = (secret_text or "").encode()
    if not secret:
        raise ConfigError("secret (or secret_file) is missing or empty: the cluster secret"
                          " authenticates replication connections")
    log_level = _get(doc, "log_level", str, "INFO", "").upper()
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"log_level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    log_file = _get(doc, "log_file", str, None, "") or None
    if log_file and not os.path.isabs(log_file):
        log_file = os.path.join(base_dir, log_file)
    log_format = _get(doc, "log_format", str, "text", "")
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    flush_check_ms = _positive(_get(doc, "flush_check_ms", int, 1000, ""), "flush_check_ms")
    stop_timeout_ms = _positive(_get(doc, "stop_timeout_ms", int, 5000, ""), "stop_timeout_ms")

    # [[nodes]]
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError("[[nodes]] is missing: list every node (id, replication, http)")
    nodes: dict[int, NodeAddress] = {}
    seen: set[tuple[str, int]] = set()
    for i, n in enumerate(raw_nodes):
        where = f"nodes[{i}]."
        if not isinstance(n, dict):
            raise ConfigError(f"nodes[{i}] must be a table")
        _unknown(n, {"id", "replication", "http"}, where)
        for key in ("id", "replication", "http"):
            if key not in n:
                raise ConfigError(f"{where}{key} is missing")
        nid = _get(n, "id", int, None, where)
        if nid <= 0 or nid > 2**31 - 1:
            raise ConfigError(f"{where}id must be in 1..2^31-1, got {nid}")
        if nid in nodes:
            raise ConfigError(f"{where}id {nid} appears twice")
        rep = _endpoint(n["replication"], f"{where}replication")
        http_addr = _endpoint(n["http"], f"{where}http")
        for ep in (rep, http_addr):
            if ep in seen:
                raise ConfigError(f"{where}: address {ep[0]}:{ep[1]} is used twice")
            seen.add(ep)
        nodes[nid] = NodeAddress(nid, rep, http_addr)
    if node_id not in nodes:
        raise ConfigError(f"node_id {node_id} is not in [[nodes]]")

    # [[vgroups]]
    raw_vgroups = doc.get("vgroups")
    if not isinstance(raw_vgroups, list) or not raw_vgroups:
        raise ConfigError("[[vgroups]] is missing: list the vgroups this node hosts")
    vgroups: list[VgroupSpec] = []
    for i, g in enumerate(raw_vgroups):
        where = f"vgroups[{i}]."
        if not isinstance(g, dict):
            raise ConfigError(f"vgroups[{i}] must be a table")
        _unknown(g, {"id", "replicas", "quorum", "arbitrator"}, where)
        if "id" not in g or "replicas" not in g:
            raise ConfigError(f"{where}{'id' if 'id' not in g else 'replicas'} is missing")
        gid = _get(g, "id", int, None, where)
        if not 0 <= gid <= 0xFFFFFFFF:
            raise ConfigError(f"{where}id must be in 0..2^32-1, got {gid}")
        if any(v.id == gid for v in vgroups):
            raise ConfigError(f"{where}id {gid} appears twice")
        reps = g["replicas"]
        if not isinstance(reps, list) or not reps or any(type(r) is not int for r in reps):
            raise ConfigError(f"{where}replicas must be a non-empty list of node ids")
        if len(set(reps)) != len(reps):
            raise ConfigError(f"{where}replicas lists a node twice")
        for r in reps:
            if r not in nodes:
                raise ConfigError(f"{where}replicas: node {r} is not in [[nodes]]")
        if node_id not in reps:
            raise ConfigError(f"{where}replicas {reps} do not include this node ({node_id})")
        quorum = _get(g, "quorum", int, 0, where)
        if not 0 <= quorum <= len(reps):
            raise ConfigError(f"{where}quorum {quorum} is not in 0..{len(reps)} (0: a majority)")
        arb = _get(g, "arbitrator", str, None, where) or None
        if arb is not None:
            _endpoint(arb, f"{where}arbitrator")
        vgroups.append(VgroupSpec(gid, tuple(reps), quorum, arb))

    # [http]
    h = doc.get("http", {})
    if not isinstance(h, dict):
        raise ConfigError("[http] must be a table")
    hfields = {f.name: f for f in dataclasses.fields(HttpSettings) if f.name != "token"}
    _unknown(h, set(hfields), "http.")
    hvals: dict[str, Any] = {}
    for name, f in hfields.items():
        if name not in h:
            continue
        if name == "listen":
            hvals[name] = _endpoint(h[name], "http.listen")
        elif name in _HTTP_PATHS:
            given = _get(h, name, str, None, "http.")
            if not given:
                raise ConfigError(f"http.{name} is empty")
            hvals[name] = given if os.path.isabs(given) else os.path.join(base_dir, given)
        else:
            hvals[name] = _positive(_get(h, name, int, f.default, "http."), f"http.{name}")
    if "token_file" in hvals:
        try:
            hvals["token"] = read_token_file(hvals["token_file"]).encode()
        except ConfigError as exc:
            raise ConfigError(f"http.token_file {exc}") from None
    if ("tls_cert" in hvals) != ("tls_key" in hvals):
        raise ConfigError("give both http.tls_cert and http.tls_key (or neither)")
    if "tls_cert" in hvals:
        try:
            server_ssl_context(hvals["tls_cert"], hvals["tls_key"])
        except ConfigError as exc:
            raise ConfigError(f"http.{exc}") from None
    http = HttpSettings(**hvals)

    # [vnode]
    v = doc.get("vnode", {})
    if not isinstance(v, dict):
        raise ConfigError("[vnode] must be a table")
    v, given_as = use_new_names(v, RENAMED_VNODE_SETTINGS, "vnode.", f"{path}: ")
    _unknown(v, set(VNODE_SETTINGS), "vnode.")
    vvals: dict[str, Any] = {}
    for name in v:
        want = {"precision": str, "fsync": bool}.get(name, int)
        try:
            vvals[name] = _get(v, name, want, None, "vnode.")
        except ConfigError as exc:
            raise ConfigError(_name_as_given(str(exc), given_as)) from None
    vcfg = VnodeConfig(**vvals)
    reason = vnode_config_invalid(vcfg)
    if reason:
        raise ConfigError(_name_as_given(f"vnode.{reason}", given_as))

    # [sync]
    s = doc.get("sync", {})
    if not isinstance(s, dict):
        raise ConfigError("[sync] must be a table")
    s, sync_given_as = use_new_names(s, RENAMED_SYNC_SETTINGS, "sync.", f"{path}: ")
    _unknown(s, set(SYNC_TUNABLES), "sync.")
    svals: dict[str, Any] = {}
    for name in s:
        want = {"app_ack_required": bool, "clock_drift_ratio": float}.get(name, int)
        try:
            svals[name] = _get(s, name, want, None, "sync.")
        except ConfigError as exc:
            raise ConfigError(_name_as_given(str(exc), sync_given_as)) from None
    rcfg = _restore_settings(doc.get("restore", {}))
    ship_senders = _ship_settings(doc.get("ship", {}), base_dir, {v.id for v in vgroups})
    tcfg = _txn_settings(doc.get("txn", {}))
    cfg = NodeConfig(path=path, node_id=node_id, data_dir=data_dir, secret=secret, nodes=nodes,
                     vgroups=tuple(vgroups), http=http, vnode=vcfg, sync=svals, restore=rcfg,
                     log_level=log_level, log_file=log_file, log_format=log_format,
                     flush_check_ms=flush_check_ms,
                     stop_timeout_ms=stop_timeout_ms, ship_senders=ship_senders, txn=tcfg)
    for spec in cfg.vgroups:
        reason = sync_config_invalid(cfg.sync_config(spec))
        if reason:
            raise ConfigError(_name_as_given(f"vgroup {spec.id}: {reason}", sync_given_as))
    if vcfg.max_payload_bytes > cfg.sync_config(cfg.vgroups[0]).max_record_bytes:
        raise ConfigError(_name_as_given("vnode.max_payload_bytes is above sync.max_record_bytes",
                                         sync_given_as))
    return cfg


def _name_as_given(reason: str, given_as: dict[str, str]) -> str:
    """`reason`, with each renamed setting that was written by its old name named as written
    too: "max_memtable_rows (written memtable_max_rows) must be ..."."""
    for new, old in given_as.items():
        reason = re.sub(rf"\b{new}\b", f"{new} (written {old})", reason, count=1)
    return reason


def _ship_settings(table: Any, base_dir: str, vgroup_ids: set[int]) -> dict[int, ShipSenderConfig]:
    """[ship]: `[[ship.senders]]` id, secret (or secret_file), vgroups (docs/ship.md §2.1)."""
    if not isinstance(table, dict):
        raise ConfigError("[ship] must be a table")
    _unknown(table, {"senders"}, "ship.")
    raw = table.get("senders", [])
    if not isinstance(raw, list):
        raise ConfigError("ship.senders must be an array of tables ([[ship.senders]])")
    out: dict[int, ShipSenderConfig] = {}
    for i, s in enumerate(raw):
        where = f"ship.senders[{i}]."
        if not isinstance(s, dict):
            raise ConfigError(f"ship.senders[{i}] must be a table")
        _unknown(s, {"id", "secret", "secret_file", "vgroups"}, where)
        if "id" not in s:
            raise ConfigError(f"{where}id is missing")
        sid = _get(s, "id", int, None, where)
        if not 1 <= sid <= 2**31 - 1:
            raise ConfigError(f"{where}id must be in 1..2^31-1, got {sid}")
        if sid in out:
            raise ConfigError(f"{where}id {sid} appears twice")
        text = _get(s, "secret", str, None, where)
        sfile = _get(s, "secret_file", str, None, where)
        if text and sfile:
            raise ConfigError(f"{where.rstrip('.')}: give secret or secret_file, not both")
        if sfile:
            path = sfile if os.path.isabs(sfile) else os.path.join(base_dir, sfile)
            try:
                with open(path, "rb") as fh:
                    secret = fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"{where}secret_file {path}: {exc.strerror}") from None
        else:
            secret = (text or "").encode()
        if len(secret) < 16:
            raise ConfigError(f"{where}secret is missing or shorter than 16 bytes: each sender"
                              " authenticates with its own secret")
        vgs = s.get("vgroups", [])
        if not isinstance(vgs, list) or any(type(v) is not int for v in vgs):
            raise ConfigError(f"{where}vgroups must be a list of vgroup ids")
        for v in vgs:
            if v not in vgroup_ids:
                raise ConfigError(f"{where}vgroups: this node hosts no vgroup {v}")
        out[sid] = ShipSenderConfig(sid, secret, tuple(vgs))
    return out


def _restore_settings(table: Any) -> RestoreConfig:
    """[restore]: the restore flow's limits (docs/restore.md §7), every vgroup of the node."""
    if not isinstance(table, dict):
        raise ConfigError("[restore] must be a table")
    _unknown(table, set(RESTORE_SETTINGS), "restore.")
    vals: dict[str, Any] = {}
    for name, type_name in RESTORE_SETTINGS.items():
        if name not in table:
            continue
        v = table[name]
        if type_name == "float" and type(v) in (int, float):
            vals[name] = float(v)      # TOML writes 5 for 5.0: seconds may be whole
        else:
            vals[name] = _get(table, name, {"bool": bool, "int": int}.get(type_name, float),
                              None, "restore.")
    cfg = RestoreConfig(**vals)
    reason = restore_config_invalid(cfg)
    if reason:
        raise ConfigError(reason)
    return cfg


def _txn_settings(table: Any) -> TxnConfig:
    """[txn]: limits of the transactional load (docs/operations.md §[txn])."""
    if not isinstance(table, dict):
        raise ConfigError("[txn] must be a table")
    _unknown(table, {f.name for f in fields(TxnConfig)}, "txn.")
    cfg = TxnConfig(**{name: _get(table, name, int, None, "txn.") for name in table})
    reason = txn_config_invalid(cfg)
    if reason:
        raise ConfigError(f"txn.{reason}")
    return cfg


def load_config(path: str) -> NodeConfig:
    """Read and check node.toml; ConfigError "<path>: <reason>" on any problem."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_config(doc, path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None

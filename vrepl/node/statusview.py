"""`vrepl status`: every node of every vgroup, including the ones that do not answer
(docs/operations.md §vrepl status).

Owns: asking every node of the cluster for its /v1/status at once (one thread each, so a
stalled node costs one timeout, not one per node), telling apart a node that is down (the
connection is refused), stalled (it accepts but does not answer: paused, hung) and up; the
cluster view built from the answers (per vgroup and replica: role, last version, lag in
versions and ms from the master, time since last heard as the others report it, any status
field this version does not know, the arbitrator and the lease holder); its rendering as rich
tables, once or refreshed in place (`--watch`), or as JSON.
Must not: change anything on a node (it only GETs /v1/status).
"""
from __future__ import annotations

import concurrent.futures
import functools
import http.client
import json
import socket
import time
from datetime import datetime
from typing import Any, Callable

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vrepl.client import Client
from vrepl.untrusted import printable

# Fields of a vgroup's status this module shows in its own columns; any other field a node
# sends (a newer node, e.g. a vgroup state) is shown as is under "notes".
KNOWN_FIELDS = frozenset((
    "vgroup", "role", "epoch", "master", "master_http", "version", "wal_last_version",
    "wal_durable_version", "confirmed_version", "committed_version", "replicas", "peers",
    "arbitrator", "flow_control", "pending_writes", "vnode", "counters", "state",
    "last_self_restore", "ingest", "txn"))
STATE_STYLE = {"up": "green", "down": "red", "stalled": "yellow", "unreachable": "red", "error": "red"}
ROLE_STYLE = {"master": "green", "slave": "cyan", "needs_restore": "red"}


def fetch_status(endpoint: str, timeout_s: float,
                 client_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """One node's /v1/status: {"state": up|down|stalled|unreachable|error, "status", "error"}.
    `client_kw`: the token and TLS options of vrepl.client.Client (docs/security.md)."""
    client = Client([endpoint], request_timeout_s=timeout_s, **(client_kw or {}))
    try:
        code, doc = client.request(endpoint, "GET", "/v1/status")
    except ConnectionRefusedError:
        return {"state": "down", "status": None, "error": "connection refused"}
    except (socket.timeout, TimeoutError):
        return {"state": "stalled", "status": None,
                "error": f"accepts connections but sent no answer within {timeout_s:g} s"}
    except (OSError, http.client.HTTPException) as exc:
        return {"state": "unreachable", "status": None, "error": str(exc) or type(exc).__name__}
    finally:
        client.close()
    if code != 200:
        return {"state": "error", "status": None, "error": f"HTTP {code}: {doc.get('error', '')}"}
    return {"state": "up", "status": doc, "error": None}


def gather(seed: str, timeout_s: float, known: dict[str, str] | None = None,
           fetch: Callable[[str, float], dict[str, Any]] | None = None,
           client_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ask the seed node, then every node it (or `known`, node id -> http) lists, in
    parallel; the cluster view (`build_view`). The seed's own answer decides the node list
    when it answers."""
    if fetch is None:
        fetch = functools.partial(fetch_status, client_kw=client_kw)
    first = fetch(seed, timeout_s)
    nodes: dict[str, str] = dict(known or {})
    seed_id = next((nid for nid, ep in nodes.items() if ep == seed), None)
    if first["status"] is not None:
        nodes.update({nid: info["http"] for nid, info in first["status"].get("nodes", {}).items()})
        seed_id = str(first["status"]["node"])
    answers: dict[str, dict[str, Any]] = {}
    if seed_id is not None:
        answers[seed_id] = first
        nodes.setdefault(seed_id, seed)
    todo = {nid: ep for nid, ep in nodes.items() if nid != seed_id}
    if todo:
        with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
            futs = {nid: pool.submit(fetch, ep, timeout_s) for nid, ep in todo.items()}
            for nid, fut in futs.items():
                answers[nid] = fut.result()
    view = build_view({nid: {"http": nodes[nid], **a} for nid, a in answers.items()})
    view["seed"] = {"http": seed, "state": first["state"], "error": first["error"]}
    return view


def _vgroup_docs(node: dict[str, Any]) -> dict[int, dict[str, Any]]:
    st = node.get("status") or {}
    return {vg["vgroup"]: vg for vg in st.get("vgroups", [])}


def _notes(vg: dict[str, Any]) -> dict[str, Any]:
    notes = {k: v for k, v in vg.items() if k not in KNOWN_FIELDS and v not in (None, False, 0, "", [], {})}
    nr = notes.get("needs_restore")
    if isinstance(nr, dict):   # docs/operations.md §A vgroup that needs a restore
        notes["needs_restore"] = (f"{nr.get('phase')}, attempt {nr.get('attempts')}"
                                  + (f", last error: {nr['last_error']}" if nr.get("last_error") else ""))
    return notes


def _role(vg: dict[str, Any]) -> str:
    """The role column: the vgroup's state instead when it is not serving (needs_restore)."""
    state = vg.get("state", "serving")
    return vg["role"] if state == "serving" else state


def build_view(nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The cluster from each node's answer ({node id: {"http", "state", "status", "error"}})."""
    docs = {nid: _vgroup_docs(n) for nid, n in nodes.items()}
    vgroup_ids = sorted({vid for d in docs.values() for vid in d})
    vgroups = []
    for vid in vgroup_ids:
        mine = {nid: d[vid] for nid, d in docs.items() if vid in d}
        members = sorted({int(n) for vg in mine.values() for n in vg.get("replicas", {})} | {int(n) for n in mine},
                         key=int)
        masters = sorted(((vg.get("epoch", 0), nid) for nid, vg in mine.items() if vg.get("role") == "master"),
                         reverse=True)
        master_id = masters[0][1] if masters else None
        master_vg = mine.get(master_id) if master_id is not None else None
        arb_address = next((vg["arbitrator"].get("address") for vg in mine.values()
                            if vg.get("arbitrator", {}).get("address")), None)
        holder = None
        for nid, vg in mine.items():
            lease = (vg.get("arbitrator") or {}).get("lease")
            if lease:
                holder = {"node": int(nid), **lease}
        replicas = []
        for node in members:
            nid = str(node)
            info = nodes.get(nid, {"http": None, "state": "unknown", "error": "not listed by any node"})
            own = mine.get(nid)
            seen = [vg.get("replicas", {}).get(nid) for other, vg in mine.items() if other != nid]
            peer = (master_vg or {}).get("peers", {}).get(nid, {}) if nid != master_id else {}
            heard = [vg["peers"][nid].get("last_heard_ms") for other, vg in mine.items()
                     if other != nid and nid in vg.get("peers", {})]
            heard = [h for h in heard if h is not None]
            row: dict[str, Any] = {
                "node": node, "http": info.get("http"), "state": info["state"], "error": info.get("error"),
                "role": _role(own) if own else next((r for r in seen if r), None),
                "epoch": own["epoch"] if own else None,
                "last_version": own.get("wal_last_version") if own else peer.get("acked_version"),
                "last_version_from": "self" if own else ("master" if peer else None),
                "applied_version": own.get("version") if own else None,
                "lag_versions": 0 if nid == master_id else peer.get("lag_versions"),
                "lag_ms": 0 if nid == master_id else peer.get("lag_ms"),
                "last_heard_ms": min(heard) if heard else None,
                "notes": _notes(own) if own else {},
            }
            replicas.append(row)
        vgroups.append({
            "vgroup": vid, "master": int(master_id) if master_id is not None else None,
            "epoch": masters[0][0] if masters else max((vg.get("epoch", 0) for vg in mine.values()), default=None),
            "masters": [int(nid) for _, nid in masters],
            "arbitrator": {"address": arb_address,
                           "connected": sorted(int(nid) for nid, vg in mine.items()
                                               if (vg.get("arbitrator") or {}).get("connected")),
                           "lease_holder": holder},
            "replicas": replicas,
        })
    return {
        "time": datetime.now().astimezone().isoformat(timespec="milliseconds"),
        "nodes": {nid: {"http": n.get("http"), "state": n["state"], "error": n.get("error"),
                        "status": n.get("status")} for nid, n in sorted(nodes.items(), key=lambda kv: int(kv[0]))},
        "vgroups": vgroups,
        # Ship senders as each node reports them (docs/ship.md §9): the master of the
        # receiving vgroup knows the rounds; a node that never received one lists none.
        "ship_senders": [{"node": int(nid), **s} for nid, n in sorted(nodes.items(), key=lambda kv: int(kv[0]))
                         for s in ((n.get("status") or {}).get("ship_senders") or [])
                         if isinstance(s, dict)],
    }


def view_from_cluster_status(cluster: dict[str, Any]) -> dict[str, Any]:
    """build_view from Client.cluster_status() (http address -> status, or the error text)."""
    nodes: dict[str, dict[str, Any]] = {}
    for ep, st in cluster.items():
        if isinstance(st, dict):
            nodes[str(st["node"])] = {"http": ep, "state": "up", "status": st, "error": None}
    for ep, st in cluster.items():
        if not isinstance(st, dict):
            nid = next((n for d in cluster.values() if isinstance(d, dict)
                        for n, info in d.get("nodes", {}).items() if info.get("http") == ep), ep)
            nodes[str(nid)] = {"http": ep, "state": "unreachable", "status": None, "error": st}
    return build_view(nodes)


# -- rendering -----------------------------------------------------------------------------------

def _ms(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def render(view: dict[str, Any]) -> Group:
    """One table per vgroup, and a line for nodes that host none of them."""
    parts: list[Any] = []
    for vg in view["vgroups"]:
        arb = vg["arbitrator"]
        if arb["address"]:
            holder = arb["lease_holder"]
            lease = (f"lease n{holder['node']} e{holder['epoch']} ({holder['remaining_ms']} ms left)"
                     if holder else "no live lease")
            connected = " ".join(f"n{n}" for n in arb["connected"]) or "nobody"
            arb_line = escape(printable(f"arbitrator {arb['address']} (connected: {connected}), {lease}"))
        else:
            arb_line = "no arbitrator"
        master = f"master n{vg['master']}" if vg["master"] is not None else "[yellow]no master[/]"
        if len(vg["masters"]) > 1:
            master += f" [red](nodes claiming master: {', '.join(f'n{n}' for n in vg['masters'])})[/]"
        table = Table(title=f"vgroup {vg['vgroup']}: {master}, epoch {_num(vg['epoch'])}",
                      caption=arb_line, title_justify="left", caption_justify="left")
        for col in ("node", "http", "state", "role", "epoch", "last version", "lag", "lag ms",
                    "last heard", "notes"):
            table.add_column(col, justify="right" if col in ("epoch", "last version", "lag", "lag ms",
                                                             "last heard") else "left")
        for r in vg["replicas"]:
            state = Text(r["state"], style=STATE_STYLE.get(r["state"], "yellow"))
            role = Text(printable(r["role"] or "-"), style=ROLE_STYLE.get(r["role"] or "", "yellow"))
            last = _num(r["last_version"]) + ("*" if r["last_version_from"] == "master" else "")
            notes = [f"{k}={v if not isinstance(v, (dict, list)) else json.dumps(v)[:60]}" if v is not True else k
                     for k, v in r["notes"].items()]
            if r["state"] != "up" and r["error"]:
                notes.append(r["error"])
            # Text cells (never markup) of escaped text: what a node says is not trusted.
            table.add_row(f"n{r['node']}", Text(printable(r["http"] or "-")), state, role,
                          _num(r["epoch"]), last, _num(r["lag_versions"]), _ms(r["lag_ms"]),
                          _ms(r["last_heard_ms"]), Text(printable("; ".join(str(n) for n in notes))))
        parts.append(table)
    hosting = {str(r["node"]) for vg in view["vgroups"] for r in vg["replicas"]}
    for nid, n in view["nodes"].items():
        if nid not in hosting:
            parts.append(Text(printable(f"n{nid} {n['http']}: {n['state']}"
                                        + (f" ({n['error']})" if n["error"] else ""))))
    for snd in view.get("ship_senders", []):
        err = f", last error: {snd.get('last_error')}" if snd.get("last_error") else ""
        parts.append(Text(printable(
            f"ship sender {snd.get('uuid')} (id {snd.get('sender_id')}, {snd.get('host') or '?'}) -> n{snd['node']}"
            f" vg{snd.get('vgroup')}: {'connected, ' if snd.get('connected') else ''}last round {snd.get('last_round')}"
            f", {snd.get('files')} files held, {snd.get('files_behind')} files / {snd.get('bytes_behind')} B behind{err}")))
    if any(r["last_version_from"] == "master" for vg in view["vgroups"] for r in vg["replicas"]):
        parts.append(Text("* as acknowledged to the master (the node itself did not answer)"))
    parts.append(Text(f"as of {view['time']}", style="dim"))
    return Group(*parts)


def print_view(view: dict[str, Any], console: Console) -> None:
    console.print(render(view))


def run(seed: str, timeout_s: float, *, as_json: bool, watch_s: float | None, count: int | None,
        console: Console, client_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Show the cluster once, or every `watch_s` seconds in place (`count` times, or until
    Ctrl-C). Returns the last view. `client_kw`: token and TLS options (fetch_status)."""
    view = gather(seed, timeout_s, client_kw=client_kw)
    known = {nid: n["http"] for nid, n in view["nodes"].items()}
    if watch_s is None:
        if as_json:
            print(json.dumps(view, indent=2))
        else:
            print_view(view, console)
        return view
    shown = 0
    try:
        if as_json or not console.is_terminal:
            # Not a terminal: each refresh is printed after the previous one (JSON: one
            # document per line).
            while True:
                if as_json:
                    print(json.dumps(view), flush=True)
                else:
                    print_view(view, console)
                shown += 1
                if count is not None and shown >= count:
                    return view
                time.sleep(watch_s)
                view = gather(seed, timeout_s, known, client_kw=client_kw)
                known.update({nid: n["http"] for nid, n in view["nodes"].items()})
        with Live(render(view), console=console, auto_refresh=False) as live:
            shown = 1
            while count is None or shown < count:
                time.sleep(watch_s)
                view = gather(seed, timeout_s, known, client_kw=client_kw)
                known.update({nid: n["http"] for nid, n in view["nodes"].items()})
                live.update(render(view), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass
    return view

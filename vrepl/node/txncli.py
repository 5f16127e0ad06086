"""`vrepl txn list|show|abort` (docs/transactions.md §10, docs/operations.md §Transactions).

Owns: the three commands' parsers and their output (a table, or --json). They talk to a
node's HTTP API through vrepl.client (list and show on the node named, abort on the
vgroup's master). Must not: print anything but the answer or one error line.

Exit codes (vrepl/exitcodes.py): 0 done, 1 refused (no such transaction, abort after
commit), 2 usage, 4 the node is unreachable or answered 5xx.
"""
from __future__ import annotations

import argparse
import http.client
import json
import time
from typing import Any

from vrepl.argparsing import host_port
from vrepl.client import Client
from vrepl.errors import BadRequestError, ClientError, CliError
from vrepl.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_PEER

COLUMNS = ("txn", "label", "state", "tables", "rows", "bytes", "files", "file_bytes", "age_s",
           "waits_on")


def add_parsers(sub: Any, access_options: Any, run: Any) -> None:
    """`run(args)`: the command (cli.py's, which adds the token/TLS access to cmd_txn)."""
    t = sub.add_parser("txn", help="list, show or abort a vgroup's transactions",
                       description="The transactions of a vgroup (docs/transactions.md): their"
                       " state, tables, rows, bytes, files, age and what each waits on.",
                       epilog="exit codes: 0 done, 1 refused (no such transaction, abort of a"
                       " visible one), 2 usage, 4 node unreachable or failing."
                       " docs: docs/transactions.md")
    tsub = t.add_subparsers(dest="txn_command", metavar="TXN_COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--node", required=True, type=host_port, metavar="HOST:PORT",
                        help="a node's HTTP address (list/show read that replica; abort goes to"
                        " the master, found from it)")
        sp.add_argument("--vgroup", type=int, default=1, metavar="N", help="vgroup id (default 1)")
        sp.add_argument("--json", action="store_true", help="print the node's JSON answer")
        sp.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for the node (default 10)")
        access_options(sp)

    ls = tsub.add_parser("list", help="the vgroup's transactions, newest first")
    common(ls)
    ls.add_argument("--open", action="store_true", help="only PREPARE / PRECOMMITTED ones")
    ls.set_defaults(func=run)
    sh = tsub.add_parser("show", help="one transaction")
    sh.add_argument("txn", metavar="TXN", help="a transaction id, or label:<label>")
    common(sh)
    sh.set_defaults(func=run)
    ab = tsub.add_parser("abort", help="abort an open transaction (an abort record)")
    ab.add_argument("txn", metavar="TXN", help="a transaction id, or label:<label>")
    ab.add_argument("--reason", default="operator", help="recorded as 'client: <reason>'")
    common(ab)
    ab.set_defaults(func=run)
    t.set_defaults(func=lambda args: (t.print_help(), 2)[1])


def _row(d: dict[str, Any], now_ms: int) -> list[str]:
    age = (now_ms - d.get("begin_at_ms", now_ms)) / 1000
    vals = {**d, "tables": ",".join(d.get("tables", [])) or "-", "age_s": f"{age:.1f}"}
    if d.get("reason"):
        vals["state"] = f"{d['state']} ({d['reason']})"
    return [str(vals.get(c, "")) for c in COLUMNS]


def _table(docs: list[dict[str, Any]]) -> str:
    now_ms = int(time.time() * 1000)
    rows = [list(COLUMNS)] + [_row(d, now_ms) for d in docs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def cmd_txn(args: argparse.Namespace, access: dict | None = None) -> int:
    if not args.timeout > 0:
        raise CliError(f"--timeout must be positive, got {args.timeout:g}")
    cl = Client([args.node], timeout_s=args.timeout, request_timeout_s=args.timeout,
                **(access or {}))
    try:
        if args.txn_command == "list":
            doc = cl.transactions(args.vgroup, node=args.node, open_only=args.open)
            print(json.dumps(doc, indent=1) if args.json else _table(doc["txns"]))
        elif args.txn_command == "show":
            doc = cl._get(args.vgroup, f"txn/{args.txn}", args.node)
            print(json.dumps(doc, indent=1) if args.json else _table([doc]))
        else:
            doc = cl._get(args.vgroup, f"txn/{args.txn}", args.node)
            txn = cl.transaction(args.vgroup, doc["label"])
            txn.id = doc["txn"]
            done = txn.abort(args.reason)
            print(json.dumps(done, indent=1) if args.json else _table([done]))
        return EXIT_OK
    except BadRequestError as exc:
        raise CliError(f"{args.node}: {exc}", EXIT_FAILED) from None
    except (ClientError, OSError, http.client.HTTPException) as exc:
        raise CliError(f"{args.node}: {type(exc).__name__}: {exc}", EXIT_PEER) from None
    finally:
        cl.close()

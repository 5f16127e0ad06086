"""The node process: hosts vgroups (a reference Vnode + a SyncInstance each) behind an
HTTP/JSON client API (docs/operations.md, docs/client-api.md).

Modules: config.py (node.toml), http.py (a small asyncio HTTP/1.1 server), vgroup.py (one
vgroup: life, the sync callbacks, flush trigger, status), vgroup_client.py (its client API:
writes, dedup, queries), vgroup_restore.py (its needs_restore state and self-restore),
server.py (the process: recovery, start, routes, graceful stop), local.py (node processes on loopback for the demo, tests and
benchmarks), loadgen.py (the load generator), demo.py (`vrepl demo`).
Must not: reach into the replication core; it uses the embedding API (docs/embedding.md).
"""

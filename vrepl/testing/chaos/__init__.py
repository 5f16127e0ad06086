"""Real-process fault injection (docs/reliability.md): the shipped `vrepl node` processes in
network namespaces, a client workload in its own namespace, a nemesis (signals, nftables
partitions and packet loss in the bridge namespace, tmpfs disk-full, WAL tail damage) and a
checker that compares the clients' history with every replica's rows, read through the
client API, and with every replica's WAL.

Modules: netns (topology, nftables, cleanup registry), workload (the client process: the
writers, and the harness's status, write and read requests), check (history + rows + WALs
-> verdict, pure), harness (ChaosCluster: set-up, processes and faults), procs (one process
of the run, a node's role lines), diskfaults (disk-full and WAL damage), healcheck (heal,
converge, read back, the Result), schedules (the named fault schedules), __main__ (run
schedules, print figures).
Must not: touch any network outside the namespaces it created or 127.0.0.1.
"""

"""Side-by-side benchmark of vrepl against peer replication engines (issue 8, deliver item 1).

One command, `python -m bench.compare [--quick]`, runs the same two workloads against every
system on this machine, in one run, so the ratios between systems come from one set of
conditions:

  (a) latency: one client, one write at a time, each confirmed by a quorum of 2 of 3;
  (b) throughput: many clients, batches of 100 writes of ~100 bytes, each batch confirmed by
      a quorum of 2 of 3, for a fixed duration.

Each is run twice, with fsync per write/batch and without. The package owns the harness only:
starting and stopping servers (`procs`), installing peers (`install`), the workloads
(`workload`), figures and tables (`stats`, `report`), and one driver per system (`drivers`).
The vrepl drivers are a plug-in point (`drivers/vrepl_driver.py`); see docs/compare.md.
"""

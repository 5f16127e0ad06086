"""vrepl.testing: harness code importable by tests and benchmarks (node_runner: one node in
its own process driven over stdin/stdout; cluster: a group of such processes on 127.0.0.1)."""

"""The end of a chaos run: heal, converge, read back and check (the mixin HealAndCheck of
ChaosCluster, vrepl/testing/chaos/harness.py; docs/reliability.md).

Owns: healing every fault, waiting for one master with every other node its slave, a
barrier write and every log ending at the same place, reading every table from every
replica and every WAL, stopping the nodes (the master last), the checker's verdict
(vrepl/testing/chaos/check.py) and the run's Result with its figures.
The cluster's state it uses (nodes, the workload, marks, paths) lives on ChaosCluster.
Must not: inject a fault, or decide a verdict itself (check.py does, from the history, rows
and WALs).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from vrepl import wal
from vrepl.testing.chaos import check as _check


class HealAndCheck:
    def heal(self) -> None:
        if self.namespaced:
            self.topo.heal()
        for i, p in self.nodes.items():
            if p.paused:
                self.resume(i)
        self.mark("heal")

    def all_follow(self, among: list[int] | None = None) -> int | None:
        """The master, if among (default all) the nodes are one master and its slaves, by
        their /v1/status."""
        sts = {i: self.status(i) for i in among or self.nodes}
        if any(s is None for s in sts.values()):
            return None
        masters = [i for i, s in sts.items() if s["role"] == "master"]  # type: ignore[index]
        if len(masters) != 1:
            return None
        m = masters[0]
        if all(s["role"] == "slave" and s["master"] == m for i, s in sts.items() if i != m):  # type: ignore[index]
            return m
        return None

    def same_end(self, among: list[int] | None = None) -> bool:
        """Every node (among) at the same epoch, WAL end and applied version."""
        sts = [self.status(i) for i in among or self.nodes]
        if any(s is None for s in sts):
            return False
        return len({(s["epoch"], s["wal_last_version"], s["version"]) for s in sts}) == 1  # type: ignore[index]

    def settle(self, among: list[int] | None = None, timeout_s: float = 30.0) -> int:
        """One master with every other node (among) its slave, a barrier write confirmed
        through it, every log at the same end; returns the master."""
        who = among or list(self.nodes)
        m = self.wait_for(f"one master, every other of {who} its slave", lambda: self.all_follow(among),
                          timeout_s, 0.1)
        for attempt in range(3):
            self._barriers += 1
            barrier = self.write(m, f"{self.tag}-barrier-{self._barriers}")
            if barrier["status"] == "ok":  # type: ignore[index]
                break
            m = self.wait_for("a master after the barrier failed", lambda: self.all_follow(among), timeout_s, 0.1)
        self.wait_for(f"every log of {who} ends at the master's", lambda: self.same_end(among), timeout_s, 0.1)
        return m

    def converge(self, timeout_s: float = 30.0) -> dict:
        """Every fault healed (dead nodes and arbitrator restarted), one master with every
        other node its slave, the workload stopped, a barrier confirmed and every log ending
        at the same place."""
        t_heal = time.monotonic()
        self.heal()
        if self.arb is not None and not self.arb.alive():
            self.start_arbitrator()
        for i, p in self.nodes.items():
            if not p.alive():
                self.start_node(i)
        self.wait_for("one master, every other node its slave", self.all_follow, timeout_s, 0.1)
        t_roles = time.monotonic()
        counts = self.stop_workload()
        m = self.settle(timeout_s=timeout_s)
        t_conv = time.monotonic()
        return {"master": m, "roles_s": t_roles - t_heal, "converged_s": t_conv - t_heal, "workload": counts}

    def history(self) -> list[dict]:
        try:
            with open(self.history_path) as fh:
                return [json.loads(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []

    def read_rows(self, among: list[int] | None = None, timeout_s: float = 60.0) -> dict[int, dict]:
        """Every table the workload wrote, from every node (among), through the client API:
        {node: {table: rows}} or {node: {"error": reason}}."""
        self._reads += 1
        path = os.path.join(self.dir, f"rows-{self._reads}.json")
        ev = self.ask("read", path, timeout_s=timeout_s)
        if ev is None:
            raise TimeoutError(f"the workload did not read the replicas within {timeout_s} s")
        with open(path) as fh:
            got = {int(k): v for k, v in json.load(fh).items()}
        return {i: got[i] for i in among or self.nodes}

    def logs(self) -> dict[int, list[tuple[int, int, bytes]]]:
        return {i: [(r.epoch, r.version, r.payload) for r in wal.read_records(self.wal_dir(i))] for i in self.nodes}

    def masters_per_epoch(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for i, p in self.nodes.items():
            p.poll_log()
            for e in p.role_events:
                if e["role"] == "master":
                    out.setdefault(e["epoch"], set()).add(i)
        return out

    def check(self, rows: dict[int, dict], logs: dict | None = None, allow_loss: bool = False) -> _check.Verdict:
        return _check.check(self.history(), rows, logs, allow_loss=allow_loss)

    def finish(self, allow_loss: bool = False, timeout_s: float = 30.0) -> "Result":
        """Heal, converge, read every table from every replica, stop every node cleanly, and
        check the history against the rows and every WAL."""
        conv = self.converge(timeout_s)
        self.mark("converged")
        rows = self.read_rows()
        self.stop_nodes()
        verdict = self.check(rows, self.logs(), allow_loss)
        hist = self.history()
        two = {e: sorted(ns) for e, ns in self.masters_per_epoch().items() if len(ns) > 1}
        heal_t = next(t for t, what in self.marks if what == "heal")
        fault_t = next((t for t, what in self.marks if what not in ("workload", "heal")), heal_t)
        oks = sorted(op["t1"] for op in hist if op["status"] == "ok" and op["client"] >= 0)
        after_fault = [t for t in oks if t >= fault_t]
        after_heal = [t for t in oks if t >= heal_t]
        gaps = [b - a for a, b in zip(oks, oks[1:])]
        return Result(
            namespaced=self.namespaced, verdict=verdict, masters_in_one_epoch=two, converge=conv,
            first_ok_after_fault_s=(after_fault[0] - fault_t) if after_fault else None,
            first_ok_after_heal_s=(after_heal[0] - heal_t) if after_heal else None,
            longest_gap_s=max(gaps, default=0.0), dir=self.dir,
            marks=[(round(t - self.marks[0][0], 3), what) for t, what in self.marks])

    def stop_nodes(self) -> None:
        """SIGTERM every node, the master last: while the master runs, the others never lose
        it and never elect a new one (whose first record, a no-op, would make the WALs end
        apart)."""
        order = sorted(self.nodes, key=lambda i: (self.role(i) == "master", i))
        for i in order:
            p = self.nodes[i]
            code = p.stop(20)
            if code not in (0, None):
                self.mark(f"n{i} stopped with exit code {code}")
        if self.arb is not None:
            self.arb.kill()


@dataclass
class Result:
    namespaced: bool
    verdict: _check.Verdict
    masters_in_one_epoch: dict[int, list[int]]
    converge: dict
    first_ok_after_fault_s: float | None
    first_ok_after_heal_s: float | None
    longest_gap_s: float
    dir: str
    marks: list[tuple[float, str]]

    @property
    def safe(self) -> bool:
        return self.verdict.safe and not self.masters_in_one_epoch

    def summary(self) -> dict:
        r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
        return {**self.verdict.summary(), "namespaced": self.namespaced,
                "masters_in_one_epoch": {str(k): v for k, v in self.masters_in_one_epoch.items()},
                "converged_s": r3(self.converge["converged_s"]), "roles_s": r3(self.converge["roles_s"]),
                "first_ok_after_fault_s": r3(self.first_ok_after_fault_s),
                "first_ok_after_heal_s": r3(self.first_ok_after_heal_s), "longest_gap_s": r3(self.longest_gap_s)}

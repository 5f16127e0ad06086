"""The validation report: counts and first examples per check, report.json, row diffs.

Owns: the `Report` the job returns, its JSON form (format 1, docs/validation.md §report),
the summary table printed with rich, and writing `report.json` and `row_diffs.parquet`.
Must not: run checks or touch Spark.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vrepl.exitcodes import EXIT_FAILED, EXIT_OK
from vrepl.spark.model import CHECKS, ROW_KINDS, Finding

REPORT_FORMAT = 1


@dataclass
class CheckResult:
    name: str
    counts: dict[str, int] = field(default_factory=dict)   # what was looked at
    kinds: dict[str, int] = field(default_factory=dict)    # exact number found, per kind
    findings: list[Finding] = field(default_factory=list)  # first examples (bounded)
    notes: list[dict[str, Any]] = field(default_factory=list)
    by_replica: list[dict[str, Any]] = field(default_factory=list)   # rows: exact counts

    @property
    def found(self) -> int:
        return sum(self.kinds.values())

    @property
    def ok(self) -> bool:
        return self.found == 0

    def add(self, finding: Finding, max_examples: int) -> None:
        """Count a finding by kind and keep it if there is room for examples."""
        self.kinds[finding.kind] = self.kinds.get(finding.kind, 0) + 1
        if len(self.findings) < max_examples:
            self.findings.append(finding)

    def to_json(self, examples: int) -> dict[str, Any]:
        return {"ok": self.ok, "found": self.found, "counts": self.counts,
                "kinds": self.kinds,
                "examples": [f.to_json() for f in self.findings[:examples]],
                **({"notes": self.notes} if self.notes else {}),
                **({"by_replica": self.by_replica} if self.by_replica else {})}


@dataclass
class Report:
    vgroups: dict[int, list[dict[str, Any]]]          # vgroup -> replica summaries
    checks: dict[str, CheckResult]
    examples: int = 10
    timings_s: dict[str, float] = field(default_factory=dict)
    master: str | None = None
    row_diffs: pa.Table | None = None
    row_diffs_path: str | None = None
    report_path: str | None = None
    spark_log: str | None = None

    @property
    def agree(self) -> bool:
        return all(c.ok for c in self.checks.values())

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.agree else EXIT_FAILED

    def findings(self) -> list[Finding]:
        return [f for c in self.checks.values() for f in c.findings]

    def to_json(self) -> dict[str, Any]:
        rows = self.checks["rows"]
        return {
            "format": REPORT_FORMAT,
            "result": "agree" if self.agree else "differ",
            "exit_code": self.exit_code,
            "master": self.master,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
            "vgroups": [{"vgroup": vg, "replicas": reps} for vg, reps in
                        sorted(self.vgroups.items())],
            "checks": {name: self.checks[name].to_json(self.examples) for name in CHECKS},
            "row_diffs": {"path": self.row_diffs_path,
                          "written": 0 if self.row_diffs is None else self.row_diffs.num_rows,
                          "total": sum(rows.kinds.get(k, 0) for k in ROW_KINDS)},
            "spark_log": self.spark_log,
        }

    def write(self, out_dir: str) -> None:
        """report.json and (when rows differ) row_diffs.parquet under out_dir."""
        os.makedirs(out_dir, exist_ok=True)
        if self.row_diffs is not None:
            self.row_diffs_path = os.path.join(out_dir, "row_diffs.parquet")
            pq.write_table(self.row_diffs, self.row_diffs_path, compression="zstd")
        self.report_path = os.path.join(out_dir, "report.json")
        tmp = self.report_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.report_path)

    # -- terminal --------------------------------------------------------------------------
    def print(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.table import Table
        console = console or Console(soft_wrap=True)
        reps = Table(title="replicas", title_justify="left")
        for col in ("vgroup", "replica", "path", "archived v", "WAL versions", "files",
                    "rows compared"):
            reps.add_column(col, justify="left" if col == "path" else "right",
                            overflow="fold" if col == "path" else "ellipsis")
        for vg, rs in sorted(self.vgroups.items()):
            for r in rs:
                wal = (f"{r['wal_first_version']}..{r['wal_last_version']}"
                       if r["wal_records"] else "-")
                reps.add_row(str(vg), str(r["replica"]), r["path"], str(r["archived_version"]),
                             wal, str(r["files"]), f"{r.get('rows', 0):,}")
        console.print(reps)
        t = Table(title="checks", title_justify="left")
        t.add_column("check")
        t.add_column("result")
        t.add_column("looked at")
        t.add_column("found")
        for name in CHECKS:
            c = self.checks[name]
            looked = ", ".join(f"{k} {v:,}" for k, v in c.counts.items())
            found = ", ".join(f"{k} {v:,}" for k, v in c.kinds.items() if v)
            t.add_row(name, "[green]ok[/]" if c.ok else "[red]DIFFER[/]", looked,
                      found or ("-" if c.ok else str(c.found)))
        console.print(t)
        for name in CHECKS:
            c = self.checks[name]
            if c.ok:
                continue
            console.print(f"[bold]{name}[/]: {c.found:,} found; first examples:")
            for f in c.findings[:self.examples]:
                console.print(f"  {f.describe()}", markup=False, highlight=False)
        if self.checks["rows"].notes:
            console.print(f"rows not compared: {len(self.checks['rows'].notes)} (table, file"
                          f" bucket) pairs whose files failed the files check")
        verdict = ("[green]replicas agree[/]" if self.agree else
                   "[red]replicas differ[/]")
        where = f"; report: {self.report_path}" if self.report_path else ""
        if self.row_diffs_path:
            where += f"; row diffs: {self.row_diffs_path}"
        console.print(f"{verdict}{where}")

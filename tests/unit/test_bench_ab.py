"""bench/ab.py: the A/B runner takes each tree's figures from the command's own output
(the JSON last line and --figure regexes) and divides the two sides' medians."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import figures_of  # noqa: E402


def test_figures_from_a_json_last_line_and_regexes():
    out = 'warming up\nthroughput median 1,234.5 records/s\n{"a": {"b": 2, "ok": true}, "c": 3.5, "s": "x"}\n'
    got = figures_of(out, [("rate", re.compile(r"throughput median ([\d,.]+)"))])
    assert got == {"a.b": 2.0, "c": 3.5, "rate": 1234.5}


def test_runs_each_tree_in_turn_and_divides_the_medians(tmp_path):
    trees = {}
    for side, value in (("a", 30), ("b", 10)):
        tree = tmp_path / side
        tree.mkdir()
        (tree / "value.txt").write_text(str(value))
        trees[side] = tree
    script = ("import json, os, pathlib; v = int(pathlib.Path('value.txt').read_text());"
              " assert os.environ['PYTHONPATH'] == os.getcwd(); print(f'rate {v} ops');"
              " print(json.dumps({'v': v, 'zero': 0}))")
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ab.py"), "--a", str(trees["a"]), "--b", str(trees["b"]),
                           "--pairs", "2", "--figure", r"rate=rate (\d+) ops", "--json-out", str(out),
                           "--", sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())["figures"]
    assert figures["v"]["a"] == [30.0, 30.0] and figures["v"]["b"] == [10.0, 10.0]
    assert figures["rate"]["ratio_of_medians"] == 3.0
    assert figures["v"]["median_pair_ratio"] == 3.0
    assert "wall_s" in figures and "cpu_s" in figures
    # A figure that is 0 on both sides has medians but no ratio (and does not stop the summary).
    assert figures["zero"]["a"] == [0.0, 0.0] and figures["zero"]["median_pair_ratio"] != figures["zero"]["median_pair_ratio"]


def test_a_failing_run_stops_with_its_output(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ab.py"), "--a", str(tmp_path / "a"), "--b",
                           str(tmp_path / "b"), "--pairs", "1", "--", sys.executable, "-c",
                           "print('boom'); raise SystemExit(3)"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "exited 3" in proc.stderr and "boom" in proc.stderr

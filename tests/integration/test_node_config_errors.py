"""`vrepl node` with a wrong config: exit code 2 and one line on stderr, nothing started."""
from __future__ import annotations

import subprocess

import pytest

from vrepl.child import node_argv

pytestmark = pytest.mark.timeout(30)

GOOD = """
node_id = 1
data_dir = "data"
secret = "s"
[[nodes]]
id = 1
replication = "127.0.0.1:{p1}"
http = "127.0.0.1:{p2}"
[[vgroups]]
id = 1
replicas = [1]
"""


@pytest.mark.parametrize("text,words", [
    ("node_id = [", "not valid TOML"),
    (GOOD.replace('secret = "s"', 'secret = ""'), "secret"),
    (GOOD.replace("replicas = [1]", "replicas = [1, 2]"), "node 2 is not in [[nodes]]"),
    (GOOD + "\n[http]\nmax_body_bytes = -5\n", "http.max_body_bytes must be > 0"),
    (GOOD + "\n[vnode]\nprecision = \"ns\"\n", "precision"),
])
def test_config_error_exits_2_with_one_line(tmp_path, text, words):
    path = tmp_path / "node.toml"
    path.write_text(text.format(p1=1, p2=2))
    p = subprocess.run(node_argv(str(path)), capture_output=True, text=True, timeout=20)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and str(path) in lines[0], p.stderr


def test_missing_config_file_exits_2(tmp_path):
    p = subprocess.run(node_argv(str(tmp_path / "nope.toml")), capture_output=True, text=True,
                       timeout=20)
    assert p.returncode == 2 and p.stderr.strip().endswith("no such file")

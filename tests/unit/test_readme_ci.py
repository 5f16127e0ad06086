"""README.md's two commands ("Run it", "Run the tests") are the lines .ci/run runs, each
right under its "keep identical" comment, the main command first (issue 14)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_command(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)\n```", body, re.S)
    assert len(blocks) == 1 and "\n" not in blocks[0], blocks
    return blocks[0]


def test_ci_runs_the_readme_commands_verbatim():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    positions = []
    for section, marker in (("Run it", 'keep identical to README.md "Run it"'),
                            ("Run the tests", 'keep identical to README.md "Run the tests"')):
        command = readme_command(section)
        at = next(i for i, line in enumerate(lines) if marker in line)
        assert lines[at + 1].strip() == command, (section, lines[at + 1])
        positions.append(at)
    assert positions[0] < positions[1]
    # The main command runs in a fresh virtual environment, from the repository root.
    head = "\n".join(lines[:positions[0]])
    assert 'cd "$(dirname "$0")/.."' in head and "python3 -m venv" in head

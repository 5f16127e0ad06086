"""vrepl/untrusted.py: text from the network escaped before a terminal or a log sees it, and
the places that use it (issue 14, Deliver 9; docs/security.md §Text from the network)."""
from __future__ import annotations

import logging
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vrepl.restore import protocol as P
from vrepl.restore.errors import PeerError
from vrepl.restore.paths import name_refusal
from vrepl.restore.stream import SyncStream
from vrepl.untrusted import printable

pytestmark = pytest.mark.timeout(30)


def test_escapes_controls_separators_and_format_characters():
    assert printable("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert printable("\x1b[31mred\x07\x7f\x85") == "\\x1b[31mred\\x07\\x7f\\x85"
    assert printable("x\u2028y\u2029z\u202ew") == "x\\u2028y\\u2029z\\u202ew"
    assert printable("plain text, é ü 漢字") == "plain text, é ü 漢字"
    assert printable(b"bytes\n\xff") == "bytes\\n\\xff"
    assert printable(ValueError("boom\n")) == "boom\\n"


def test_bounds_the_length():
    assert printable("x" * 10, limit=4) == "xxxx... (6 more characters)"
    assert len(printable("\n" * 5000)) < 2 * 1024 + 40


@given(st.text())
def test_never_more_than_one_printable_line(text):
    out = printable(text)
    assert out.isprintable()
    assert "\n" not in out and "\r" not in out and "\x1b" not in out


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))))
def test_printable_text_is_unchanged(text):
    if text.isprintable():
        assert printable(text, limit=0) == text


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "\x1b[2Jx", "a\x7fb", "a\x85b", "a\u2028b", "a\u202eb",
                                  "a\tb", "a\u00a0b"])
def test_names_with_control_characters_are_refused(name):
    reason = name_refusal(name)
    assert reason is not None and "non-printable" in reason
    assert reason.isprintable()


def test_a_peer_error_reason_is_escaped_before_it_is_raised(caplog):
    lst = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lst.getsockname(), timeout=5)
    b, _ = lst.accept()
    lst.close()
    try:
        a.sendall(P.encode(P.Error("disk full\n2024-01-01 ERROR vrepl: forged\x1b[0m")))
        with pytest.raises(PeerError) as info:
            SyncStream(b, io_timeout_s=5).recv()
    finally:
        a.close()
        b.close()
    text = str(info.value)
    assert text == "the other side stopped the restore: disk full\\n2024-01-01 ERROR vrepl: forged\\x1b[0m"
    with caplog.at_level(logging.ERROR):
        logging.getLogger("vrepl.restore").error("restore failed: %s", info.value)
    assert caplog.text.count("\n") == 1
    assert P.Error("a\nb").describe() == "error a\\nb"
    assert P.FileInfo(0, 1, 1, "x\ny").describe() == "file_info #0 x\\ny 1B magic 0x00000001"

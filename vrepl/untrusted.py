"""Text that came from outside (a peer, a request, a file name), made safe to print or log.

Owns: `printable(text)`, the one function every place uses before text from the network (a
peer's ERROR reason, a peer-provided file name, an HTTP request path or id) reaches a
terminal or a log line (docs/security.md §Text from the network). It escapes every
character that is not printable — control characters (newline, carriage return, ESC and so
terminal escape sequences, DEL, C1), Unicode line/paragraph separators and format
characters such as bidirectional overrides — as `\\n`, `\\r`, `\\t`, `\\xHH` or `\\uHHHH`, so
such text can never forge an extra line, move the cursor or recolour a terminal; and it
bounds the length.
Must not: decide whether the text is acceptable (callers refuse what they must refuse, e.g.
vrepl/restore/paths.py for names); import anything of vrepl (every layer may use it).
"""
from __future__ import annotations

MAX_PRINTABLE_CHARS = 1024  # longer text is cut, with a note of how much was left out

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object, limit: int = MAX_PRINTABLE_CHARS) -> str:
    """`text` (str, bytes, or anything str() takes) with every non-printable character
    escaped, cut to `limit` characters: safe as part of one line of a terminal or a log."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    elif not isinstance(text, str):
        text = str(text)
    cut = len(text) - limit if limit and len(text) > limit else 0
    if cut:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
    return f"{text}... ({cut} more characters)" if cut else text

"""File names from a peer, confined to a data path (docs/restore.md §Safety).

Owns: the rules a name received over a sync connection must pass before it touches the
disk: relative, no `..`, no empty or `.` components, no NUL or backslash, no control or
other non-printable character (a newline, ESC, a bidirectional override: a name is also
printed and logged), bounded length;
and the checks that no existing component under the data path is a symlink (so a name can
never be followed out of it) when a file is read, created or replaced.
Must not: create anything but the parent directories of a confined name.
"""
from __future__ import annotations

import os
import stat

from vrepl.restore.errors import UnsafeName
from vrepl.untrusted import printable

MAX_NAME_BYTES = 1024
STAGING_DIR = ".vrepl-restore"  # under the data path: staged files, the journal (never synced)


def name_refusal(name: object) -> str | None:
    """Why `name` cannot be a file name relative to a data path, or None."""
    if not isinstance(name, str) or not name:
        return "empty file name"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"file name longer than {MAX_NAME_BYTES} bytes"
    shown = f"'{printable(name)}'"
    if "\x00" in name or "\\" in name:
        return f"file name {shown} holds a NUL or a backslash"
    if not name.isprintable():
        return f"file name {shown} holds a control or other non-printable character"
    if name.startswith("/") or os.path.isabs(name):
        return f"absolute file name {shown}"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"file name {shown} has an empty, '.' or '..' component"
    if parts[0] == STAGING_DIR:
        return f"file name {shown} is inside the restore staging directory"
    return None


def _check_no_symlink(root: str, parts: list[str], name: str) -> None:
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeName(f"refused file name {name!r}: {path} is a symlink (never followed out of the data path)")


def confined(root: str, name: str) -> str:
    """The absolute path of `name` under `root`; UnsafeName if the name is refused or an
    existing component of it is a symlink."""
    reason = name_refusal(name)
    if reason:
        raise UnsafeName(f"refused {reason}")
    root = os.path.abspath(root)
    parts = name.split("/")
    _check_no_symlink(root, parts, name)
    path = os.path.join(root, *parts)
    if os.path.commonpath([root, path]) != root:  # belt and braces
        raise UnsafeName(f"refused file name {name!r}: outside {root}")
    return path


def make_parents(root: str, name: str) -> str:
    """confined(), creating the missing parent directories (each checked not a symlink)."""
    path = confined(root, name)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    _check_no_symlink(os.path.abspath(root), name.split("/")[:-1], name)
    return path

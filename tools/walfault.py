"""Damage a WAL directory on purpose, the way crashes and bad disks do (for tests and drills).

Usage:
  python tools/walfault.py truncate DIR BYTES     # cut BYTES off the end of the last file
  python tools/walfault.py zero-tail DIR BYTES    # append BYTES zero bytes to the last file
  python tools/walfault.py flip DIR FILE OFFSET   # flip the low bit of one byte of FILE
  python tools/walfault.py drop-file DIR INDEX    # delete one file (makes an index gap)

Only ever touches files inside DIR whose names are WAL or index files. Prints what it did.
"""
from __future__ import annotations

import os
import sys

from vrepl import wal


def _last(directory: str) -> str:
    files = wal.list_wal_files(directory)
    if not files:
        raise SystemExit(f"{directory}: no WAL files")
    return files[-1].path


def _inside(directory: str, name: str) -> str:
    if os.sep in name or name in (".", "..") or not (name.endswith(".wal") or name.endswith(".idx")):
        raise SystemExit(f"{name}: not a WAL or index file name")
    return os.path.join(directory, name)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, directory = argv[1], argv[2]
    if cmd == "truncate":
        path = _last(directory)
        size = os.path.getsize(path)
        cut = min(int(argv[3]), size)
        os.truncate(path, size - cut)
        print(f"{path}: truncated from {size} to {size - cut} bytes")
    elif cmd == "zero-tail":
        path = _last(directory)
        with open(path, "ab") as fh:
            fh.write(b"\0" * int(argv[3]))
        print(f"{path}: appended {argv[3]} zero bytes")
    elif cmd == "flip":
        path = _inside(directory, argv[3])
        offset = int(argv[4])
        with open(path, "r+b") as fh:
            fh.seek(offset)
            b = fh.read(1)
            if not b:
                raise SystemExit(f"{path}: offset {offset} is past the end")
            fh.seek(offset)
            fh.write(bytes([b[0] ^ 1]))
        print(f"{path}: flipped a bit at offset {offset}")
    elif cmd == "drop-file":
        path = os.path.join(directory, wal.wal_file_name(int(argv[3])))
        os.unlink(path)
        print(f"{path}: deleted")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

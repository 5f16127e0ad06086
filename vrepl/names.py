"""The names vrepl's formats share: tables, columns and value types.

Owns: the rules a table name and a column name follow (docs/vnode.md §rows) and the value
type names schemas store, in one place for every format that carries them: the row
validator (vrepl/vnode/rows.py and its fast path vrepl/_core/rows.pyx), the manifest
(vrepl/manifest.py), the ship protocol and the HTTP API. Must not: import anything of vrepl
(a leaf: `vrepl ship` and the Cython core read these without loading the vnode).
"""

from __future__ import annotations

import re

TABLE_NAME_RULE = "[A-Za-z_][A-Za-z0-9_]{0,191}"
TABLE_NAME_RE = re.compile(TABLE_NAME_RULE)
# Column names start with a letter: names starting with "_" are reserved for the archived
# files' own columns (_version, _epoch), and "ts" is the timestamp column.
COLUMN_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
COLUMN_NAME_RULE = "[A-Za-z][A-Za-z0-9_]{0,63}, not 'ts'"
RESERVED_COLUMNS = frozenset({"ts"})

# Value type names as stored in schemas and the manifest.
TYPE_INT, TYPE_FLOAT, TYPE_STR, TYPE_BOOL = "int", "float", "str", "bool"
TYPE_NAMES = frozenset({TYPE_INT, TYPE_FLOAT, TYPE_STR, TYPE_BOOL})

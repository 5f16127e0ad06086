# cython: language_level=3, boundscheck=False, wraparound=False
"""Fast path of the row-batch validator (vrepl/vnode/rows.py `check_rows`).

Owns: one pass over a parsed batch (a list of [table, ts, {column: value}]) that accepts
exactly the batches `check_rows` accepts and returns the same (new columns, estimated
bytes). It never explains a refusal: on the first problem it returns None and the caller
runs the Python `check_rows`, whose one-line reason is the contract (docs/client-api.md).
So the reasons live in one place, and this file only has to agree on *whether* a batch is
good, which tests/unit/test_rows_codec.py checks against the Python code on generated
batches. Must not: do I/O, change its inputs, or raise for bad input.

Why: validation in Python cost ~1.6 µs per row on the master and again on every slave
(docs/perf.md §profile); this loop costs a small fraction of that.
"""
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.math cimport isfinite

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except? NULL

# The same name rules as the Python validator: one definition (vrepl/names.py).
from vrepl.names import COLUMN_NAME_RE, TABLE_NAME_RE

cdef object _table_match = TABLE_NAME_RE.fullmatch
cdef object _column_match = COLUMN_NAME_RE.fullmatch
# Names that passed the regex in an earlier batch: a bounded cache, cleared when full.
cdef dict _ok_tables = {}
cdef dict _ok_columns = {}
cdef Py_ssize_t NAME_CACHE_MAX = 65536

cdef str T_INT = "int"
cdef str T_FLOAT = "float"
cdef str T_STR = "str"
cdef str T_BOOL = "bool"

cdef enum:
    ROW_OVERHEAD_BYTES = 16
    VALUE_FIXED_BYTES = 8


cdef inline bint _table_ok(object table):
    if type(table) is not str:
        return False
    if table in _ok_tables:
        return True
    if _table_match(table) is None:
        return False
    if len(_ok_tables) >= NAME_CACHE_MAX:
        _ok_tables.clear()
    _ok_tables[table] = True
    return True


cdef inline bint _column_ok(object col):
    if type(col) is not str:
        return False
    if col in _ok_columns:
        return True
    if _column_match(col) is None or col == "ts":
        return False
    if len(_ok_columns) >= NAME_CACHE_MAX:
        _ok_columns.clear()
    _ok_columns[col] = True
    return True


cdef object table_known(dict schemas, dict added, object table, bint limits,
                        Py_ssize_t table_count, Py_ssize_t max_tables,
                        Py_ssize_t* new_tables):
    """The known columns of a batch's table ({} for a table the schemas lack), or None to
    refuse the batch. A table new to the schemas counts once against max_tables (with
    limits and a table_count >= 0) and gets an entry in `added` for its new columns."""
    cdef PyObject* p
    cdef object known
    if schemas is not None:
        p = PyDict_GetItem(schemas, table)
        if p is not NULL:
            known = <object>p
            return known if type(known) is dict else None
    if PyDict_GetItem(added, table) is NULL:
        new_tables[0] += 1
        if limits and table_count >= 0 and table_count + new_tables[0] > max_tables:
            return None
        added[table] = {}
    return {}


def fast_check(object rows, object schemas, bint limits, long long ts_lo, long long ts_hi,
               Py_ssize_t max_rows, Py_ssize_t max_row_bytes, Py_ssize_t max_batch_bytes,
               Py_ssize_t max_columns, Py_ssize_t max_tables, object table_count):
    """(new columns per table, estimated bytes) of a good batch, or None (ask check_rows).

    `schemas` maps table -> {column: type name} (may be None); `limits` False checks only
    the shape (a payload read back from the WAL), as check_rows(rows, None, schemas) does.
    """
    cdef dict added = {}
    cdef Py_ssize_t n, i, total = 0, size, new_tables = 0, slen
    cdef Py_ssize_t pos
    cdef PyObject* kp
    cdef PyObject* vp
    cdef PyObject* p
    cdef long long ts
    cdef int overflow
    cdef object row, table, tso, values, known, new_cols, col, v, vtype, ctype
    cdef list lrows
    cdef Py_ssize_t tcount = -1 if table_count is None else table_count
    if type(rows) is not list:
        return None
    lrows = <list>rows
    n = len(lrows)
    if n == 0 or (limits and n > max_rows):
        return None
    if schemas is not None and type(schemas) is not dict:
        return None
    for i in range(n):
        row = lrows[i]
        if type(row) is not list or len(<list>row) != 3:
            return None
        table = (<list>row)[0]
        tso = (<list>row)[1]
        values = (<list>row)[2]
        if not _table_ok(table):
            return None
        if type(tso) is not int:
            return None
        ts = PyLong_AsLongLongAndOverflow(tso, &overflow)
        if overflow != 0 or ts < ts_lo or ts > ts_hi:
            return None
        if type(values) is not dict or len(<dict>values) == 0:
            return None
        known = table_known(<dict>schemas, added, table, limits, tcount, max_tables,
                            &new_tables)
        if known is None:
            return None
        p = PyDict_GetItem(added, table)
        new_cols = <object>p if p is not NULL else None
        size = ROW_OVERHEAD_BYTES + PyUnicode_GET_LENGTH(table)
        pos = 0
        while PyDict_Next(<dict>values, &pos, &kp, &vp):
            col = <object>kp
            v = <object>vp
            if not _column_ok(col):
                return None
            size += PyUnicode_GET_LENGTH(col)
            if type(v) is int:
                PyLong_AsLongLongAndOverflow(v, &overflow)
                if overflow != 0:
                    return None
                vtype = T_INT
                size += VALUE_FIXED_BYTES
            elif type(v) is float:
                if not isfinite(<double>v):
                    return None
                vtype = T_FLOAT
                size += VALUE_FIXED_BYTES
            elif type(v) is str:
                try:
                    PyUnicode_AsUTF8AndSize(v, &slen)
                except UnicodeEncodeError:
                    return None
                vtype = T_STR
                size += slen
            elif type(v) is bool:
                vtype = T_BOOL
                size += 1
            elif v is None:
                continue
            else:
                return None
            p = PyDict_GetItem(<dict>known, col)
            if p is NULL and new_cols is not None:
                p = PyDict_GetItem(<dict>new_cols, col)
            if p is NULL:
                if new_cols is None:
                    new_cols = {}
                    added[table] = new_cols
                if limits and len(<dict>known) + len(<dict>new_cols) + 1 > max_columns:
                    return None
                PyDict_SetItem(<dict>new_cols, col, vtype)
            else:
                ctype = <object>p
                if ctype is not vtype and ctype != vtype and not (
                        ctype == T_FLOAT and vtype is T_INT):
                    return None
        if limits and size > max_row_bytes:
            return None
        total += size
        if limits and total > max_batch_bytes:
            return None
    return added, total

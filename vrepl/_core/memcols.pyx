# cython: language_level=3, boundscheck=False, wraparound=False
"""Column logs of the reference vnode's memtable (vrepl/vnode/memtable.py).

Owns: per table, an append-only log of the rows applied since the last flush, stored as
typed columns (int64 ts, version and epoch; per value column int64, float64, bool or UTF-8
bytes with a validity byte per row), the export of those columns as numpy arrays, and
parse_batch, which reads a JSON body of rows straight into such columns (a Staged batch)
when it can prove the reference path would accept it (see the section below).
Must not: do I/O, explain a refusal (the reference path in vrepl/vnode/rows.py does),
resolve overwrites (readers do: the last appended row of a ts wins), or ever change a row
once appended, so an exported view stays valid while writes go on.

Why: the memtable used to keep every row as Python objects (a tuple and the client's dict,
~250 B per row). Those long-lived objects made the cyclic GC and heap growth the largest
cost of a write, and a flush then walked them again in Python to build Arrow columns
(a third of a slave's CPU, docs/perf.md §11). Appending into typed columns here costs a
fraction of that, and a flush hands the columns to Arrow without a per-row Python step.
"""
cimport numpy as cnp
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.long cimport PyLong_AsLongLong
from cpython.float cimport PyFloat_AsDouble
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset
from libc.math cimport isfinite

from vrepl._core.rows cimport table_known

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    Py_ssize_t Py_REFCNT(PyObject* o)

import numpy as np

cnp.import_array()

# Column kinds (C constants, exported to Python below); the type names are the vnode's
# (vrepl/vnode/rows.py TYPE_*).
cdef enum:
    K_INT = 0
    K_FLOAT = 1
    K_BOOL = 2
    K_STR = 3

KIND_INT, KIND_FLOAT, KIND_BOOL, KIND_STR = K_INT, K_FLOAT, K_BOOL, K_STR
KIND_OF_TYPE = {"int": K_INT, "float": K_FLOAT, "bool": K_BOOL, "str": K_STR}


cdef class _Block:
    """Owner of one malloc'd block: numpy views of a buffer hold it, so the bytes outlive
    the buffer (or its growth) for as long as a view is alive."""
    cdef char* ptr

    def __dealloc__(self):
        free(self.ptr)
        self.ptr = NULL


cdef class _Buf:
    """A growable byte buffer. While no exported view holds its block, growing is a
    realloc (glibc moves large blocks with mremap: no copy, and only new pages are ever
    zeroed by the kernel); otherwise it copies into a new block and leaves the old one to
    its views. Bytes below `size` never change once written."""
    cdef _Block blk
    cdef char* ptr
    cdef Py_ssize_t cap
    cdef Py_ssize_t size

    def __cinit__(self):
        self.blk = _Block()
        self.ptr = NULL
        self.cap = 0
        self.size = 0

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self.size + extra
        cdef Py_ssize_t cap
        cdef char* p
        cdef _Block nb
        if need <= self.cap:
            return 0
        cap = max(need, self.cap * 2, 256)
        if Py_REFCNT(<PyObject*>self.blk) == 1:      # no view holds the block
            p = <char*>realloc(self.blk.ptr, cap)
            if p == NULL:
                raise MemoryError(f"memtable column: cannot grow to {cap} bytes")
            self.blk.ptr = p
        else:
            p = <char*>malloc(cap)
            if p == NULL:
                raise MemoryError(f"memtable column: cannot allocate {cap} bytes")
            if self.size:
                memcpy(p, self.ptr, self.size)
            nb = _Block()
            nb.ptr = p
            self.blk = nb
        self.ptr = p
        self.cap = cap
        return 0

    cdef object view(self, object dtype):
        """The bytes [0, size) as a numpy array of `dtype` (no copy; holds the block)."""
        cdef cnp.npy_intp n = self.size
        if n == 0:
            return np.empty(0, dtype)
        arr = cnp.PyArray_SimpleNewFromData(1, &n, cnp.NPY_UINT8, self.ptr)
        cnp.set_array_base(arr, self.blk)
        return arr.view(dtype)


cdef class Column:
    """One value column of a table log: `n` rows filled (values or nulls)."""
    cdef readonly str name
    cdef bytes name_b               # the name's ASCII/UTF-8 bytes (parse_batch compares them)
    cdef readonly int kind
    cdef readonly Py_ssize_t n
    cdef _Buf data           # int64 / float64 / uint8 per row, or UTF-8 bytes (str)
    cdef _Buf valid          # uint8 per row: 1 = a value, 0 = null
    cdef _Buf offsets        # str only: int64 start offsets, n + 1 of them

    def __cinit__(self, str name, int kind):
        cdef int64_t zero = 0
        self.name = name
        self.name_b = name.encode("utf-8")
        self.kind = kind
        self.n = 0
        self.data = _Buf()
        self.valid = _Buf()
        self.offsets = _Buf()
        if kind == K_STR:
            self.offsets.reserve(8)
            memcpy(self.offsets.ptr, &zero, 8)
            self.offsets.size = 8

    cdef int _width(self) noexcept:
        return 1 if self.kind == K_BOOL else (0 if self.kind == K_STR else 8)

    cdef int pad(self, Py_ssize_t upto) except -1:
        """Append nulls until `upto` rows are filled."""
        cdef Py_ssize_t k = upto - self.n
        cdef Py_ssize_t i
        cdef int w = self._width()
        cdef int64_t end
        if k <= 0:
            return 0
        self.valid.reserve(k)
        memset(self.valid.ptr + self.valid.size, 0, k)
        self.valid.size += k
        if w:
            self.data.reserve(k * w)
            memset(self.data.ptr + self.data.size, 0, k * w)
            self.data.size += k * w
        else:
            self.offsets.reserve(k * 8)
            end = self.data.size
            for i in range(k):
                (<int64_t*>(self.offsets.ptr + self.offsets.size))[0] = end
                self.offsets.size += 8
        self.n = upto
        return 0

    cdef int truncate(self, Py_ssize_t n) except -1:
        """Forget rows from `n` on."""
        cdef int w = self._width()
        self.valid.size = n
        if w:
            self.data.size = n * w
        else:
            self.data.size = (<int64_t*>self.offsets.ptr)[n]
            self.offsets.size = (n + 1) * 8
        self.n = n
        return 0

    cdef inline int _begin(self, Py_ssize_t row) except -1:
        """Make `row` the next row to fill, and mark it valid."""
        if row < self.n:
            self.truncate(row)     # left over from a row whose append failed midway
        elif row > self.n:
            self.pad(row)
        self.valid.reserve(1)
        (<uint8_t*>(self.valid.ptr + self.valid.size))[0] = 1
        self.valid.size += 1
        self.n = row + 1
        return 0

    cdef int _put_int(self, Py_ssize_t row, int64_t v) except -1:
        """Row `row` (>= n) = v (an int, or a bool as 0/1, as the column's kind says)."""
        self._begin(row)
        if self.kind == K_BOOL:
            self.data.reserve(1)
            (<uint8_t*>(self.data.ptr + self.data.size))[0] = 1 if v else 0
            self.data.size += 1
        else:
            self.data.reserve(8)
            (<int64_t*>(self.data.ptr + self.data.size))[0] = v
            self.data.size += 8
        return 0

    cdef int _put_double(self, Py_ssize_t row, double v) except -1:
        self._begin(row)
        self.data.reserve(8)
        (<double*>(self.data.ptr + self.data.size))[0] = v
        self.data.size += 8
        return 0

    cdef int _put_utf8(self, Py_ssize_t row, const unsigned char* s, Py_ssize_t slen) except -1:
        cdef int64_t end
        self._begin(row)
        self.data.reserve(slen)
        memcpy(self.data.ptr + self.data.size, s, slen)
        self.data.size += slen
        self.offsets.reserve(8)
        end = self.data.size
        (<int64_t*>(self.offsets.ptr + self.offsets.size))[0] = end
        self.offsets.size += 8
        return 0

    cdef int put(self, Py_ssize_t row, object v) except -1:
        """Set row `row` (>= n) to a non-null value of this column's type."""
        cdef Py_ssize_t slen
        cdef const char* s
        if self.kind == K_INT:
            self._put_int(row, PyLong_AsLongLong(v))
        elif self.kind == K_FLOAT:
            self._put_double(row, PyFloat_AsDouble(v))
        elif self.kind == K_BOOL:
            self._put_int(row, 1 if v else 0)
        else:
            s = PyUnicode_AsUTF8AndSize(v, &slen)
            self._put_utf8(row, <const unsigned char*>s, slen)
        return 0

    cdef bint same_name(self, const unsigned char* s, Py_ssize_t n) noexcept:
        """Whether this column's name is the ASCII bytes s[:n]."""
        return n == len(self.name_b) and memcmp(<const char*>self.name_b, s, n) == 0

    cdef int append_from(self, Column src, Py_ssize_t at, Py_ssize_t k) except -1:
        """Append src's rows [0, k) as rows [at, at + k) of this column (same kind)."""
        cdef int w = self._width()
        cdef Py_ssize_t i
        cdef int64_t base
        cdef int64_t* so
        cdef int64_t* do
        if src.kind != self.kind:
            raise ValueError(f"column {self.name!r}: kind {src.kind} into kind {self.kind}")
        if at < self.n:
            self.truncate(at)
        self.pad(at)
        src.pad(k)
        self.valid.reserve(k)
        memcpy(self.valid.ptr + self.valid.size, src.valid.ptr, k)
        self.valid.size += k
        if w:
            self.data.reserve(k * w)
            memcpy(self.data.ptr + self.data.size, src.data.ptr, k * w)
            self.data.size += k * w
        else:
            so = <int64_t*>src.offsets.ptr
            base = self.data.size
            self.data.reserve(so[k])
            memcpy(self.data.ptr + self.data.size, src.data.ptr, so[k])
            self.data.size += so[k]
            self.offsets.reserve(k * 8)
            do = <int64_t*>(self.offsets.ptr + self.offsets.size)
            for i in range(k):
                do[i] = base + so[i + 1]
            self.offsets.size += k * 8
        self.n = at + k
        return 0

    cdef Column split_at(self, Py_ssize_t pos):
        """Move rows [pos, n) into a new column (returned); this one keeps rows [0, pos).
        Rows of the new column are numbered from 0."""
        cdef Column out = Column(self.name, self.kind)
        cdef Py_ssize_t k = self.n - pos, i
        cdef int w = self._width()
        cdef int64_t base, end
        cdef int64_t* so
        cdef int64_t* do
        if k <= 0:
            return out
        out.valid.reserve(k)
        memcpy(out.valid.ptr, self.valid.ptr + pos, k)
        out.valid.size = k
        if w:
            out.data.reserve(k * w)
            memcpy(out.data.ptr, self.data.ptr + pos * w, k * w)
            out.data.size = k * w
        else:
            so = <int64_t*>self.offsets.ptr
            base = so[pos]
            end = so[self.n]
            out.data.reserve(end - base)
            if end > base:
                memcpy(out.data.ptr, self.data.ptr + base, end - base)
            out.data.size = end - base
            out.offsets.reserve(k * 8)      # offsets[0] = 0 is already there
            do = <int64_t*>(out.offsets.ptr + out.offsets.size)
            for i in range(k):
                do[i] = so[pos + 1 + i] - base
            out.offsets.size += k * 8
        out.n = k
        self.truncate(pos)
        return out

    def arrays(self, Py_ssize_t n):
        """(values, valid, offsets) as numpy arrays for rows [0, n), nulls padded: values is
        int64/float64/bool, or uint8 UTF-8 bytes with int64 offsets (n + 1) for str."""
        self.pad(n)
        valid = self.valid.view(np.bool_)[:n]
        if self.kind == K_INT:
            return self.data.view(np.int64)[:n], valid, None
        if self.kind == K_FLOAT:
            return self.data.view(np.float64)[:n], valid, None
        if self.kind == K_BOOL:
            return self.data.view(np.bool_)[:n], valid, None
        offs = self.offsets.view(np.int64)[:n + 1]
        return self.data.view(np.uint8)[:offs[n] if n else 0], valid, offs

    def py_values(self, cnp.ndarray idx, Py_ssize_t n):
        """Python values (None for null) of the rows at the int64 positions `idx` (< n)."""
        cdef Py_ssize_t k, m = idx.shape[0], i
        cdef list out = [None] * m
        cdef int64_t* ix
        cdef int64_t* offs
        cdef uint8_t* ok
        self.pad(n)
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        ix = <int64_t*>cnp.PyArray_DATA(idx)
        ok = <uint8_t*>self.valid.ptr
        offs = <int64_t*>self.offsets.ptr
        for k in range(m):
            i = ix[k]
            if not ok[i]:
                continue
            if self.kind == K_INT:
                out[k] = (<int64_t*>self.data.ptr)[i]
            elif self.kind == K_FLOAT:
                out[k] = (<double*>self.data.ptr)[i]
            elif self.kind == K_BOOL:
                out[k] = (<uint8_t*>self.data.ptr)[i] != 0
            else:
                out[k] = PyUnicode_DecodeUTF8(self.data.ptr + offs[i], offs[i + 1] - offs[i],
                                              NULL)
        return out


cdef class TableLog:
    """The rows of one table since the last flush, in the order they were applied."""
    cdef readonly Py_ssize_t n
    cdef _Buf ts
    cdef _Buf version
    cdef _Buf epoch
    cdef readonly dict columns          # name -> Column, in creation order
    cdef readonly bint increasing       # every ts above the previous one: sorted, no repeats
    cdef int64_t first_ts
    cdef int64_t last_ts
    cdef list order                     # parse_batch: the columns of the last row, in order

    def __cinit__(self):
        self.n = 0
        self.ts = _Buf()
        self.version = _Buf()
        self.epoch = _Buf()
        self.columns = {}
        self.increasing = True
        self.first_ts = 0
        self.last_ts = 0
        self.order = []

    cdef inline void _note_ts(self, int64_t ts) noexcept:
        if self.n == 0:
            self.first_ts = ts
        elif ts <= self.last_ts:
            self.increasing = False
        self.last_ts = ts

    cdef int _append_key(self, int64_t ts) except -1:
        """Commit a staged row whose values were put at row n (version, epoch set later)."""
        self._note_ts(ts)
        self.ts.reserve(8)
        self.version.reserve(8)
        self.epoch.reserve(8)
        (<int64_t*>(self.ts.ptr + self.ts.size))[0] = ts
        (<int64_t*>(self.version.ptr + self.version.size))[0] = 0
        (<int64_t*>(self.epoch.ptr + self.epoch.size))[0] = 0
        self.ts.size += 8
        self.version.size += 8
        self.epoch.size += 8
        self.n += 1
        return 0

    def extend(self, TableLog src, int64_t version, int64_t epoch):
        """Append every row of `src` (a staged batch's log), written by `version`."""
        cdef Py_ssize_t k = src.n, at = self.n, i
        cdef int64_t* v
        cdef int64_t* e
        cdef Column scol, col
        cdef PyObject* q
        if k == 0:
            return
        for name, scol in src.columns.items():
            q = PyDict_GetItem(self.columns, name)
            if q is NULL:
                col = Column(name, scol.kind)
                self.columns[name] = col
            else:
                col = <Column>q
            col.append_from(scol, at, k)
        if at == 0:
            self.first_ts = src.first_ts
            self.increasing = src.increasing
        elif not (src.increasing and src.first_ts > self.last_ts):
            self.increasing = False
        self.last_ts = src.last_ts
        self.ts.reserve(k * 8)
        memcpy(self.ts.ptr + self.ts.size, src.ts.ptr, k * 8)
        self.ts.size += k * 8
        self.version.reserve(k * 8)
        self.epoch.reserve(k * 8)
        v = <int64_t*>(self.version.ptr + self.version.size)
        e = <int64_t*>(self.epoch.ptr + self.epoch.size)
        for i in range(k):
            v[i] = version
            e[i] = epoch
        self.version.size += k * 8
        self.epoch.size += k * 8
        self.n = at + k

    cdef int append(self, int64_t ts, int64_t version, int64_t epoch, dict values,
                    object schema) except -1:
        cdef Py_ssize_t row = self.n
        cdef Py_ssize_t pos = 0
        cdef PyObject* kp
        cdef PyObject* vp
        cdef PyObject* cp
        cdef Column col
        cdef object tname
        self._note_ts(ts)
        self.ts.reserve(8)
        self.version.reserve(8)
        self.epoch.reserve(8)
        (<int64_t*>(self.ts.ptr + self.ts.size))[0] = ts
        (<int64_t*>(self.version.ptr + self.version.size))[0] = version
        (<int64_t*>(self.epoch.ptr + self.epoch.size))[0] = epoch
        while PyDict_Next(values, &pos, &kp, &vp):
            if <object>vp is None:
                continue
            cp = PyDict_GetItem(self.columns, <object>kp)
            if cp is NULL:
                tname = schema.get(<object>kp) if schema is not None else None
                if tname is None:
                    raise ValueError(f"column {<object>kp!r} has a value but no type")
                col = Column(<str>kp, KIND_OF_TYPE[tname])
                self.columns[<object>kp] = col
            else:
                col = <Column>cp
            col.put(row, <object>vp)
        # Committed last: a failed put leaves the row count (and every column) as it was
        # before this row, except for values appended past n, which later rows overwrite.
        self.ts.size += 8
        self.version.size += 8
        self.epoch.size += 8
        self.n = row + 1
        return 0

    def append_row(self, int64_t ts, int64_t version, int64_t epoch, dict values,
                   object schema):
        self.append(ts, version, epoch, values, schema)

    cdef void _rescan_ts(self) noexcept:
        """first_ts, last_ts and increasing from the n rows' ts."""
        cdef int64_t* t = <int64_t*>self.ts.ptr
        cdef Py_ssize_t i
        self.increasing = True
        if self.n == 0:
            self.first_ts = self.last_ts = 0
            return
        self.first_ts = t[0]
        for i in range(1, self.n):
            if t[i] <= t[i - 1]:
                self.increasing = False
                break
        self.last_ts = t[self.n - 1]

    def split_at(self, Py_ssize_t pos):
        """Move rows [pos, n) into a new TableLog (returned); this log keeps rows [0, pos).

        A prefix cut: versions never go down in append order, so the rows a flush may
        archive (version <= a limit) are a prefix of every log (docs/vnode.md §5). The moved
        rows are copied (they are the few not yet committed); the kept prefix is only
        shortened, so nothing it exported changes. Columns with no row at or after `pos`
        stay behind (the new log reads them as null)."""
        cdef TableLog out = TableLog()
        cdef Py_ssize_t k = self.n - pos
        cdef Column col
        if pos < 0 or pos > self.n:
            raise IndexError(f"split_at({pos}) of a log of {self.n} rows")
        if k == 0:
            return out
        for name, col in self.columns.items():
            if col.n > pos:
                out.columns[name] = col.split_at(pos)
        out.ts.reserve(k * 8)
        out.version.reserve(k * 8)
        out.epoch.reserve(k * 8)
        memcpy(out.ts.ptr, self.ts.ptr + pos * 8, k * 8)
        memcpy(out.version.ptr, self.version.ptr + pos * 8, k * 8)
        memcpy(out.epoch.ptr, self.epoch.ptr + pos * 8, k * 8)
        out.ts.size = out.version.size = out.epoch.size = k * 8
        out.n = k
        out._rescan_ts()
        self.ts.size = self.version.size = self.epoch.size = pos * 8
        self.n = pos
        self.order = []
        if self.increasing:
            self.last_ts = (<int64_t*>self.ts.ptr)[pos - 1] if pos else 0
            if pos == 0:
                self.first_ts = 0
        else:
            self._rescan_ts()
        return out

    def seal(self):
        """Pad every column to n rows: reading the log afterwards writes nothing."""
        cdef Column col
        for col in self.columns.values():
            col.pad(self.n)

    def arrays(self):
        """(ts, version, epoch) int64 numpy arrays of the n rows (views, never changed)."""
        n = self.n
        return (self.ts.view(np.int64)[:n], self.version.view(np.int64)[:n],
                self.epoch.view(np.int64)[:n])


cdef inline TableLog _log_of(dict tables, object table):
    """The table's log in `tables`, created on first use."""
    cdef PyObject* p = PyDict_GetItem(tables, table)
    if p is not NULL:
        return <TableLog>p
    log = TableLog()
    tables[table] = log
    return log


def apply_rows(dict tables, object rows, int64_t version, int64_t epoch, object schemas):
    """Append validated rows [table, ts, {column: value}] written by `version` to the
    tables' logs (created on first use); `schemas` maps table -> {column: type name} and
    must already hold every column a non-null value of these rows uses. Returns how many
    rows were appended."""
    cdef Py_ssize_t k = 0
    cdef PyObject* p
    cdef TableLog log
    cdef object row, table, sch
    cdef dict sch_of = schemas if type(schemas) is dict else None
    if sch_of is None and schemas is not None:
        sch_of = dict(schemas)
    for row in rows:
        table = row[0]
        log = _log_of(tables, table)
        p = PyDict_GetItem(sch_of, table) if sch_of is not None else NULL
        sch = <object>p if p is not NULL else None
        log.append(PyLong_AsLongLong(row[1]), version, epoch, <dict?>row[2], sch)
        k += 1
    return k


# ---------------------------------------------------------------------------------------------
# Staged batches: a client's JSON body parsed straight into column logs.
#
# parse_batch reads the bytes of a JSON array of [table, ts, {column: value}] rows and
# fills fresh TableLogs, with no Python object per row or value. It accepts a batch only if
# json.loads + check_rows (vrepl/vnode/rows.py) would accept it, with the same new columns
# and estimated bytes; anything it is not sure of (a backslash escape, a byte above 0x7f,
# NaN, an int beyond int64, a duplicate key, any refusal) returns None and the caller takes
# the reference path, whose answer (and one-line reason) is the contract. So it only has to
# agree with the reference on *whether* a batch is good and what it holds, which
# tests/unit/test_memtable_columns.py checks on generated bodies.

cdef extern from "Python.h":
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow_exception) except? -1.0

cdef enum:
    ROW_OVERHEAD_BYTES = 16
    VALUE_FIXED_BYTES = 8
    MAX_NUMBER_CHARS = 64
    MAX_ROW_KEYS = 64

cdef str T_INT = "int"
cdef str T_FLOAT = "float"
cdef str T_STR = "str"
cdef str T_BOOL = "bool"


cdef class Staged:
    """A parsed, checked batch not yet in a memtable: its rows per table (version and epoch
    still unset), the columns it adds to the schemas, and its estimated bytes."""
    cdef readonly dict tables          # table -> TableLog
    cdef readonly dict added           # table -> {column: type name} new to the schemas
    cdef readonly Py_ssize_t rows
    cdef readonly Py_ssize_t nbytes

    def __len__(self):
        return self.rows


cdef class _Parser:
    cdef const unsigned char* p
    cdef Py_ssize_t i
    cdef Py_ssize_t n

    cdef inline void ws(self) noexcept:
        cdef unsigned char c
        while self.i < self.n:
            c = self.p[self.i]
            if c == 32 or c == 10 or c == 13 or c == 9:
                self.i += 1
            else:
                return

    cdef inline bint eat(self, unsigned char c) noexcept:
        self.ws()
        if self.i < self.n and self.p[self.i] == c:
            self.i += 1
            return True
        return False

    cdef inline bint word(self, const char* w, Py_ssize_t n) noexcept:
        """Consume the literal w[:n] if it comes next."""
        if self.n - self.i < n or memcmp(self.p + self.i, w, n) != 0:
            return False
        self.i += n
        return True

    cdef Py_ssize_t string(self, Py_ssize_t* start) noexcept:
        """A plain string (printable ASCII, no escapes): its length, start in *start; -1 if
        the next token is anything else."""
        cdef Py_ssize_t j
        cdef unsigned char c
        self.ws()
        if self.i >= self.n or self.p[self.i] != 34:
            return -1
        j = self.i + 1
        while j < self.n:
            c = self.p[j]
            if c == 34:
                start[0] = self.i + 1
                self.i = j + 1
                return j - start[0]
            if c == 92 or c < 32 or c > 126:
                return -1
            j += 1
        return -1


cdef inline bint _name_ok(const unsigned char* s, Py_ssize_t n, bint table) noexcept:
    """TABLE_NAME_RE / COLUMN_NAME_RE (and not "ts" for a column) on ASCII bytes."""
    cdef Py_ssize_t k
    cdef unsigned char c
    if n < 1 or n > (192 if table else 64):
        return False
    c = s[0]
    if not ((65 <= c <= 90) or (97 <= c <= 122) or (table and c == 95)):
        return False
    for k in range(1, n):
        c = s[k]
        if not ((65 <= c <= 90) or (97 <= c <= 122) or (48 <= c <= 57) or c == 95):
            return False
    if not table and n == 2 and s[0] == 116 and s[1] == 115:
        return False
    return True


cdef int _parse_int(const unsigned char* s, Py_ssize_t n, long long* out) noexcept:
    """An int literal (-?digits, already checked) into *out; -1 if beyond int64."""
    cdef Py_ssize_t k = 0
    cdef bint neg = False
    cdef unsigned long long acc = 0, limit
    cdef unsigned int d
    if n and s[0] == 45:
        neg = True
        k = 1
    limit = 9223372036854775808ULL if neg else 9223372036854775807ULL
    while k < n:
        d = s[k] - 48
        if acc > (limit - d) // 10:
            return -1
        acc = acc * 10 + d
        k += 1
    if neg:
        out[0] = <long long>(0 - acc)
    else:
        out[0] = <long long>acc
    return 0


cdef inline bint _kind_accepts(int kind, object vtype) noexcept:
    if kind == K_INT:
        return vtype is T_INT
    if kind == K_FLOAT:
        return vtype is T_FLOAT or vtype is T_INT
    if kind == K_BOOL:
        return vtype is T_BOOL
    return vtype is T_STR


cdef inline bint _type_accepts(object ctype, object vtype):
    return ctype == vtype or (ctype == T_FLOAT and vtype is T_INT)


def parse_batch(object body, object schemas, bint limits, long long ts_lo, long long ts_hi,
                Py_ssize_t max_rows, Py_ssize_t max_row_bytes, Py_ssize_t max_batch_bytes,
                Py_ssize_t max_columns, Py_ssize_t max_tables, object table_count):
    """The Staged batch of a JSON body (bytes-like), or None: ask json.loads + check_rows.

    Arguments as vrepl._core.rows.fast_check: `limits` False checks only the shape (a
    payload read back from the WAL), with the schemas' column types still enforced.
    """
    cdef const unsigned char[::1] view = memoryview(body).cast("B")
    cdef _Parser ps = _Parser()
    cdef Staged st = Staged()
    cdef dict tables = {}
    cdef dict added = {}
    cdef dict sch = schemas if type(schemas) is dict else None
    cdef Py_ssize_t nrows = 0, total = 0, size, new_tables = 0, L, s0, j, ncols_known
    cdef Py_ssize_t tcount = -1 if table_count is None else table_count
    cdef Py_ssize_t row, nvals, k0 = 0, kl, m, t0 = 0, tl = -1
    cdef bint same_table
    cdef Py_ssize_t kstarts[MAX_ROW_KEYS]
    cdef Py_ssize_t klens[MAX_ROW_KEYS]
    cdef long long ts = 0, iv = 0
    cdef double dv = 0
    cdef bint isfloat
    cdef char numbuf[MAX_NUMBER_CHARS + 1]
    cdef char* endp
    cdef unsigned char c
    cdef PyObject* q
    cdef object table, known, new_cols, colname, vtype, ctype, v
    cdef TableLog log
    cdef Column col
    if schemas is not None and sch is None:
        return None
    if view.shape[0] == 0:
        return None
    ps.p = &view[0]
    ps.n = view.shape[0]
    ps.i = 0
    if not ps.eat(91):                                    # [
        return None
    while True:
        # -- one row: [ "table" , ts , { ... } ]
        if not ps.eat(91):
            return None
        L = ps.string(&s0)
        if L < 0:
            return None
        # Rows of a batch mostly share their table: the previous row's, found again by
        # its bytes, needs no name check, object or lookup.
        same_table = L == tl and memcmp(ps.p + s0, ps.p + t0, L) == 0
        if not same_table:
            if not _name_ok(ps.p + s0, L, True):
                return None
            t0 = s0
            tl = L
        if not ps.eat(44):
            return None
        # ts: an int literal within int64 and [ts_lo, ts_hi]
        ps.ws()
        j = ps.i
        if j < ps.n and ps.p[j] == 45:
            j += 1
        if j >= ps.n or not (48 <= ps.p[j] <= 57) or (ps.p[j] == 48 and j + 1 < ps.n and 48 <= ps.p[j + 1] <= 57):
            return None
        while j < ps.n and 48 <= ps.p[j] <= 57:
            j += 1
        if j < ps.n and (ps.p[j] == 46 or ps.p[j] == 101 or ps.p[j] == 69):
            return None                                   # a float ts: refused
        if _parse_int(ps.p + ps.i, j - ps.i, &ts) < 0:
            return None
        ps.i = j
        if ts < ts_lo or ts > ts_hi:
            return None
        if not ps.eat(44) or not ps.eat(123):             # , {
            return None
        if not same_table:
            table = PyUnicode_DecodeUTF8(<const char*>ps.p + t0, tl, NULL)
            # the table's schema and log
            known = table_known(sch, added, table, limits, tcount, max_tables, &new_tables)
            if known is None:
                return None
            q = PyDict_GetItem(added, table)
            new_cols = <object>q if q is not NULL else None
            log = _log_of(tables, table)
        row = log.n
        size = ROW_OVERHEAD_BYTES + tl
        nvals = 0
        if ps.eat(125):                                   # {}: no value columns
            return None
        while True:
            kl = ps.string(&k0)
            if kl < 0:
                return None
            if not ps.eat(58):                            # :
                return None
            # A key twice in one row: json.loads keeps the last value (and the estimate
            # counts the key once); left to the reference path.
            if nvals >= MAX_ROW_KEYS:
                return None
            for m in range(nvals):
                if klens[m] == kl and memcmp(ps.p + kstarts[m], ps.p + k0, kl) == 0:
                    return None
            kstarts[nvals] = k0
            klens[nvals] = kl
            colname = None
            size += kl
            nvals += 1
            ps.ws()
            if ps.i >= ps.n:
                return None
            c = ps.p[ps.i]
            if c == 34:                                   # a string value
                L = ps.string(&s0)
                if L < 0:
                    return None
                vtype = T_STR
                size += L
            elif c == 116 or c == 102:                    # true, false
                iv = 1 if c == 116 else 0
                if not ps.word(b"true" if iv else b"false", 4 if iv else 5):
                    return None
                vtype = T_BOOL
                size += 1
            elif c == 110:                                # null
                if not ps.word(b"null", 4):
                    return None
                vtype = None
            elif c == 45 or 48 <= c <= 57:                # a number
                j = ps.i
                if ps.p[j] == 45:
                    j += 1
                if j >= ps.n or not (48 <= ps.p[j] <= 57):
                    return None                           # -Infinity, or junk
                if ps.p[j] == 48 and j + 1 < ps.n and 48 <= ps.p[j + 1] <= 57:
                    return None                           # leading zero
                while j < ps.n and 48 <= ps.p[j] <= 57:
                    j += 1
                isfloat = False
                if j < ps.n and ps.p[j] == 46:
                    isfloat = True
                    j += 1
                    if j >= ps.n or not (48 <= ps.p[j] <= 57):
                        return None
                    while j < ps.n and 48 <= ps.p[j] <= 57:
                        j += 1
                if j < ps.n and (ps.p[j] == 101 or ps.p[j] == 69):
                    isfloat = True
                    j += 1
                    if j < ps.n and (ps.p[j] == 43 or ps.p[j] == 45):
                        j += 1
                    if j >= ps.n or not (48 <= ps.p[j] <= 57):
                        return None
                    while j < ps.n and 48 <= ps.p[j] <= 57:
                        j += 1
                if j - ps.i > MAX_NUMBER_CHARS:
                    return None
                if isfloat:
                    memcpy(numbuf, ps.p + ps.i, j - ps.i)
                    numbuf[j - ps.i] = 0
                    dv = PyOS_string_to_double(numbuf, &endp, NULL)
                    if endp != numbuf + (j - ps.i) or not isfinite(dv):
                        return None
                    vtype = T_FLOAT
                else:
                    if _parse_int(ps.p + ps.i, j - ps.i, &iv) < 0:
                        return None                       # beyond int64
                    vtype = T_INT
                ps.i = j
                size += VALUE_FIXED_BYTES
            else:
                return None                               # NaN, Infinity, nested, junk
            # The column: the one at this key position in the table's previous row when
            # the name matches (no lookup, no object), else by name.
            col = None
            if nvals <= len(log.order) and (<Column>log.order[nvals - 1]).same_name(ps.p + k0, kl):
                col = <Column>log.order[nvals - 1]
            if col is None:
                # (A name found in the cache was checked when its column was made.)
                if not _name_ok(ps.p + k0, kl, False):
                    return None
                colname = PyUnicode_DecodeUTF8(<const char*>ps.p + k0, kl, NULL)
                q = PyDict_GetItem(log.columns, colname)
                if q is not NULL:
                    col = <Column>q
            if col is not None:
                # Its type is already settled (known, or added by an earlier row).
                if vtype is not None and not _kind_accepts(col.kind, vtype):
                    return None
            else:
                # The column's type: known, added by this batch, or set now by this value.
                q = PyDict_GetItem(<dict>known, colname)
                if q is NULL and new_cols is not None:
                    q = PyDict_GetItem(<dict>new_cols, colname)
                if q is NULL:
                    if vtype is None:
                        # A null for a column with no type yet: nothing to store (as in
                        # the reference, it adds no column).
                        if ps.eat(44):
                            continue
                        if ps.eat(125):
                            break
                        return None
                    if new_cols is None:
                        new_cols = {}
                        added[table] = new_cols
                    if limits and len(<dict>known) + len(<dict>new_cols) + 1 > max_columns:
                        return None
                    new_cols[colname] = vtype
                    ctype = vtype
                else:
                    ctype = <object>q
                    if vtype is not None and not _type_accepts(ctype, vtype):
                        return None
                col = Column(colname, KIND_OF_TYPE[ctype])
                log.columns[colname] = col
            if col.n > row:
                return None                               # the same key twice in one row
            if vtype is None:
                col.pad(row + 1)
            elif col.kind == K_STR:
                col._put_utf8(row, ps.p + s0, L)
            elif col.kind == K_FLOAT:
                col._put_double(row, dv if vtype is T_FLOAT else <double>iv)
            else:
                col._put_int(row, iv)
            if nvals > len(log.order):
                log.order.append(col)
            elif log.order[nvals - 1] is not col:
                log.order[nvals - 1] = col
            if ps.eat(44):
                continue
            if ps.eat(125):
                break
            return None
        if not ps.eat(93):                                # ] ends the row
            return None
        if limits and size > max_row_bytes:
            return None
        total += size
        if limits and total > max_batch_bytes:
            return None
        log._append_key(ts)
        nrows += 1
        if limits and nrows > max_rows:
            return None
        if ps.eat(44):
            continue
        if ps.eat(93):
            break
        return None
    ps.ws()
    if ps.i != ps.n:
        return None                                       # trailing data
    st.tables = tables
    st.added = added
    st.rows = nrows
    st.nbytes = total
    return st


include "lineproto.pxi"
include "arrowin.pxi"

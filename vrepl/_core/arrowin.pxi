# Arrow record batches copied straight into a Staged batch (included by memcols.pyx).
#
# arrow_to_staged takes the buffers of Arrow arrays that vrepl/vnode/ingest.py read from an
# IPC stream with pyarrow (and validated in full: offsets, UTF-8, dictionary indexes) and
# appends their values row by row, in C, to the tables' column logs, with the schema and
# limit checks of parse_batch. It explains every refusal itself (one line naming the row
# and column). It reads memory only through the addresses and lengths it is given, which
# ingest.py takes from arrays pyarrow has validated, and keeps a reference to them.

from libc.stdint cimport int8_t, int16_t, int32_t, uint16_t, uint32_t, uint64_t, uintptr_t

# Column codes (ingest.py's ARROW_* constants): how a column's values are laid out.
cdef enum:
    A_NULL = 0          # the null type: every value null
    A_BOOL = 1          # bit-packed booleans
    A_INT = 2           # signed integers of `width` bytes
    A_UINT = 3          # unsigned integers of `width` bytes
    A_FLOAT = 4         # IEEE floats of `width` (4 or 8) bytes
    A_STR = 5           # UTF-8 with offsets of `owidth` (4 or 8) bytes
    A_DICT = 6          # indexes (`width` bytes, signed unless `unsigned_index`) into a
                        # string dictionary with offsets of `owidth` bytes

ARROW_NULL, ARROW_BOOL, ARROW_INT, ARROW_UINT, ARROW_FLOAT, ARROW_STR, ARROW_DICT = \
    A_NULL, A_BOOL, A_INT, A_UINT, A_FLOAT, A_STR, A_DICT


cdef class ArrowColumn:
    """Where one Arrow array's values are (set by ingest.py from a validated array)."""
    cdef public str name
    cdef public int code
    cdef public int width
    cdef public int owidth
    cdef public bint unsigned_index
    cdef public Py_ssize_t offset          # the array's offset (in values)
    cdef public Py_ssize_t dict_offset
    cdef public Py_ssize_t dict_len
    cdef public uintptr_t validity         # 0: no nulls
    cdef public uintptr_t data
    cdef public uintptr_t offsets
    cdef public uintptr_t dict_offsets
    cdef public uintptr_t dict_data
    cdef public object keep                # the array (its buffers live as long as it)
    cdef TableLog last_log                 # the column last resolved for this array
    cdef Column last_col


cdef inline bint _bit(uintptr_t bits, Py_ssize_t j) noexcept:
    return ((<const uint8_t*>bits)[j >> 3] >> (j & 7)) & 1


cdef inline bint _valid(ArrowColumn a, Py_ssize_t r) noexcept:
    return a.validity == 0 or _bit(a.validity, a.offset + r)


cdef inline long long _int_at(uintptr_t data, int width, bint unsigned, Py_ssize_t j,
                              bint* too_big) noexcept:
    cdef uint64_t u
    if unsigned:
        if width == 1:
            return (<const uint8_t*>data)[j]
        if width == 2:
            return (<const uint16_t*>data)[j]
        if width == 4:
            return (<const uint32_t*>data)[j]
        u = (<const uint64_t*>data)[j]
        if u > <uint64_t>LLONG_MAX:
            too_big[0] = True
            return 0
        return <long long>u
    if width == 1:
        return (<const int8_t*>data)[j]
    if width == 2:
        return (<const int16_t*>data)[j]
    if width == 4:
        return (<const int32_t*>data)[j]
    return (<const int64_t*>data)[j]


cdef inline const unsigned char* _str_at(uintptr_t offsets, uintptr_t data, int owidth,
                                         Py_ssize_t j, Py_ssize_t* length) noexcept:
    cdef int64_t a, b
    if owidth == 4:
        a = (<const int32_t*>offsets)[j]
        b = (<const int32_t*>offsets)[j + 1]
    else:
        a = (<const int64_t*>offsets)[j]
        b = (<const int64_t*>offsets)[j + 1]
    length[0] = b - a
    return <const unsigned char*>data + a


cdef inline const unsigned char* _string(ArrowColumn a, Py_ssize_t r, Py_ssize_t* length,
                                         bint* bad) noexcept:
    """The UTF-8 bytes of row r of a string or dictionary column."""
    cdef long long k
    cdef bint too_big = False
    if a.code == A_STR:
        return _str_at(a.offsets, a.data, a.owidth, a.offset + r, length)
    k = _int_at(a.data, a.width, a.unsigned_index, a.offset + r, &too_big)
    if too_big or k < 0 or k >= a.dict_len:
        bad[0] = True
        length[0] = 0
        return NULL
    return _str_at(a.dict_offsets, a.dict_data, a.owidth, a.dict_offset + k, length)


cdef str _vtype_of(int code):
    if code == A_BOOL:
        return T_BOOL
    if code == A_INT or code == A_UINT:
        return T_INT
    if code == A_FLOAT:
        return T_FLOAT
    return T_STR


def arrow_to_staged(list batches, object schemas, bint limits, long long ts_lo,
                    long long ts_hi, Py_ssize_t max_rows, Py_ssize_t max_row_bytes,
                    Py_ssize_t max_batch_bytes, Py_ssize_t max_columns, Py_ssize_t max_tables,
                    object table_count, int vunit):
    """(Staged, None) of record batches, or (None, one-line reason).

    `batches`: (rows, table, ts, ts_unit, columns) per record batch: `table` a table name
    (str) or the ArrowColumn of the `_table` column (string or dictionary, no nulls), `ts`
    the ArrowColumn of the int64 `ts` column (no nulls), `ts_unit` its unit code (-1: already
    the vnode's unit `vunit`), `columns` the value columns' ArrowColumns. Other arguments
    as parse_batch."""
    cdef Staged st = Staged()
    cdef dict tables = {}, added = {}
    cdef dict sch = schemas if type(schemas) is dict else None
    cdef Py_ssize_t tcount = -1 if table_count is None else table_count
    cdef Py_ssize_t new_tables = 0, nrows = 0, total = 0, size, r, nb, k, slen, tl = -1
    cdef Py_ssize_t name_len = 0, row
    cdef ArrowColumn tcol, tsc, a
    cdef TableLog log = None
    cdef Column col
    cdef PyObject* q
    cdef const unsigned char* s
    cdef const unsigned char* prev_t = NULL
    cdef long long ts, iv
    cdef double dv
    cdef bint bad = False, too_big = False
    cdef int ts_unit
    cdef object table = None, known = None, new_cols = None, ctype, vtype
    cdef list cols
    if schemas is not None and sch is None:
        return None, "schemas must be a dict"
    for nb_rows, tab, tso, ts_unit_o, cols_o in batches:
        nb = nb_rows
        tsc = <ArrowColumn>tso
        ts_unit = ts_unit_o
        cols = <list>cols_o
        tcol = tab if type(tab) is ArrowColumn else None
        if tcol is None and tab is not table:
            table = tab
            log = None
        prev_t = NULL
        tl = -1
        for r in range(nb):
            # -- the table: the batch's, or this row's `_table` value
            if tcol is not None:
                s = _string(tcol, r, &slen, &bad)
                if bad:
                    return None, f"row {nrows}: _table: dictionary index out of range"
                if not (slen == tl and memcmp(s, prev_t, slen) == 0):
                    if not _name_ok(s, slen, True):
                        return None, (f"row {nrows}: table name"
                                      f" {PyUnicode_DecodeUTF8(<const char*>s, min(slen, 80), 'replace')!r}"
                                      " does not match [A-Za-z_][A-Za-z0-9_]{0,191}")
                    table = PyUnicode_DecodeUTF8(<const char*>s, slen, NULL)
                    prev_t = s
                    tl = slen
                    log = None
            if log is None:
                known = table_known(sch, added, table, limits, tcount, max_tables, &new_tables)
                if known is None:
                    return None, f"row {nrows}: table {table!r} would exceed max_tables {max_tables}"
                q = PyDict_GetItem(added, table)
                new_cols = <object>q if q is not NULL else None
                log = _log_of(tables, table)
                name_len = len(table)
            # -- ts
            iv = (<const int64_t*>tsc.data)[tsc.offset + r]
            if ts_unit < 0:
                ts = iv
            elif convert_ts(iv, ts_unit, vunit, &ts) < 0:
                return None, f"row {nrows}: ts {iv} is out of range in the vnode's precision"
            if limits and (ts < ts_lo or ts > ts_hi):
                return None, f"row {nrows}: ts {ts} is outside [{ts_lo}, {ts_hi}]"
            # -- values
            row = log.n
            size = ROW_OVERHEAD_BYTES + name_len
            for k in range(len(cols)):
                a = <ArrowColumn>cols[k]
                if a.code == A_NULL or not _valid(a, r):
                    continue
                # the column of this table: the one last resolved for this array, or by name
                if a.last_log is log:
                    col = a.last_col
                else:
                    q = PyDict_GetItem(log.columns, a.name)
                    vtype = _vtype_of(a.code)
                    if q is not NULL:
                        col = <Column>q
                        if not _kind_accepts(col.kind, vtype):
                            return None, (f"row {nrows}: column {a.name!r} of table {table!r} is"
                                          f" {('int', 'float', 'bool', 'str')[col.kind]}, got"
                                          f" {vtype} (a column's type cannot change)")
                    else:
                        q = PyDict_GetItem(<dict>known, a.name)
                        if q is NULL and new_cols is not None:
                            q = PyDict_GetItem(<dict>new_cols, a.name)
                        if q is NULL:
                            if new_cols is None:
                                new_cols = {}
                                added[table] = new_cols
                            if limits and len(<dict>known) + len(<dict>new_cols) + 1 > max_columns:
                                return None, (f"row {nrows}: table {table!r} would have more"
                                              f" than max_columns_per_table {max_columns} columns")
                            new_cols[a.name] = vtype
                            ctype = vtype
                        else:
                            ctype = <object>q
                            if not _type_accepts(ctype, vtype):
                                return None, (f"row {nrows}: column {a.name!r} of table"
                                              f" {table!r} is {ctype}, got {vtype} (a column's"
                                              " type cannot change)")
                        col = Column(a.name, KIND_OF_TYPE[ctype])
                        log.columns[a.name] = col
                    a.last_log = log
                    a.last_col = col
                size += len(a.name)
                if a.code == A_INT or a.code == A_UINT:
                    iv = _int_at(a.data, a.width, a.code == A_UINT, a.offset + r, &too_big)
                    if too_big:
                        return None, (f"row {nrows}: column {a.name!r}: uint64 value above"
                                      " 9223372036854775807 (stored as int64)")
                    if col.kind == K_FLOAT:
                        col._put_double(row, <double>iv)
                    else:
                        col._put_int(row, iv)
                    size += VALUE_FIXED_BYTES
                elif a.code == A_FLOAT:
                    if a.width == 4:
                        dv = (<const float*>a.data)[a.offset + r]
                    else:
                        dv = (<const double*>a.data)[a.offset + r]
                    if not isfinite(dv):
                        return None, f"row {nrows}: column {a.name!r}: float {dv!r} is not finite"
                    col._put_double(row, dv)
                    size += VALUE_FIXED_BYTES
                elif a.code == A_BOOL:
                    col._put_int(row, 1 if _bit(a.data, a.offset + r) else 0)
                    size += 1
                else:
                    s = _string(a, r, &slen, &bad)
                    if bad:
                        return None, f"row {nrows}: column {a.name!r}: dictionary index out of range"
                    col._put_utf8(row, s, slen)
                    size += slen
            if limits:
                if size > max_row_bytes:
                    return None, f"row {nrows}: about {size} bytes, above max_row_bytes {max_row_bytes}"
                if total + size > max_batch_bytes:
                    return None, f"batch is above max_batch_bytes {max_batch_bytes} (at row {nrows})"
                if nrows + 1 > max_rows:
                    return None, f"more than max_rows_per_batch {max_rows} rows"
            total += size
            log._append_key(ts)
            nrows += 1
    if nrows == 0:
        return None, "no rows"
    st.tables = tables
    st.added = added
    st.rows = nrows
    st.nbytes = total
    return st, None


# The most rows a stream decoded without a configuration (a payload read back from the WAL)
# may hold: the writing master refused more (max_rows_per_batch); this bounds the work a
# damaged or foreign payload can ask for.
ARROW_DECODE_MAX_ROWS = 1_000_000


# -- the framing of an IPC stream, read before pyarrow reads it --------------------------------
#
# ipc_scan walks the stream's messages (continuation marker, metadata length, the
# flatbuffer Message, its body) with a bounds check on every read, and refuses what the
# decoder must not hand to pyarrow: compressed buffers (their decompressed size is the
# sender's to choose), more than `max_messages`, a stream not starting with its schema, a
# second schema, tensors. Arrow's Message.fbs: Message {version: short (0), header_type:
# ubyte (1), header: offset (2), bodyLength: long (3)}; header types 1 Schema,
# 2 DictionaryBatch {id (0), data: RecordBatch (1)}, 3 RecordBatch {length (0), nodes (1),
# buffers (2), compression (3)}.

cdef inline int _rd(const uint8_t* p, Py_ssize_t n, Py_ssize_t at, int size, void* out) noexcept:
    if at < 0 or size > n or at > n - size:
        return -1
    memcpy(out, p + at, size)
    return 0


cdef Py_ssize_t _fb_field(const uint8_t* p, Py_ssize_t n, Py_ssize_t table, int index) noexcept:
    """The position of field `index` of the flatbuffer table at `table`: 0 absent, -1 bad."""
    cdef int32_t soff
    cdef uint16_t vsize, off
    cdef Py_ssize_t vt
    if _rd(p, n, table, 4, &soff) < 0:
        return -1
    vt = table - soff
    if _rd(p, n, vt, 2, &vsize) < 0:
        return -1
    if 4 + 2 * index + 2 > vsize:
        return 0
    if _rd(p, n, vt + 4 + 2 * index, 2, &off) < 0:
        return -1
    return table + off if off else 0


cdef Py_ssize_t _fb_ref(const uint8_t* p, Py_ssize_t n, Py_ssize_t at) noexcept:
    """The table an offset field at `at` points to, or -1."""
    cdef uint32_t rel
    if at <= 0 or _rd(p, n, at, 4, &rel) < 0:
        return -1
    return at + rel


def ipc_scan(object body, Py_ssize_t max_messages):
    """(None, schema message metadata bytes, [(header type, start, end) per message]) of a
    stream that may be read, or (reason, None, None). A message runs from its framing to the
    end of its body; header types: 1 schema, 2 dictionary batch, 3 record batch."""
    cdef const unsigned char[::1] view = memoryview(body).cast("B")
    cdef const uint8_t* p
    cdef const uint8_t* m
    cdef Py_ssize_t n = view.shape[0], at = 0, count = 0, root, f, hdr, mlen
    cdef uint32_t cont, uroot
    cdef int32_t meta_len
    cdef int64_t body_len
    cdef uint8_t kind
    cdef object schema = None
    cdef list msgs = []
    cdef Py_ssize_t start
    if n == 0:
        return "no schema message", None, None
    p = &view[0]
    while at < n:
        start = at
        if _rd(p, n, at, 4, &cont) < 0:
            return "truncated message length", None, None
        if cont == 0xFFFFFFFF:
            at += 4
            if _rd(p, n, at, 4, &meta_len) < 0:
                return "truncated message length", None, None
        else:
            meta_len = <int32_t>cont          # the pre-1.0 framing, without the marker
        at += 4
        if meta_len == 0:
            break                             # end of stream
        if meta_len < 8 or meta_len > n - at:
            return f"message metadata of {meta_len} bytes, beyond the stream", None, None
        count += 1
        if count > max_messages:
            return f"more than {max_messages} messages", None, None
        m = p + at
        mlen = meta_len
        if _rd(m, mlen, 0, 4, &uroot) < 0:
            return "malformed message metadata", None, None
        root = uroot
        f = _fb_field(m, mlen, root, 1)
        if f < 0 or (f > 0 and _rd(m, mlen, f, 1, &kind) < 0):
            return "malformed message metadata", None, None
        if f == 0:
            kind = 0
        body_len = 0
        f = _fb_field(m, mlen, root, 3)
        if f < 0 or (f > 0 and _rd(m, mlen, f, 8, &body_len) < 0):
            return "malformed message metadata", None, None
        if body_len < 0 or body_len > n - at - mlen:
            return f"message body of {body_len} bytes, beyond the stream", None, None
        if kind == 1:
            if count != 1:
                return "a schema message after the first message", None, None
            schema = PyBytes_FromStringAndSize(<const char*>m, mlen)
        elif count == 1:
            return f"the stream starts with a message of type {kind}, not a schema", None, None
        elif kind == 2 or kind == 3:
            hdr = _fb_ref(m, mlen, _fb_field(m, mlen, root, 2))
            if hdr < 0:
                return "malformed message metadata", None, None
            if kind == 2:
                hdr = _fb_ref(m, mlen, _fb_field(m, mlen, hdr, 1))
                if hdr < 0:
                    return "malformed message metadata", None, None
            f = _fb_field(m, mlen, hdr, 3)
            if f < 0:
                return "malformed message metadata", None, None
            if f > 0:
                return "compressed buffers are not accepted (send the stream uncompressed)", None, None
        else:
            return f"unsupported message type {kind}", None, None
        at += mlen + body_len
        msgs.append((kind, start, at))
    if schema is None:
        return "no schema message", None, None
    return None, schema, msgs


# -- the columns of a record batch, through Arrow's C data interface ------------------------

cdef extern from *:
    """
    struct VreplArrowArray {
      int64_t length; int64_t null_count; int64_t offset; int64_t n_buffers;
      int64_t n_children; const void** buffers; struct VreplArrowArray** children;
      struct VreplArrowArray* dictionary;
      void (*release)(struct VreplArrowArray*); void* private_data;
    };
    """
    struct VreplArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void** buffers
        VreplArrowArray** children
        VreplArrowArray* dictionary
        void (*release)(VreplArrowArray*) noexcept
        void* private_data


cdef class _Exported:
    """A record batch exported through the C data interface (Arrow's ABI-stable struct):
    its buffers stay valid until this object goes, which releases them."""
    cdef VreplArrowArray arr

    def __cinit__(self):
        self.arr.release = NULL

    def __dealloc__(self):
        if self.arr.release != NULL:
            self.arr.release(&self.arr)


cdef uintptr_t _buf(VreplArrowArray* a, int i) noexcept:
    return <uintptr_t>a.buffers[i] if i < a.n_buffers else 0


def export_columns(object batch, list layout):
    """ArrowColumns of a validated record batch: `layout` gives, per column of the batch in
    order, (name, (code, width, owidth, unsigned_index)) as ingest.py's schema check
    decided; the columns' buffers are read from the C data interface in one export."""
    cdef _Exported ex = _Exported()
    cdef VreplArrowArray* c
    cdef ArrowColumn a
    cdef list out = []
    cdef Py_ssize_t i
    batch._export_to_c(<uintptr_t>&ex.arr)
    if ex.arr.n_children != len(layout):
        raise ValueError("the batch does not have its schema's columns")
    for i in range(ex.arr.n_children):
        c = ex.arr.children[i]
        name, code = layout[i]
        a = ArrowColumn()
        a.name = name
        a.code, a.width, a.owidth, a.unsigned_index = code
        a.offset = c.offset
        a.keep = ex
        a.validity = _buf(c, 0) if c.null_count != 0 else 0
        if a.code == A_STR:
            a.offsets = _buf(c, 1)
            a.data = _buf(c, 2)
        elif a.code == A_DICT:
            a.data = _buf(c, 1)
            if c.dictionary == NULL:
                raise ValueError(f"column {name!r}: no dictionary")
            a.dict_offset = c.dictionary.offset
            a.dict_len = c.dictionary.length
            a.dict_offsets = _buf(c.dictionary, 1)
            a.dict_data = _buf(c.dictionary, 2)
        elif a.code != A_NULL:
            a.data = _buf(c, 1)
        if c.length and ((a.code == A_STR and a.offsets == 0)
                         or (a.code == A_DICT and a.dict_len and a.dict_offsets == 0)
                         or (a.code != A_NULL and a.data == 0 and a.code != A_STR)):
            raise ValueError(f"column {name!r}: a buffer is missing")
        out.append(a)
    return out

# InfluxDB line protocol parsed straight into a Staged batch (included by memcols.pyx).
#
# parse_lines reads a body of line protocol (docs/client-api.md §InfluxDB line protocol)
# and fills fresh TableLogs with no Python object per line or value: a series (measurement
# + tag set) becomes a table whose name is derived once per series (series_table, cached),
# its tags string columns, its fields typed columns. Unlike parse_batch it is the only
# decoder of its format, so it explains every refusal itself: (None, reason, line number,
# offset of the line). A request is all or nothing: any bad line refuses the whole body.
# Every replica runs it on the same bytes with the same unit, default timestamp and
# precision (they travel in the WAL payload, docs/vnode.md §2), so they get the same rows.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.limits cimport LLONG_MAX, LLONG_MIN

import hashlib
import re as _re

# Units of a timestamp, by code (the payload's unit byte): ns, us, ms, s, m, h.
cdef long long _NS_PER[6]
_NS_PER[0], _NS_PER[1], _NS_PER[2] = 1, 1000, 1000000
_NS_PER[3], _NS_PER[4], _NS_PER[5] = 1000000000, 60000000000, 3600000000000
UNIT_NS, UNIT_US, UNIT_MS, UNIT_S, UNIT_M, UNIT_H = 0, 1, 2, 3, 4, 5
UNIT_COUNT = 6

SERIES_CACHE_MAX = 65536            # series -> table names remembered across requests
cdef enum:
    LP_MAX_FIELD_CHARS = 64         # a number token longer than this is refused
_PLAIN_TABLE_RE = _re.compile(r"[A-Za-z][A-Za-z0-9_]{0,191}")
_COLUMN_RE = _re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_NOT_NAME_CHAR_RE = _re.compile(r"[^A-Za-z0-9_]")
TABLE_DIGEST_HEX = 32               # 128-bit BLAKE2b of the series, in hex
TABLE_PREFIX_MAX = 192 - 2 - TABLE_DIGEST_HEX


cdef int convert_ts(long long v, int unit, int vunit, long long* out) noexcept:
    """v in `unit` to `vunit` (codes above): exact when finer to coarser is a multiple,
    else rounded down (towards minus infinity); -1 on int64 overflow."""
    cdef long long a = _NS_PER[unit], b = _NS_PER[vunit], f
    if a >= b:
        f = a // b
        if f != 1 and (v > LLONG_MAX // f or v < LLONG_MIN // f):
            return -1
        out[0] = v * f
    else:
        f = b // a
        out[0] = v // f          # Cython keeps Python's floor division for C ints here
    return 0


def convert_timestamp(long long v, int unit, int vunit):
    """convert_ts for Python (tests, the Arrow path's checks): the value, or None on overflow."""
    cdef long long out
    if convert_ts(v, unit, vunit, &out) < 0:
        return None
    return out


cdef Py_ssize_t utf8_invalid_at(const unsigned char* p, Py_ssize_t n) noexcept:
    """-1 when p[:n] is valid UTF-8 (no overlong forms, no surrogates), else the offset of
    the first byte of the first bad sequence."""
    cdef Py_ssize_t i = 0, k
    cdef unsigned char c, lo, hi
    cdef int need
    while i < n:
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        lo, hi = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            need = 1
        elif c == 0xE0:
            need, lo = 2, 0xA0
        elif c == 0xED:
            need, hi = 2, 0x9F
        elif 0xE1 <= c <= 0xEF:
            need = 2
        elif c == 0xF0:
            need, lo = 3, 0x90
        elif 0xF1 <= c <= 0xF3:
            need = 3
        elif c == 0xF4:
            need, hi = 3, 0x8F
        else:
            return i
        if i + need > n - 1:
            return i
        if not (lo <= p[i + 1] <= hi):
            return i
        for k in range(2, need + 1):
            if not (0x80 <= p[i + k] <= 0xBF):
                return i
        i += need + 1
    return -1


def table_of_series(str measurement, tags):
    """The table a series (measurement + tag set) is stored in (docs/client-api.md §Tables
    of line protocol): the measurement itself when the series has no tags and the
    measurement is a table name without "__"; else the measurement made a name (characters
    outside [A-Za-z0-9_] become "_", cut to 158, "m" in front of a leading digit or of
    nothing) + "__" + the 128-bit BLAKE2b, in hex, of the measurement and the tags sorted by
    key (each as a 4-byte little-endian length and its UTF-8 bytes). Deterministic, and two
    series share a table only if their digests collide."""
    cdef list items = sorted((k, v) for k, v in (tags.items() if hasattr(tags, "items") else tags))
    if not items and _PLAIN_TABLE_RE.fullmatch(measurement) is not None \
            and "__" not in measurement:
        return measurement
    h = hashlib.blake2b(digest_size=TABLE_DIGEST_HEX // 2)
    for part in [measurement] + [x for kv in items for x in kv]:
        b = part.encode("utf-8") if type(part) is str else bytes(part)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    prefix = _NOT_NAME_CHAR_RE.sub("_", measurement)[:TABLE_PREFIX_MAX]
    if not prefix or "0" <= prefix[0] <= "9":
        prefix = ("m" + prefix)[:TABLE_PREFIX_MAX]
    return prefix + "__" + h.hexdigest()


cdef bytes _unescape(bytes raw, bytes specials):
    """Drop the backslash before each of `specials`; other backslashes stay."""
    cdef list out = []
    cdef Py_ssize_t i = 0, n = len(raw)
    cdef int c
    while i < n:
        c = raw[i]
        if c == 92 and i + 1 < n and raw[i + 1] in specials:
            out.append(raw[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


cdef list _split_unescaped(bytes raw, int sep):
    """raw split at every `sep` byte not preceded by a backslash escape."""
    cdef list parts = []
    cdef Py_ssize_t i = 0, start = 0, n = len(raw)
    while i < n:
        if raw[i] == 92:
            i += 2
            continue
        if raw[i] == sep:
            parts.append(raw[start:i])
            start = i + 1
        i += 1
    parts.append(raw[start:])
    return parts


def parse_series(bytes key):
    """(table, ((tag key, tag value bytes), ...) sorted by key) of a series key as written
    (measurement[,k=v...], escapes included), or a one-line reason (str)."""
    cdef list parts = _split_unescaped(key, 44)
    cdef list tags = []
    cdef set seen = set()
    meas = _unescape(parts[0], b", ")
    if not meas:
        return "missing measurement"
    for raw in parts[1:]:
        kv = _split_unescaped(raw, 61)
        if len(kv) != 2 or not kv[0]:
            return f"tag {raw.decode('utf-8', 'replace')[:40]!r}: missing tag key or '='"
        if not kv[1]:
            return f"tag {kv[0].decode('utf-8', 'replace')[:40]!r}: missing tag value"
        k = _unescape(kv[0], b",= ").decode("utf-8")
        if _COLUMN_RE.fullmatch(k) is None or k == "ts":
            return (f"tag key {k[:40]!r} does not match [A-Za-z][A-Za-z0-9_]{{0,63}}, not"
                    f" 'ts' (it becomes a column)")
        if k in seen:
            return f"duplicate tag {k!r}"
        seen.add(k)
        tags.append((k, _unescape(kv[1], b",= ")))
    tags.sort()
    m = meas.decode("utf-8")
    return table_of_series(m, [(k, v.decode("utf-8")) for k, v in tags]), tuple(tags)


_SERIES = {}


cdef object _series_of(bytes key):
    """parse_series, remembered (the same series comes again and again)."""
    cdef PyObject* q = PyDict_GetItem(_SERIES, key)
    if q is not NULL:
        return <object>q
    r = parse_series(key)
    if len(_SERIES) >= SERIES_CACHE_MAX:
        _SERIES.clear()
    _SERIES[key] = r
    return r


cdef class _BSeries:
    """One series within one batch: its table's log, schema and tag columns."""
    cdef TableLog log
    cdef object table
    cdef object known              # the table's known columns (dict)
    cdef object new_cols           # the batch's new columns of the table (dict) or None
    cdef list cols                 # tag Columns
    cdef list vals                 # tag values (bytes)
    cdef Py_ssize_t tag_bytes      # estimated bytes of the tags in a row
    cdef Py_ssize_t name_len


cdef inline bint _lp_end(unsigned char c) noexcept:
    return c == 10 or c == 13


cdef inline bint _is_digit(unsigned char c) noexcept:
    return 48 <= c <= 57


class _LpError(Exception):
    """A line refused (its reason); only parse_lines raises and catches it."""


cdef int _fail(str reason) except -1:
    raise _LpError(reason)


cdef str _text(const unsigned char* s, Py_ssize_t n):
    """Up to 40 characters of s[:n] for a reason."""
    return repr(PyUnicode_DecodeUTF8(<const char*>s, min(n, 160), "replace")[:40])


cdef int _number(const unsigned char* p, Py_ssize_t v0, Py_ssize_t v1, long long* iv,
                 double* dv) except -1:
    """A non-string, non-boolean field value p[v0:v1]: 0 for a float (*dv), 1 for an int
    (*iv: `12i`, or `12u` within int64)."""
    cdef Py_ssize_t j = v0, digits = 0, m = v1 - v0
    cdef unsigned char last = p[v1 - 1]
    cdef char numbuf[LP_MAX_FIELD_CHARS + 1]
    cdef char* endp
    if last == 105 or last == 117:                       # 12i, 12u
        if p[j] == 45 and last == 105:
            j += 1
        if j >= v1 - 1:
            _fail(f"invalid field value {_text(p + v0, m)}")
        while j < v1 - 1:
            if not _is_digit(p[j]):
                _fail(f"invalid field value {_text(p + v0, m)}")
            j += 1
        if _parse_int(p + v0, v1 - 1 - v0, iv) < 0:
            if last == 117:
                _fail("unsigned field value above 9223372036854775807 (an unsigned field is"
                      " stored as int64)")
            _fail("integer field value out of the int64 range")
        return 1
    if m > LP_MAX_FIELD_CHARS:
        _fail(f"invalid field value {_text(p + v0, m)} (a number of more than"
              f" {LP_MAX_FIELD_CHARS} characters)")
    if p[j] == 45 or p[j] == 43:
        j += 1
    while j < v1 and _is_digit(p[j]):
        j += 1
        digits += 1
    if j < v1 and p[j] == 46:
        j += 1
        while j < v1 and _is_digit(p[j]):
            j += 1
            digits += 1
    if digits and j < v1 and (p[j] == 101 or p[j] == 69):
        j += 1
        if j < v1 and (p[j] == 43 or p[j] == 45):
            j += 1
        if j >= v1 or not _is_digit(p[j]):
            digits = 0
        while j < v1 and _is_digit(p[j]):
            j += 1
    if digits == 0 or j != v1:
        _fail(f"invalid field value {_text(p + v0, m)} (not a number, a string or a boolean)")
    memcpy(numbuf, p + v0, m)
    numbuf[m] = 0
    dv[0] = PyOS_string_to_double(numbuf, &endp, NULL)
    if endp != numbuf + m or not isfinite(dv[0]):
        _fail(f"float field value {_text(p + v0, m)} is not finite")
    return 0


cdef inline int _bool_word(const unsigned char* s, Py_ssize_t m) noexcept:
    """1 / 0 for InfluxDB's boolean spellings, -1 for anything else."""
    if m == 1:
        if s[0] == 116 or s[0] == 84:
            return 1
        if s[0] == 102 or s[0] == 70:
            return 0
    elif m == 4:
        if memcmp(s, b"true", 4) == 0 or memcmp(s, b"True", 4) == 0 or memcmp(s, b"TRUE", 4) == 0:
            return 1
    elif m == 5:
        if memcmp(s, b"false", 5) == 0 or memcmp(s, b"False", 5) == 0 \
                or memcmp(s, b"FALSE", 5) == 0:
            return 0
    return -1


cdef _BSeries _new_series(bytes keyb, dict tables, dict added, dict sch, bint limits,
                          Py_ssize_t tcount, Py_ssize_t max_tables, Py_ssize_t max_columns,
                          Py_ssize_t* new_tables):
    """A series first seen in this batch: its table (created on first use), the table's
    schema, and its tag columns (strings; a tag is a column of its table)."""
    cdef _BSeries bs = _BSeries()
    cdef PyObject* q
    cdef Column col
    r = _series_of(keyb)
    if type(r) is str:
        _fail(r)
    bs.table = r[0]
    known = table_known(sch, added, bs.table, limits, tcount, max_tables, new_tables)
    if known is None:
        _fail(f"table {bs.table!r} would exceed max_tables {max_tables}")
    bs.known = known
    q = PyDict_GetItem(added, bs.table)
    bs.new_cols = <object>q if q is not NULL else None
    bs.log = _log_of(tables, bs.table)
    bs.name_len = len(bs.table)
    bs.cols = []
    bs.vals = []
    bs.tag_bytes = 0
    for tk, tv in r[1]:
        q = PyDict_GetItem(bs.log.columns, tk)
        if q is NULL:
            q = PyDict_GetItem(<dict>known, tk)
            if q is NULL and bs.new_cols is not None:
                q = PyDict_GetItem(<dict>bs.new_cols, tk)
            if q is NULL:
                if bs.new_cols is None:
                    bs.new_cols = {}
                    added[bs.table] = bs.new_cols
                if limits and len(<dict>known) + len(<dict>bs.new_cols) + 1 > max_columns:
                    _fail(f"table {bs.table!r} would have more than max_columns_per_table"
                          f" {max_columns} columns")
                bs.new_cols[tk] = T_STR
            elif <object>q != T_STR:
                _fail(f"column {tk!r} of table {bs.table!r} is {<object>q}, got str (a tag;"
                      " a column's type cannot change)")
            col = Column(tk, K_STR)
            bs.log.columns[tk] = col
        else:
            col = <Column>q
            if col.kind != K_STR:
                _fail(f"column {tk!r} of table {bs.table!r} is not str, got a tag")
        bs.cols.append(col)
        bs.vals.append(tv)
        bs.tag_bytes += len(tk) + len(tv)
    return bs


def parse_lines(object body, object schemas, bint limits, long long ts_lo, long long ts_hi,
                Py_ssize_t max_rows, Py_ssize_t max_row_bytes, Py_ssize_t max_batch_bytes,
                Py_ssize_t max_columns, Py_ssize_t max_tables, object table_count,
                int unit, int vunit, long long default_ts, Py_ssize_t max_line_bytes):
    """A body of line protocol as (Staged, None, 0, 0), or (None, reason, line number,
    offset of that line) for the first line refused (the whole body is refused).

    `unit`/`vunit`: the timestamps' unit and the vnode's (UNIT_* codes); `default_ts`
    (in the vnode's unit) is the ts of a line without one. Limit arguments as parse_batch;
    `max_line_bytes` (0: none) bounds one line's bytes. `limits` False (a payload read back
    from the WAL) checks the shape and the schemas' types only."""
    cdef const unsigned char[::1] view
    cdef const unsigned char* p
    cdef const unsigned char* sp = NULL
    cdef Py_ssize_t n, i = 0, j, ls = 0, line = 1, start_line = 1
    cdef Py_ssize_t s0, s1, k0, k1, v0, v1, nf, row, size, total = 0, nrows = 0, slen = 0
    cdef Py_ssize_t new_tables = 0, m, prev_len = -1, prev_s0 = 0
    cdef Py_ssize_t tcount = -1 if table_count is None else table_count
    cdef dict sch = schemas if type(schemas) is dict else None
    cdef dict tables = {}, added = {}, batch_series = {}
    cdef Staged st
    cdef _BSeries bs = None
    cdef TableLog log
    cdef Column col
    cdef PyObject* q
    cdef bint has_esc, escaped_key
    cdef unsigned char c
    cdef long long iv = 0, ts = 0, raw_ts = 0
    cdef double dv = 0
    cdef int b
    cdef object vtype, colname, ctype, keyb
    cdef _Buf scratch = _Buf()
    if unit < 0 or unit >= UNIT_COUNT or vunit < 0 or vunit >= UNIT_COUNT:
        return None, f"unknown timestamp unit code {unit}", 0, 0
    if schemas is not None and sch is None:
        return None, "schemas must be a dict", 0, 0
    view = memoryview(body).cast("B")
    n = view.shape[0]
    if n == 0:
        return None, "no points: the body is empty", 1, 0
    p = &view[0]
    j = utf8_invalid_at(p, n)
    if j >= 0:
        for m in range(j):
            if p[m] == 10:
                line += 1
                ls = m + 1
        return None, f"not UTF-8 (byte {j} of the body)", line, ls
    try:
        while i < n:
            # -- a line: blank lines and comments hold no point
            ls = i
            start_line = line
            while i < n and (p[i] == 32 or p[i] == 9):
                i += 1
            if i >= n:
                break
            if _lp_end(p[i]):
                if p[i] == 10:
                    line += 1
                i += 1
                continue
            if p[i] == 35:                                      # '#': a comment
                while i < n and p[i] != 10:
                    i += 1
                continue
            # -- the series key: measurement[,tag=value...] up to an unescaped space
            s0 = i
            while i < n:
                c = p[i]
                if c == 92:
                    if i + 1 >= n or _lp_end(p[i + 1]):
                        _fail("bad escape: a backslash at the end of the line")
                    i += 2
                    continue
                if c == 32 or _lp_end(c):
                    break
                i += 1
            s1 = i
            if p[s0] == 44:
                _fail("missing measurement")
            if i >= n or p[i] != 32:
                _fail("missing fields (a point needs at least one field)")
            # the series: the previous line's (the same bytes), this batch's, or a new one
            if not (s1 - s0 == prev_len and memcmp(p + s0, p + prev_s0, prev_len) == 0):
                keyb = PyBytes_FromStringAndSize(<const char*>p + s0, s1 - s0)
                q = PyDict_GetItem(batch_series, keyb)
                if q is not NULL:
                    bs = <_BSeries>q
                else:
                    bs = _new_series(keyb, tables, added, sch, limits, tcount, max_tables,
                                     max_columns, &new_tables)
                    batch_series[keyb] = bs
                prev_s0 = s0
                prev_len = s1 - s0
            log = bs.log
            row = log.n
            for m in range(len(bs.cols)):
                keyb = <bytes>bs.vals[m]
                (<Column>bs.cols[m])._put_utf8(row, <const unsigned char*>PyBytes_AS_STRING(keyb),
                                               PyBytes_GET_SIZE(keyb))
            size = ROW_OVERHEAD_BYTES + bs.name_len + bs.tag_bytes
            # -- the fields: key=value[,key=value...]
            while i < n and p[i] == 32:
                i += 1
            nf = 0
            while True:
                k0 = i
                escaped_key = False
                while i < n:
                    c = p[i]
                    if c == 92:
                        if i + 1 >= n or _lp_end(p[i + 1]):
                            _fail("bad escape: a backslash at the end of the line")
                        escaped_key = True
                        i += 2
                        continue
                    if c == 61 or c == 44 or c == 32 or _lp_end(c):
                        break
                    i += 1
                k1 = i
                if k1 == k0:
                    _fail("missing field key")
                if i >= n or p[i] != 61:
                    _fail(f"field {_text(p + k0, k1 - k0)}: missing '=' and value")
                i += 1
                if escaped_key or not _name_ok(p + k0, k1 - k0, False):
                    _fail(f"field key {_text(p + k0, k1 - k0)} does not match"
                          " [A-Za-z][A-Za-z0-9_]{0,63}, not 'ts' (it becomes a column)")
                size += k1 - k0
                if i >= n or p[i] == 32 or p[i] == 44 or _lp_end(p[i]):
                    _fail(f"field {_text(p + k0, k1 - k0)}: missing value")
                if p[i] == 34:                                  # a string
                    v0 = i + 1
                    j = v0
                    has_esc = False
                    while j < n:
                        c = p[j]
                        if c == 92 and j + 1 < n and (p[j + 1] == 34 or p[j + 1] == 92):
                            has_esc = True
                            j += 2
                            continue
                        if c == 34:
                            break
                        if c == 10:
                            line += 1
                        j += 1
                    if j >= n:
                        _fail(f"field {_text(p + k0, k1 - k0)}: unterminated string (no"
                              " closing '\"')")
                    v1 = j
                    i = j + 1
                    vtype = T_STR
                    if has_esc:
                        scratch.size = 0
                        scratch.reserve(v1 - v0)
                        slen = 0
                        j = v0
                        while j < v1:
                            if p[j] == 92 and (p[j + 1] == 34 or p[j + 1] == 92):
                                j += 1
                            (<unsigned char*>scratch.ptr)[slen] = p[j]
                            slen += 1
                            j += 1
                        sp = <const unsigned char*>scratch.ptr
                    else:
                        sp = p + v0
                        slen = v1 - v0
                    size += slen
                else:
                    v0 = i
                    while i < n:
                        c = p[i]
                        if c == 44 or c == 32 or _lp_end(c):
                            break
                        i += 1
                    v1 = i
                    b = _bool_word(p + v0, v1 - v0)
                    if b >= 0:
                        vtype = T_BOOL
                        iv = b
                        size += 1
                    elif _number(p, v0, v1, &iv, &dv):
                        vtype = T_INT
                        size += VALUE_FIXED_BYTES
                    else:
                        vtype = T_FLOAT
                        size += VALUE_FIXED_BYTES
                # the column: at this position in the table's previous row, else by name
                col = None
                if nf < len(log.order) and (<Column>log.order[nf]).same_name(p + k0, k1 - k0):
                    col = <Column>log.order[nf]
                else:
                    colname = PyUnicode_DecodeUTF8(<const char*>p + k0, k1 - k0, NULL)
                    q = PyDict_GetItem(log.columns, colname)
                    if q is not NULL:
                        col = <Column>q
                if col is not None:
                    if col.n > row:
                        if col in bs.cols:
                            _fail(f"{col.name!r} is both a tag and a field")
                        _fail(f"duplicate field {col.name!r}")
                    if not _kind_accepts(col.kind, vtype):
                        _fail(f"field {col.name!r}: column of table {bs.table!r} is"
                              f" {('int', 'float', 'bool', 'str')[col.kind]}, got {vtype} (a"
                              " column's type cannot change)")
                else:
                    q = PyDict_GetItem(<dict>bs.known, colname)
                    if q is NULL and bs.new_cols is not None:
                        q = PyDict_GetItem(<dict>bs.new_cols, colname)
                    if q is NULL:
                        if bs.new_cols is None:
                            bs.new_cols = {}
                            added[bs.table] = bs.new_cols
                        if limits and len(<dict>bs.known) + len(<dict>bs.new_cols) + 1 > max_columns:
                            _fail(f"table {bs.table!r} would have more than"
                                  f" max_columns_per_table {max_columns} columns")
                        bs.new_cols[colname] = vtype
                        ctype = vtype
                    else:
                        ctype = <object>q
                        if not _type_accepts(ctype, vtype):
                            _fail(f"field {colname!r}: column of table {bs.table!r} is {ctype},"
                                  f" got {vtype} (a column's type cannot change)")
                    col = Column(colname, KIND_OF_TYPE[ctype])
                    log.columns[colname] = col
                if vtype is T_STR:
                    col._put_utf8(row, sp, slen)
                elif col.kind == K_FLOAT:
                    col._put_double(row, dv if vtype is T_FLOAT else <double>iv)
                else:
                    col._put_int(row, iv)
                if nf >= len(log.order):
                    log.order.append(col)
                elif log.order[nf] is not col:
                    log.order[nf] = col
                nf += 1
                if i < n and p[i] == 44:
                    i += 1
                    continue
                break
            # -- the timestamp (optional), then the end of the line
            while i < n and (p[i] == 32 or p[i] == 9):
                i += 1
            if i < n and not _lp_end(p[i]):
                v0 = i
                if p[i] == 45:
                    i += 1
                while i < n and _is_digit(p[i]):
                    i += 1
                if i == v0 or (i == v0 + 1 and p[v0] == 45) or (
                        i < n and not (p[i] == 32 or p[i] == 9 or _lp_end(p[i]))):
                    _fail("invalid timestamp (an integer in the request's precision)")
                if _parse_int(p + v0, i - v0, &raw_ts) < 0:
                    _fail("timestamp out of the int64 range")
                if convert_ts(raw_ts, unit, vunit, &ts) < 0:
                    _fail(f"timestamp {raw_ts} is out of range once converted to the vnode's"
                          " precision")
                while i < n and (p[i] == 32 or p[i] == 9):
                    i += 1
                if i < n and not _lp_end(p[i]):
                    _fail("unexpected text after the timestamp")
            else:
                ts = default_ts
            if i < n and p[i] == 13:
                i += 1
                if i < n and p[i] != 10:
                    _fail("a carriage return inside a line")
            if i < n:                                           # the '\n'
                i += 1
                line += 1
            if max_line_bytes and i - ls > max_line_bytes + 1:
                _fail(f"line of {i - ls} bytes, above max_line_bytes {max_line_bytes}")
            if limits:
                if ts < ts_lo or ts > ts_hi:
                    _fail(f"timestamp {ts} (in the vnode's precision) is outside"
                          f" [{ts_lo}, {ts_hi}]")
                if size > max_row_bytes:
                    _fail(f"about {size} bytes, above max_row_bytes {max_row_bytes}")
                total += size
                if total > max_batch_bytes:
                    _fail(f"the batch is above max_batch_bytes {max_batch_bytes}")
                if nrows + 1 > max_rows:
                    _fail(f"more than max_rows_per_batch {max_rows} points")
            else:
                total += size
            log._append_key(ts)
            nrows += 1
    except _LpError as exc:
        return None, str(exc), start_line, ls
    if nrows == 0:
        return None, "no points (only blank lines or comments)", 1, 0
    st = Staged()
    st.tables = tables
    st.added = added
    st.rows = nrows
    st.nbytes = total
    return st, None, 0, 0

# Contract of the row-batch validator's fast path (rows.pyx), shared with memcols.pyx
# (parse_batch), so both apply one rule for a batch's tables.

cdef object table_known(dict schemas, dict added, object table, bint limits,
                        Py_ssize_t table_count, Py_ssize_t max_tables,
                        Py_ssize_t* new_tables)

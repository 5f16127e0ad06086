# Contract of record scanning (record.pyx): the index of a buffer of records laid out as
# frame.pxd says; the arrays are numpy arrays, one entry per whole, valid record.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef class ScanResult:
    cdef readonly object versions
    cdef readonly object epochs
    cdef readonly object offsets
    cdef readonly object lengths
    cdef readonly object msg_types
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t end
    cdef readonly int status
    cdef readonly object reason

cdef ScanResult scan_buffer(const uint8_t *base, Py_ssize_t start, Py_ssize_t stop,
                            uint32_t max_payload_len, bint verify_payload,
                            uint64_t expect_version, bint contiguous=*)

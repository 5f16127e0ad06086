# Contract of the pending-forward window (window.pyx): the master's versions waiting for
# confirmation, kept as ranges so a batch of forwards costs one entry, not one per record.
from libc.stdint cimport uint64_t, int64_t

cdef struct Span:
    uint64_t first
    uint64_t last
    int64_t deadline_tick

cdef class PendingWindow:
    cdef Span *_spans           # ring buffer of spans, oldest at _head
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _head
    cdef Py_ssize_t _count      # spans in the ring
    cdef uint64_t _pending      # versions in all spans
    cdef uint64_t *_acked       # highest acked version per member
    cdef readonly int members
    cdef readonly int self_member
    cdef readonly int slave_acks_needed
    cdef readonly uint64_t limit
    cdef uint64_t _confirm_point(self)
    cdef int _grow(self) except -1
    cdef object _pop_through(self, uint64_t point)
    cdef uint64_t _needed_point(self)

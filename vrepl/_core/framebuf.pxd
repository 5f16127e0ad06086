# Contract of the frame buffer: fed bytes from a socket, hands back whole records.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef class FrameBuffer:
    cdef bytearray _storage
    cdef uint8_t *_base
    cdef Py_ssize_t _read_pos
    cdef Py_ssize_t _write_pos
    cdef readonly uint32_t max_payload_len
    cdef readonly uint64_t consumed_bytes      # bytes handed out as frames so far
    cdef Py_ssize_t _ensure_room(self, Py_ssize_t extra) except -1
    cdef Py_ssize_t _frame_len(self) except -2

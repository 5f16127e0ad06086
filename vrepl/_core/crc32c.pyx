# cython: language_level=3
"""CRC-32C (Castagnoli) for Python callers.

Owns: the Python face of the C checksum (csrc/crc32c_impl.c) and the run-time choice between the
hardware instruction (SSE4.2 / ARMv8 CRC) and slicing-by-8. Does no I/O. Large buffers are
checksummed with the GIL released so other threads (the transport, a WAL flusher) keep running.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint32_t

vrepl_crc32c_init()


def crc32c(data, uint32_t value=0):
    """CRC-32C of a bytes-like object, continuing from `value` (0 starts a new checksum)."""
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len >= NOGIL_THRESHOLD_BYTES:
            with nogil:
                out = vrepl_crc32c(value, view.buf, <size_t>view.len)
        else:
            out = vrepl_crc32c(value, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def crc32c_software(data, uint32_t value=0):
    """The same checksum through the portable slicing-by-8 path (for tests and benchmarks)."""
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = vrepl_crc32c_sw(value, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def implementation():
    """Name of the implementation this process uses: 'sse4.2', 'armv8-crc' or 'slicing-by-8'."""
    return vrepl_crc32c_impl_name().decode()


def force_software(bint on):
    """Make this module's crc32c() use slicing-by-8 (True) or the best available (False).

    Affects only this module; set VREPL_CRC32C=software before import to force it everywhere.
    """
    vrepl_crc32c_force_software(on)

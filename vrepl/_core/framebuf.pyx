# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Frame buffer: accumulates bytes from a stream and returns whole, verified records.

Owns: reassembly of records (frame.pxd layout) split across reads. Never raises for partial
input: a frame that is not complete yet is simply not returned. Raises FrameError for bytes
that can never become a valid frame (bad signature, header checksum, oversize length, payload
checksum), naming the stream offset, so the connection owner can close the connection.
Does no I/O; the transport feeds it (or recv_into()s its writable() view).
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove

from vrepl._core.crc32c cimport vrepl_crc32c, vrepl_crc32c_init
from vrepl._core.frame cimport (Header, parse_header, HEADER_SIZE, SCAN_OK, SCAN_INCOMPLETE,
                                 SCAN_BAD_PAYLOAD_CRC, Record)
from vrepl._core.frame import REASONS, DEFAULT_MAX_PAYLOAD_BYTES
# take_block() indexes its block with the WAL's scan (numpy arrays): a sync client that only
# frames records on its connection (`vrepl ship`, a restore client) uses the frame codec
# directly and never loads this module (vrepl/transport/handshake.py does not need it).
from vrepl._core.record cimport ScanResult, scan_buffer

from vrepl.errors import FrameError

vrepl_crc32c_init()


cdef class FrameBuffer:
    """feed() bytes, then next_frame() / take_frames() / take_block() until they return nothing."""

    def __cinit__(self, uint32_t max_payload_len=DEFAULT_MAX_PAYLOAD_BYTES,
                  Py_ssize_t initial_bytes=65536):
        self._storage = bytearray(max(initial_bytes, HEADER_SIZE))
        self._base = <uint8_t *>(<char *>self._storage)
        self._read_pos = 0
        self._write_pos = 0
        self.max_payload_len = max_payload_len
        self.consumed_bytes = 0

    @property
    def buffered(self):
        """Bytes fed but not yet returned as frames."""
        return self._write_pos - self._read_pos

    cdef Py_ssize_t _ensure_room(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t pending = self._write_pos - self._read_pos
        cdef Py_ssize_t cap = len(self._storage)
        if cap - self._write_pos >= extra:
            return 0
        if pending + extra <= cap:
            # Safe even with a writable() view alive: its contract is "recv_into, then
            # wrote()", with no other call in between.
            memmove(self._base, self._base + self._read_pos, pending)
        else:
            # A new bytearray rather than a resize: a memoryview handed out by writable()
            # may still be alive, and a bytearray with exports cannot be resized.
            new_cap = cap
            while new_cap < pending + extra:
                new_cap *= 2
            storage = bytearray(new_cap)
            memcpy(<char *>storage, self._base + self._read_pos, pending)
            self._storage = storage
            self._base = <uint8_t *>(<char *>self._storage)
        self._read_pos = 0
        self._write_pos = pending
        return 0

    def feed(self, data):
        """Append bytes received from the stream."""
        cdef Py_buffer view
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if view.len:
                self._ensure_room(view.len)
                memcpy(self._base + self._write_pos, view.buf, view.len)
                self._write_pos += view.len
        finally:
            PyBuffer_Release(&view)

    def writable(self, Py_ssize_t min_bytes=65536):
        """A memoryview of free space to recv_into(); call wrote(n) afterwards."""
        self._ensure_room(min_bytes)
        return memoryview(self._storage)[self._write_pos:]

    def wrote(self, Py_ssize_t n):
        """Account for n bytes placed into the last writable() view."""
        if n < 0 or self._write_pos + n > len(self._storage):
            raise ValueError(f"wrote({n}) beyond the writable space")
        self._write_pos += n

    cdef Py_ssize_t _frame_len(self) except -2:
        """Length of the complete frame at the read position, -1 if incomplete."""
        cdef Header h
        cdef Py_ssize_t pending = self._write_pos - self._read_pos
        cdef const uint8_t *p = self._base + self._read_pos
        cdef int status
        if pending < HEADER_SIZE:
            return -1
        status = parse_header(p, self.max_payload_len, &h)
        if status != SCAN_OK:
            raise FrameError(REASONS[status], offset=self.consumed_bytes)
        if pending - HEADER_SIZE < <Py_ssize_t>h.payload_len:
            return -1
        if vrepl_crc32c(0, p + HEADER_SIZE, h.payload_len) != h.payload_crc:
            raise FrameError(REASONS[SCAN_BAD_PAYLOAD_CRC], offset=self.consumed_bytes)
        return HEADER_SIZE + h.payload_len

    def has_frame(self):
        """True when a whole frame is buffered (FrameError if the bytes can never be one)."""
        return self._frame_len() >= 0

    def next_frame(self):
        """The next whole frame as a Record, or None when more bytes are needed."""
        cdef Py_ssize_t n = self._frame_len()
        cdef Header h
        if n < 0:
            return None
        cdef const uint8_t *p = self._base + self._read_pos
        parse_header(p, self.max_payload_len, &h)
        rec = Record(h.msg_type, h.version, h.epoch,
                     PyBytes_FromStringAndSize(<const char *>p + HEADER_SIZE, h.payload_len),
                     h.schema_version, h.flags)
        self._read_pos += n
        self.consumed_bytes += n
        return rec

    def next_raw(self):
        """The next whole frame as its encoded bytes (header + payload), or None."""
        cdef Py_ssize_t n = self._frame_len()
        if n < 0:
            return None
        raw = PyBytes_FromStringAndSize(<const char *>self._base + self._read_pos, n)
        self._read_pos += n
        self.consumed_bytes += n
        return raw

    def take_frames(self, Py_ssize_t max_frames=-1):
        """All whole frames buffered (at most max_frames if >= 0), as a list of Records."""
        out = []
        while max_frames < 0 or len(out) < max_frames:
            rec = self.next_frame()
            if rec is None:
                break
            out.append(rec)
        return out

    def take_block(self):
        """All whole frames as one bytes block plus a ScanResult indexing it (offsets into
        the block), or None. A slave appends such a block to its WAL as it is."""
        cdef ScanResult r = scan_buffer(self._base, self._read_pos, self._write_pos,
                                        self.max_payload_len, True, 0)
        cdef Py_ssize_t start = self._read_pos
        if r.status != SCAN_OK and r.status != SCAN_INCOMPLETE:
            # Hand out the good frames first; the bad bytes raise on the next call.
            if r.count == 0:
                raise FrameError(r.reason, offset=self.consumed_bytes)
        if r.count == 0:
            return None
        block = PyBytes_FromStringAndSize(<const char *>self._base + start, r.end - start)
        r.offsets[:] -= start
        self._read_pos = r.end
        self.consumed_bytes += r.end - start
        r.end -= start
        r.status = SCAN_OK
        r.reason = None
        return block, r

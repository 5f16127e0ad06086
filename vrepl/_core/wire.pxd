# Contract of the wire helpers (wire.pyx): the Forward/ForwardBatch frame body, which is a
# u64 prev_epoch followed by WAL records exactly as the WAL stores them (frame.pxd layout).
cdef enum:
    FORWARD_PREFIX_SIZE = 8     # u64 prev_epoch before the records
    DATA_TYPE_MIN = 1           # WAL data record types (application records) are 1..15
    DATA_TYPE_MAX = 15

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The master's pending-forward window (docs/design.md §4.1), in C.

Owns: which versions wait for confirmation (as contiguous spans with one deadline each, so a
batch of forwards is one entry), the highest cumulative ack of every member, and the rule
that confirms a version: the master's own WAL is durable up to it AND `slave_acks_needed`
other members acked it. Versions are added in order and acks are cumulative, so what gets
confirmed (or expires) is always a prefix, returned as one (first, last) range.
Must not: do I/O, read a clock (ticks come from the caller) or know about roles.
`vrepl.replica.forward.PendingWindowModel` is the plain-Python reference it is tested against.
"""
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset

# A caller broke the window's contract: a vrepl bug, an InvariantViolation (vrepl/errors.py).
from vrepl.errors import WindowInvariantError


cdef inline int invariant(bint cond, str why) except -1:
    # Always on (unlike assert): the replica relies on these to catch its own bugs.
    if not cond:
        raise WindowInvariantError(why)
    return 0


cdef class PendingWindow:
    """Versions forwarded by the master and not yet confirmed, oldest first."""

    def __cinit__(self, int self_member, int slave_acks_needed, uint64_t limit, int members=64):
        self._spans = NULL
        self._acked = NULL
        invariant(slave_acks_needed >= 0, "acks needed is quorum - 1 >= 0")
        invariant(limit >= 1, "the window needs room for one forward")
        invariant(0 <= self_member < members, "self_member is a member index")
        self.members = members
        self.self_member = self_member
        self.slave_acks_needed = slave_acks_needed
        self.limit = limit
        self._cap = 16
        self._spans = <Span *>malloc(self._cap * sizeof(Span))
        self._acked = <uint64_t *>malloc(members * sizeof(uint64_t))
        if self._spans == NULL or self._acked == NULL:
            raise MemoryError()
        memset(self._acked, 0, members * sizeof(uint64_t))
        self._head = 0
        self._count = 0
        self._pending = 0

    def __dealloc__(self):
        free(self._spans)
        free(self._acked)

    def __len__(self):
        return self._pending

    def full(self, uint64_t n=1):
        """True when `n` more versions would exceed the limit (max_inflight_forwards)."""
        return self._pending + n > self.limit

    def first_version(self):
        return self._spans[self._head].first if self._count else None

    def last_version(self):
        return self._spans[(self._head + self._count - 1) % self._cap].last if self._count else None

    cdef int _grow(self) except -1:
        cdef Py_ssize_t new_cap = self._cap * 2
        cdef Span *spans = <Span *>malloc(new_cap * sizeof(Span))
        cdef Py_ssize_t i
        if spans == NULL:
            raise MemoryError()
        for i in range(self._count):
            spans[i] = self._spans[(self._head + i) % self._cap]
        free(self._spans)
        self._spans = spans
        self._cap = new_cap
        self._head = 0
        return 0

    def add(self, uint64_t version, int64_t deadline_tick):
        self.add_range(version, version, deadline_tick)

    def add_range(self, uint64_t first, uint64_t last, int64_t deadline_tick):
        """Versions first..last (the next ones) wait for confirmation until deadline_tick."""
        cdef Span *tail
        invariant(first >= 1 and last >= first, "a range of versions >= 1")
        invariant(not self.full(last - first + 1), "caller checks full() before add")
        if self._count:
            tail = &self._spans[(self._head + self._count - 1) % self._cap]
            invariant(first == tail.last + 1, "forwards are added in version order")
            invariant(deadline_tick >= tail.deadline_tick, "deadlines grow with versions")
            if tail.deadline_tick == deadline_tick:
                tail.last = last  # same tick: extend, one span per tick at most
                self._pending += last - first + 1
                return
        if self._count == self._cap:
            self._grow()
        tail = &self._spans[(self._head + self._count) % self._cap]
        tail.first = first
        tail.last = last
        tail.deadline_tick = deadline_tick
        self._count += 1
        self._pending += last - first + 1

    def acked_version(self, int member):
        invariant(0 <= member < self.members, "member index in range")
        return self._acked[member]

    def slaves_acked(self, uint64_t version):
        """How many members other than the master acked `version` or later."""
        cdef int m, k = 0
        for m in range(self.members):
            if m != self.self_member and self._acked[m] >= version:
                k += 1
        return k

    cdef uint64_t _confirm_point(self):
        # The needed-th highest ack among the other members, capped by the master's own.
        cdef uint64_t own = self._acked[self.self_member]
        cdef uint64_t best, prev_best = 0xFFFFFFFFFFFFFFFF
        cdef int m, rank, ties, need = self.slave_acks_needed
        if need == 0:
            return own
        # Walk distinct ack values from the top; small member counts make this cheap.
        rank = 0
        while True:
            best = 0
            for m in range(self.members):
                if m != self.self_member and self._acked[m] < prev_best and self._acked[m] > best:
                    best = self._acked[m]
            if best == 0:
                return 0
            ties = 0
            for m in range(self.members):
                if m != self.self_member and self._acked[m] == best:
                    ties += 1
            rank += ties
            if rank >= need:
                return own if own < best else best
            prev_best = best

    cdef object _pop_through(self, uint64_t point):
        """Remove versions <= point from the front; (first, last) removed or None."""
        cdef uint64_t first = 0, last = 0
        cdef Span *head
        while self._count:
            head = &self._spans[self._head]
            if head.first > point:
                break
            if first == 0:
                first = head.first
            if head.last <= point:
                last = head.last
                self._pending -= head.last - head.first + 1
                self._head = (self._head + 1) % self._cap
                self._count -= 1
            else:
                last = point
                self._pending -= point - head.first + 1
                head.first = point + 1
                break
        if first == 0:
            return None
        return (first, last)

    def ack(self, int member, uint64_t up_to_version):
        """Record a cumulative ack; return the (first, last) versions it confirms, or None."""
        invariant(0 <= member < self.members, "member index in range")
        if up_to_version <= self._acked[member]:
            return None  # late or repeated: cumulative, nothing new
        self._acked[member] = up_to_version
        return self._pop_through(self._confirm_point())

    def expire(self, int64_t now_tick):
        """Remove and return the (first, last) versions whose deadline passed, or None."""
        cdef uint64_t point = 0
        cdef Py_ssize_t i
        cdef Span *s
        for i in range(self._count):
            s = &self._spans[(self._head + i) % self._cap]
            if s.deadline_tick > now_tick:
                break
            point = s.last
        if point == 0:
            return None
        return self._pop_through(point)

    def clear(self):
        """Remove and return every pending version as (first, last), or None."""
        if not self._count:
            return None
        return self._pop_through(self._spans[(self._head + self._count - 1) % self._cap].last)

    def set_slave_acks_needed(self, int needed):
        """Quorum changed (reconfig): returns the (first, last) this confirms now, or None."""
        invariant(0 <= needed < self.members, "acks needed is quorum - 1")
        self.slave_acks_needed = needed
        return self._pop_through(self._confirm_point())

    def minority_first(self, uint64_t first, uint64_t last):
        """The lowest version in first..last that some but fewer than the needed members
        acked (a minority write, seed 少数虚拟节点写入成功的问题), or 0."""
        cdef uint64_t v = first, top = 0
        cdef int m
        if self.slave_acks_needed == 0:
            return 0
        for m in range(self.members):
            if m != self.self_member and self._acked[m] > top:
                top = self._acked[m]
        # slaves_acked(v) does not grow with v: versions above the needed-th highest ack
        # have fewer than needed acks; those at or below `top` have at least one.
        if self._needed_point() + 1 > v:
            v = self._needed_point() + 1
        if v <= last and v <= top:
            return v
        return 0

    cdef uint64_t _needed_point(self):
        # Highest version acked by at least slave_acks_needed other members (0 if none).
        cdef uint64_t saved = self._acked[self.self_member]
        cdef uint64_t p
        self._acked[self.self_member] = 0xFFFFFFFFFFFFFFFF
        p = self._confirm_point()
        self._acked[self.self_member] = saved
        return p

    def describe(self):
        spans = []
        cdef Py_ssize_t i
        cdef Span *s
        for i in range(self._count):
            s = &self._spans[(self._head + i) % self._cap]
            spans.append(f"v{s.first}..v{s.last}@t{s.deadline_tick}")
        return f"window {self._pending} pending [{' '.join(spans)}]"

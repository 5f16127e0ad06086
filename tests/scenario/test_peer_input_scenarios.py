"""Scenario tests: a peer's message never trips an invariant of the core (issue 14, Deliver 9).

Each test steps real Replica objects through exact events and checks the exact actions: a
message that contradicts what the follower matched with its master is refused with a logged
reason, the connection is reset and the follower is unsynced (docs/design.md §4.3), its log
untouched; after it reconnects it matches from scratch. Before the fix each of these raised
InvariantViolation inside the event loop; so did a TruncateRequest that cuts committed
records, now refused at ERROR (docs/design.md §4.4).
"""

from __future__ import annotations

from vrepl.replica import (
    CUTS_COMMITTED_RECORDS,
    AppAcked,
    Commit,
    Config,
    Forward,
    ForwardBatch,
    Heartbeat,
    Log,
    LogRebased,
    PeerConnected,
    Received,
    Replica,
    RestoreBegun,
    RestoredRecords,
    RestoreEnded,
    Role,
    Send,
    SyncRequest,
    SyncStart,
    TruncateRequest,
    WalPersisted,
)


def describe(actions) -> list[str]:
    return [a.describe() for a in actions]


def sent(actions, kind):
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, kind)]


def master_and_follower() -> tuple[Replica, Replica]:
    """n1: master of (n1, n2) with the log e1 v1..v10; n2: an empty follower, syncing."""
    m = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=0, last_epoch=1, last_version=10,
                       epoch_history=((1, 1),), promised_epoch=2, promised_master=1))
    f = Replica(Config(vgroup_id=1, replicas=(1, 2), self_index=1, promised_epoch=2, promised_master=1))
    m.start()
    f.start()
    m.step(PeerConnected(2))
    f.step(PeerConnected(1))
    for _ in range(3):
        m.step(Received(2, Heartbeat(f.view())))
        m.tick()
        f.step(Received(1, Heartbeat(m.view())))
    assert (m.role, f.role) == (Role.MASTER, Role.SYNCING)
    return m, f


def start_restore(m: Replica, f: Replica) -> int:
    e = m.promised_epoch
    acts = m.step(Received(2, SyncRequest(e, 0, 0)))
    f.step(Received(1, sent(acts, SyncStart)[0]))
    f.step(RestoreBegun(1, e))
    assert f.restoring
    return e


def test_truncate_below_records_the_restore_stream_matched_is_refused_not_an_invariant():
    m, f = master_and_follower()
    e = start_restore(m, f)  # e3: a promise to itself read from disk is never reused
    assert e == 3
    # The restore stream feeds v1..v10 in e3, which the master's own log holds in e1 (its
    # WAL and its replica disagree, or a peer that holds the secret lies).
    f.step(RestoredRecords(1, ForwardBatch(e, 1, 0, (e,) * 10, tuple(b"r%d" % v for v in range(1, 11)))))
    assert (f.last_version, f.matched_version) == (10, 10)
    # The restore connection drops: the follower resyncs over the same peer connection.
    acts = f.step(RestoreEnded(1, False, "connection dropped"))
    assert describe(sent(acts, SyncRequest)) == ["sync_request e3 have e3v10"]
    acts = m.step(Received(2, sent(acts, SyncRequest)[0]))
    assert describe(sent(acts, TruncateRequest)) == ["truncate_request e3 keep <=e1 <=v10"]
    # The master asks to cut all ten matched records: refused, reset, unsynced, nothing cut.
    acts = f.step(Received(1, sent(acts, TruncateRequest)[0]))
    why = "refused truncate_request e3 keep <=e1 <=v10: it cuts v1..v10, which matched n1's log"
    assert describe(acts)[:6] == [
        f"log warning vg1 n2 e3: {why}",
        f"reset_connection n1 ({why})",
        "log info vg1 n2 e3: peer n1 offline: refused its messages",
        f"log info vg1 n2 e3: unsynced: {why}",
        "notify_role unsynced e3 master -",
        "log info vg1 n2 e3: election unsynced e3: 1 of 2 online, arbitrator 0 views"
        " [n1=offline e1v10 p3@n1, n2=unsynced e3v10 p3@n1]",
    ]
    assert not any(a.describe().startswith("truncate_wal_after") for a in acts)
    assert (f.role, f.last_version, f.truncating_to) == (Role.UNSYNCED, 10, None)
    # Reconnected, it follows again, matches from scratch and takes the master's answer.
    f.step(PeerConnected(1))
    acts = f.step(Received(1, Heartbeat(m.view())))
    assert describe(sent(acts, SyncRequest)) == ["sync_request e3 have e3v10"]
    acts = m.step(Received(2, sent(acts, SyncRequest)[0]))
    acts = f.step(Received(1, sent(acts, TruncateRequest)[0]))
    assert "truncate_wal_after v0" in describe(acts)


def test_duplicate_forward_contradicting_a_matched_record_is_refused():
    m, f = master_and_follower()
    e = start_restore(m, f)
    f.step(RestoredRecords(1, ForwardBatch(e, 1, 0, (1,) * 10, tuple(b"r%d" % v for v in range(1, 11)))))
    assert f.matched_version == 10
    # v5 again, but from e3: the master contradicts a record it matched (was an invariant).
    acts = f.step(Received(1, Forward(e, 5, 1, e, b"other")))
    assert describe(acts)[:2] == [
        "log warning vg1 n2 e3: refused forward e3 v5 prev e1 rec e3 5B: matched v5 is e1",
        "reset_connection n1 (refused forward e3 v5 prev e1 rec e3 5B: matched v5 is e1)",
    ]
    assert f.role == Role.UNSYNCED and f.last_version == 10


def test_forward_whose_record_epoch_goes_back_is_refused():
    m, f = master_and_follower()
    e = start_restore(m, f)
    f.step(RestoredRecords(1, ForwardBatch(e, 1, 0, (1,) * 9 + (e,), tuple(b"r%d" % v for v in range(1, 11)))))
    assert (f.last_epoch, f.last_version) == (e, 10)
    # v11 follows e3 (prev matches) but claims e1: epochs never go back (was an invariant of
    # the epoch history). One from beyond the master's epoch is refused the same way.
    acts = f.step(Received(1, Forward(e, 11, e, 1, b"x")))
    assert [a.describe() for a in acts if isinstance(a, Log)][0] == (
        "log warning vg1 n2 e3: refused forward e3 v11 prev e3 rec e1 1B from n1: record epoch e1 outside e3..e3")
    assert f.role == Role.UNSYNCED and f.last_version == 10
    m2, f2 = master_and_follower()
    e = start_restore(m2, f2)
    acts = f2.step(RestoredRecords(1, ForwardBatch(e, 1, 0, (1, e + 5), (b"a", b"b"))))
    assert any("record epoch e8 outside e1..e3" in a.describe() for a in acts)
    assert f2.last_version == 1 and f2.role == Role.UNSYNCED


def test_rebase_to_an_epoch_beyond_the_promise_is_refused():
    m, f = master_and_follower()
    e = start_restore(m, f)
    # WAL_BEGIN's prev epoch is the master's value: e9 is beyond the promise (was an invariant).
    acts = f.step(LogRebased(9, 8, ((9, 1),)))
    assert describe(acts) == [f"log warning vg1 n2 e{e}: refused log_rebased e9v8: epoch outside e1..e3"]
    assert f.last_version == 0 and f.restoring


def test_truncate_below_the_commit_version_is_refused_at_error_not_an_invariant():
    m, f = master_and_follower()
    e = m.promised_epoch
    acts = m.step(Received(2, SyncRequest(e, 0, 0)))
    f.step(Received(1, sent(acts, SyncStart)[0]))
    f.step(Received(1, ForwardBatch(e, 1, 0, (1,) * 10, tuple(b"r%d" % v for v in range(1, 11)))))
    f.step(WalPersisted(10))
    f.step(AppAcked(10))
    assert "commit_advanced v6" in describe(f.step(Received(1, Commit(e, 6))))
    # A master (buggy or hostile) asks to keep only v1..v4: that cuts committed v5, v6. It was
    # an invariant of the follower; now a refusal like the one for matched records, at ERROR.
    acts = f.step(Received(1, TruncateRequest(e, 1, 4)))
    why = f"refused truncate_request e{e} keep <=e1 <=v4: it cuts committed records v5..v6"
    assert CUTS_COMMITTED_RECORDS in why
    assert describe(acts)[:5] == [
        f"log error vg1 n2 e{e}: {why}",
        f"reset_connection n1 ({why})",
        f"log info vg1 n2 e{e}: peer n1 offline: refused its messages",
        f"log info vg1 n2 e{e}: unsynced: {why}",
        f"notify_role unsynced e{e} master -",
    ]
    assert not any(a.describe().startswith("truncate_wal_after") for a in acts)
    assert (f.role, f.last_version, f.commit_version, f.truncating_to) == (Role.UNSYNCED, 10, 6, None)


def test_a_cached_forward_that_the_stream_appends_after_a_rebase_leaves_no_cache_entry():
    """Simulator finding 6 (docs/simulation.md): a live forward v9 came during the restore
    (cached: ahead of the log); the files phase rebased the log on v8 (which keeps v9
    cached); the restore's WAL stream then appends v9 itself. The cached copy must go with
    it: a non-empty sync cache kept the follower syncing after the restore until it resynced."""
    m, f = master_and_follower()
    e = start_restore(m, f)
    f.step(Received(1, Forward(e, 9, 1, 1, b"r9")))  # live, ahead of the log: cached
    f.step(LogRebased(1, 8, ((1, 1),)))
    assert f.last_version == 8
    f.step(RestoredRecords(1, ForwardBatch(e, 9, 1, (1, 1), (b"r9", b"r10"))))
    assert f.last_version == 10
    f.step(WalPersisted(10))
    f.step(RestoreEnded(1, True, ""))
    assert f.role == Role.SLAVE

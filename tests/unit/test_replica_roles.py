"""Role-scoped state in the replica (docs/design.md §1, project issue 15 Deliver 4).

The master's state (master.Master) and the follower's (follower.Follower) exist only while
the replica is in that role: the `_become_*` transitions create and drop them, the role enum
always goes with the object, and a dropped object cannot change the role any more. Checked
on scripted transitions and after every step of simulated runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import vrepl.replica
from vrepl.replica import (
    Config,
    Forward,
    Heartbeat,
    InvariantViolation,
    PeerConnected,
    Received,
    Replica,
    Role,
    SyncRequest,
    SyncStart,
)
from vrepl.replica.follower import Follower
from vrepl.replica.master import Master
from vrepl.replica.role import Unsynced
from vrepl.testing.sim import make_options, run_seed

MAX_MODULE_LINES = 600


def pair() -> tuple[Replica, Replica]:
    """n1 master of (n1, n2) holding e1 v1..v10; n2 an empty follower (syncing)."""
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


def test_each_role_holds_only_its_own_state():
    m, f = pair()
    assert type(m._state) is Master and type(f._state) is Follower
    # The master has a window and peers, and nothing of a follower's.
    assert m.window is not None and set(m.peers) == {1} and m.master == 1
    assert (m.sync_started, m.matched_version, m.restoring, len(m.cache)) == (False, 0, False, 0)
    assert not hasattr(m._state, "matched_version") and not hasattr(m._state, "cache")
    # The follower has no window, no peers' progress, and follows n1.
    assert f.window is None and f.peers == {} and f.master == 1
    assert not hasattr(f._state, "window") and not hasattr(f._state, "peers")
    acts = m.step(Received(2, SyncRequest(m.promised_epoch, 0, 0)))
    f.step(Received(1, next(a.message for a in acts if isinstance(getattr(a, "message", None), SyncStart))))
    assert f.sync_started and f.role == Role.SYNCING  # streaming v1..v10 to reach the master's log end


def test_a_master_steps_down_to_a_fresh_object_and_its_window_is_gone():
    m, _ = pair()
    master = m._state
    m.tick()
    m.step(vrepl.replica.PeerDisconnected(2))
    assert m.role == Role.UNSYNCED and type(m._state) is Unsynced
    assert master.left and m.window is None and m.peers == {} and m.master == vrepl.replica.NO_NODE


def test_a_dropped_follower_object_cannot_change_the_role():
    m, f = pair()
    e = m.promised_epoch
    acts = m.step(Received(2, SyncRequest(e, 0, 0)))
    f.step(Received(1, next(a.message for a in acts if isinstance(getattr(a, "message", None), SyncStart))))
    follower = f._state
    # A forward whose record epoch is beyond the master's makes the follower refuse its master
    # and leave the role (docs/design.md §4.3); the old object is dropped.
    f.step(Received(1, Forward(e, 1, 0, e + 5, b"x")))
    assert f.role == Role.UNSYNCED and type(f._state) is Unsynced and follower.left
    with pytest.raises(InvariantViolation, match="goes with a Unsynced object"):
        follower.resync("a stale follower object")


def test_transitions_refuse_moves_the_design_rules_out():
    m, f = pair()
    with pytest.raises(InvariantViolation, match="steps down before it follows"):
        m._become_follower(2)
    with pytest.raises(InvariantViolation, match="a follower becomes unsynced"):
        m._become_unsynced("a master steps down instead")
    with pytest.raises(InvariantViolation, match="only a master steps down"):
        f._step_down("not a master")
    with pytest.raises(InvariantViolation, match="goes with a Master object"):
        m._become_slave()


@pytest.mark.parametrize("profile,replicas", [("harsh", 3), ("default", 2), ("isolation", 3)])
def test_role_and_role_object_agree_after_every_step_of_simulated_runs(monkeypatch, profile, replicas):
    checked = []

    def agree(r: Replica) -> None:
        state = r._state
        assert r.role in state.ROLES and not state.left, (r.describe(), type(state).__name__)
        assert (r.window is not None) == (r.role == Role.MASTER)
        # The attribute the app thread reads is the master's own window, never a stale one.
        assert r.window is (state.window if type(state) is Master else None)
        if r.role != Role.MASTER:
            assert r.peers == {} and r.master != r.node
        if r.role not in (Role.SLAVE, Role.SYNCING):
            assert not r.restoring and not r.sync_started and r.matched_version == 0
        checked.append(1)

    for name in ("start", "step", "tick"):
        original = getattr(Replica, name)

        def wrapped(self, *args, _original=original):
            out = _original(self, *args)
            agree(self)
            return out

        monkeypatch.setattr(Replica, name, wrapped)
    opts = make_options(profile, replicas=replicas)
    results = [run_seed(seed, opts, profile) for seed in range(6)]
    assert all(r.ok for r in results), "\n".join(r.report() for r in results if not r.ok)
    assert len(checked) > 10_000


def test_no_module_of_the_replica_package_is_over_600_lines():
    package = Path(vrepl.replica.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in package.glob("*.py")}
    assert {"replica.py", "master.py", "follower.py", "role.py", "electing.py"} <= set(sizes)
    assert max(sizes.values()) <= MAX_MODULE_LINES, sizes

"""`Config.app_acked_version` (docs/design.md §6; docs/vnode.md §9.3): a replica restarted
with a WAL longer than what its app persisted as acknowledged (a round of ingested files
whose files are not staged yet) acknowledges nothing above the app's version until the app
says so (`AppAcked`), even once the records are durable in its WAL; acks stay cumulative."""
from __future__ import annotations

import pytest

from vrepl.replica import (AppAcked, Config, Forward, Log, PeerConnected, PeerView, Received,
                           Replica, Role, Status, SyncStart, WalPersisted)
from vrepl.replica.config import config_invalid


def no_logs(actions) -> list[str]:
    return [a.describe() for a in actions if not isinstance(a, Log)]


def restarted_slave(app_acked_version: int | None) -> tuple[Replica, list[str]]:
    """n1 restarts with e1v1..v2 in its WAL and follows master n0 (e1v2); what it says when
    it becomes a slave."""
    cfg = Config(vgroup_id=1, replicas=(0, 1, 2), self_index=1, promised_epoch=1,
                 promised_master=0, last_version=2, last_epoch=1, epoch_history=((1, 1),),
                 app_acked_version=app_acked_version)
    r = Replica(cfg)
    r.start()
    r.step(PeerConnected(0))
    master = PeerView(Role.MASTER, 1, 2, 1, 0)
    r.step(Received(0, Status(0, (master, r.view(), PeerView(Role.OFFLINE, 0, 0, 0, -1)))))
    return r, no_logs(r.step(Received(0, SyncStart(1, 3, 2))))


def test_without_it_the_whole_log_is_acknowledged():
    _, out = restarted_slave(None)
    assert "send n0 forward_ack e1 v2 ok" in out


def test_nothing_above_the_apps_version_is_acknowledged_until_the_app_acks():
    r, out = restarted_slave(1)
    assert "send n0 forward_ack e1 v1 ok" in out
    assert not any("forward_ack e1 v2" in a for a in out)
    assert no_logs(r.step(Received(0, Forward(1, 3, 1, 1, b"abc")))) == [
        "persist_records e1v3 3B", "write_to_cache e1v3 3B"]
    assert no_logs(r.step(WalPersisted(3))) == []           # durable, but the app holds v2
    assert no_logs(r.step(AppAcked(2))) == ["send n0 forward_ack e1 v2 ok"]
    assert no_logs(r.step(AppAcked(3))) == ["send n0 forward_ack e1 v3 ok"]


@pytest.mark.parametrize("value, ok", [(None, True), (0, True), (5, True), (-1, False)])
def test_config_check(value, ok):
    cfg = Config(vgroup_id=1, replicas=(0, 1, 2), self_index=1, app_acked_version=value)
    assert (config_invalid(cfg) is None) == ok

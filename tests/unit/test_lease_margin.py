"""The arbitrator lease margin (docs/design.md §5): the rule, and where each side applies it.

The master counts its lease on its own clock from when it SENT the request; the arbitrator
counts on its clock from when it ANSWERED. The arbitrator's lease must be at least the
replica's x (1 + clock_drift_ratio) + lease_allowance_ms; a combination that breaks the rule
is refused at start-up where one side can know it, else per request, and a grant whose
stated lease is too short is not counted by the replica.
"""
from __future__ import annotations

import pytest

from arbitrator.main import ConfigError as ArbitratorConfigError
from arbitrator.main import load_config
from arbitrator.server import Arbitrator, ArbitratorConfig, max_backed_replica_lease_ms
from vrepl.errors import ConfigError
from vrepl.node.config import parse_config
from vrepl.replica import (
    ArbitratorConnected,
    ArbitratorGranted,
    ArbitratorRefused,
    ArbitratorRequest,
    Config,
    Log,
    Replica,
    Role,
    config_invalid,
)
from vrepl.replica.lease import (
    DEFAULT_CLOCK_DRIFT_RATIO,
    DEFAULT_LEASE_ALLOWANCE_MS,
    lease_margin_refusal,
    required_arbitrator_lease_ms,
)


@pytest.mark.parametrize(
    "replica_ms,ratio,allowance_ms,need",
    [(2000, 0.01, 400, 2420), (2000, 0.0, 0, 2000), (1000, 0.05, 100, 1150), (333, 0.01, 0, 337), (1, 0.5, 7, 9)],
)
def test_required_lease_is_replica_lease_times_drift_plus_allowance(replica_ms, ratio, allowance_ms, need):
    assert required_arbitrator_lease_ms(replica_ms, ratio, allowance_ms) == need
    assert lease_margin_refusal(need, replica_ms, ratio, allowance_ms) is None
    reason = lease_margin_refusal(need - 1, replica_ms, ratio, allowance_ms)
    assert reason is not None and f"at least {need} ms" in reason and "\n" not in reason


def test_defaults_combine_safely_and_the_old_equal_default_does_not():
    replica_ms = Config(vgroup_id=1, replicas=(1, 2), self_index=0).arbitrator_lease_ms
    assert replica_ms == 2000
    assert (DEFAULT_CLOCK_DRIFT_RATIO, DEFAULT_LEASE_ALLOWANCE_MS) == (0.01, 400)
    assert lease_margin_refusal(ArbitratorConfig().lease_ms, replica_ms, 0.01, 400) is None
    assert lease_margin_refusal(2000, replica_ms, 0.01, 400) == (
        "an arbitrator lease of 2000 ms cannot back a replica lease of 2000 ms: it must be at least"
        " 2420 ms (2000 ms x (1 + clock_drift_ratio 0.01) + lease_allowance_ms 400)"
    )
    assert max_backed_replica_lease_ms(ArbitratorConfig()) == 2079  # 2079 x 1.01 + 400 <= 2500
    assert max_backed_replica_lease_ms(ArbitratorConfig(lease_ms=400)) == 0


# ------------------------------------------------------------------ the arbitrator


def _arbitrator(tmp_path, **cfg) -> Arbitrator:
    return Arbitrator(ArbitratorConfig(secret=b"s", state_dir=str(tmp_path), **cfg))


def test_arbitrator_refuses_a_lease_it_cannot_back_and_says_why(tmp_path, caplog):
    arb = _arbitrator(tmp_path, lease_ms=2000)
    with caplog.at_level("DEBUG", logger="vrepl.arbitrator"):
        for _ in range(3):  # renewals repeat the request: one warning, then debug
            g = arb.decide(ArbitratorRequest(7, 1, 1, 2000), now_ms=1000)
            assert (g.granted, g.lease_ms) == (0, 2000)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "arbitrator: vg7 n1 e1: refused: lease of 2000 ms asked: an arbitrator lease of 2000 ms cannot"
        " back a replica lease of 2000 ms: it must be at least 2420 ms (2000 ms x (1 + clock_drift_ratio"
        " 0.01) + lease_allowance_ms 400) (raise lease_ms)"
    ]
    assert arb.leases.granted() == {} and arb.refusals == 3  # nothing recorded, nothing persisted


def test_arbitrator_grants_what_it_can_back(tmp_path):
    arb = _arbitrator(tmp_path)
    assert arb.decide(ArbitratorRequest(7, 1, 1, 2000), now_ms=1000).granted == 1
    assert arb.decide(ArbitratorRequest(7, 2, 1, 2079), now_ms=1000).granted == 0  # e1 is n1's
    assert arb.decide(ArbitratorRequest(8, 2, 1, 2079), now_ms=1000).granted == 1
    assert arb.decide(ArbitratorRequest(9, 2, 1, 2080), now_ms=1000).granted == 0  # 2080 x 1.01 + 400 > 2500
    own = _arbitrator(tmp_path / "b", lease_ms=2000, clock_drift_ratio=0.0, lease_allowance_ms=0)
    assert own.decide(ArbitratorRequest(7, 1, 1, 2000), now_ms=0).granted == 1  # the operator's call


@pytest.mark.parametrize(
    "settings,words",
    [
        ({"lease_ms": 400}, "lease_ms 400 backs no replica lease: it must exceed lease_allowance_ms 400"),
        ({"clock_drift_ratio": 1.5}, "'clock_drift_ratio' must be in [0, 1)"),
        ({"clock_drift_ratio": "1%"}, "'clock_drift_ratio' must be float"),
        ({"lease_allowance_ms": -1}, "'lease_allowance_ms' must be >= 0"),
    ],
)
def test_arbitrator_config_refused(settings, words):
    with pytest.raises(ArbitratorConfigError) as exc:
        load_config(None, {"secret_file": None, **settings, "secret": "s"})
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_arbitrator_config_margin_settings():
    cfg, _ = load_config(None, {"secret": "s", "clock_drift_ratio": 0, "lease_allowance_ms": 0, "lease_ms": 2000})
    assert (cfg.clock_drift_ratio, cfg.lease_allowance_ms, cfg.lease_ms) == (0.0, 0, 2000)
    cfg, _ = load_config(None, {"secret": "s"})
    assert (cfg.clock_drift_ratio, cfg.lease_allowance_ms, cfg.lease_ms) == (0.01, 400, 2500)


# ------------------------------------------------------------------ the node's own config


def test_replica_config_refuses_a_lease_that_lapses_between_renewals():
    ok = Config(vgroup_id=1, replicas=(1, 2), self_index=0, arbitrator=True)
    assert config_invalid(ok) is None
    short = Config(vgroup_id=1, replicas=(1, 2), self_index=0, arbitrator=True, arbitrator_lease_ticks=9)
    assert config_invalid(short) == (
        "arbitrator_lease_ticks 9 x tick_ms 100 = 900 ms must exceed heartbeat_interval_ticks 5 x tick_ms 100"
        " + lease_allowance_ms 400 = 900 ms (the renewal period plus the allowance)"
    )
    odd = Config(vgroup_id=1, replicas=(1, 2, 3), self_index=0, arbitrator=True, arbitrator_lease_ticks=9)
    assert config_invalid(odd) is None  # no arbitrator for an odd replica count
    assert "clock_drift_ratio" in config_invalid(Config(vgroup_id=1, replicas=(1,), self_index=0, clock_drift_ratio=1.0))
    assert "lease_allowance_ms" in config_invalid(Config(vgroup_id=1, replicas=(1,), self_index=0, lease_allowance_ms=-1))


def _node_doc(**sync):
    return {"node_id": 1, "data_dir": "/tmp/vrepl-x", "secret": "s",
            "nodes": [{"id": 1, "replication": "127.0.0.1:7001", "http": "127.0.0.1:7101"},
                      {"id": 2, "replication": "127.0.0.1:7002", "http": "127.0.0.1:7102"}],
            "vgroups": [{"id": 1, "replicas": [1, 2], "arbitrator": "127.0.0.1:6042"}],
            "sync": sync}


def test_node_config_margin_settings():
    cfg = parse_config(_node_doc(clock_drift_ratio=0, lease_allowance_ms=100))
    sc = cfg.sync_config(cfg.vgroups[0])
    assert (sc.clock_drift_ratio, sc.lease_allowance_ms) == (0, 100)
    rc = sc.replica_config()
    assert (rc.clock_drift_ratio, rc.lease_allowance_ms) == (0, 100)
    with pytest.raises(ConfigError, match="sync.clock_drift_ratio must be float"):
        parse_config(_node_doc(clock_drift_ratio="0.01"))
    with pytest.raises(ConfigError, match=r"vgroup 1: arbitrator_lease_ticks 8 x tick_ms 100 = 800 ms must exceed"):
        parse_config(_node_doc(arbitrator_lease_ticks=8))


# ------------------------------------------------------------------ the replica counts only a long enough grant


def _lonely_candidate() -> Replica:
    """n1 of a 2-replica group, its peer unreachable, the arbitrator connected."""
    r = Replica(Config(vgroup_id=7, replicas=(1, 2), self_index=0, arbitrator=True))
    r.start()
    out = r.step(ArbitratorConnected())
    assert [a.describe() for a in out if not isinstance(a, Log)] == ["request_arbitrator_grant e1"]
    return r


def test_replica_does_not_count_a_grant_shorter_than_it_needs():
    r = _lonely_candidate()
    out = r.step(ArbitratorGranted(1, lease_ms=2000))
    logs = [a.text for a in out if isinstance(a, Log)]
    assert (
        "vg7 n1 e0: arbitrator grant for e1 not counted: an arbitrator lease of 2000 ms cannot back a"
        " replica lease of 2000 ms: it must be at least 2420 ms (2000 ms x (1 + clock_drift_ratio 0.01)"
        " + lease_allowance_ms 400)"
    ) in logs
    assert r.role == Role.UNSYNCED and r.promised_epoch == 0 and r.grant_epoch == 0


def test_replica_counts_a_grant_that_backs_its_lease():
    r = _lonely_candidate()
    out = r.step(ArbitratorGranted(1, lease_ms=2420))
    assert [a.describe() for a in out if not isinstance(a, Log)][:2] == [
        "persist_promised_epoch e1 for n1",
        "notify_role master e1 master n1",
    ]
    assert r.role == Role.MASTER


def test_replica_logs_why_the_arbitrator_refused_a_short_lease():
    r = _lonely_candidate()
    out = r.step(ArbitratorRefused(1, lease_ms=2000))
    warn = [a.text for a in out if isinstance(a, Log) and a.level.name == "WARNING"]
    assert len(warn) == 1 and warn[0].startswith("vg7 n1 e0: arbitrator refused e1: an arbitrator lease of 2000 ms")
    out = r.step(ArbitratorRefused(1))  # no lease stated: the plain refusal
    assert "vg7 n1 e0: arbitrator refused e1" in [a.text for a in out if isinstance(a, Log)]

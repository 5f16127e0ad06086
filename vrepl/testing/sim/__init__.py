"""vrepl.testing.sim: the deterministic simulator of a replica group (docs/simulation.md).

Drives the production `vrepl.driver.Driver` (each owning a real `vrepl.replica.Replica`)
over a simulated network, disks, apps, clocks and arbitrator from one seeded PRNG, with a safety phase under faults and a liveness
phase after healing, and checks the protocol's promises after every step. Any failing run
replays from its seed: `python -m vrepl.testing.sim --seed N`.

Modules: options (knobs and profiles), world (the simulated cluster: heap, stepping, client,
phases) with its parts network (channels, connections, arbitrator), disk (WAL and app) and
faults (fault injection, the world tick), ports (each node's Bus/Storage/App for its
driver), restore (restore sessions), checker (the safety invariants), campaign (running
seeds, reports), fixes (proposed core fixes, opt-in).
"""

from vrepl.testing.sim.campaign import SeedResult, Summary, command_for, run_campaign, run_seed
from vrepl.testing.sim.checker import History, SafetyViolation
from vrepl.testing.sim.options import PROFILES, UNITS_PER_TICK, SimOptions, make_options
from vrepl.testing.sim.ports import ARB, SimError
from vrepl.testing.sim.world import LivenessFailure, World

__all__ = [
    "ARB", "History", "LivenessFailure", "PROFILES", "SafetyViolation", "SeedResult", "SimError",
    "SimOptions", "Summary", "UNITS_PER_TICK", "World", "command_for", "make_options", "run_campaign",
    "run_seed",
]

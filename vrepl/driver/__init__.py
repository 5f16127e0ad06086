"""vrepl.driver: the one place where a replica's actions are executed (docs/design.md §9).

Owns: `Driver` (driver.py), generic over its ports (ports.py: Bus, Storage, App, Restorer,
Clock), with the in-band WAL stream (streaming.py) and the replica's side of a restore
(restoring.py). Production, the simulator and the scenario tests wire the same driver to
their own ports.
Must not: do I/O, read a clock, use randomness or threads; import vrepl.sync, vrepl.restore
or anything above it.
"""

from vrepl.driver.driver import PEER_MESSAGE_TYPES, Driver, DriverOptions, batch_bounds
from vrepl.driver.ports import App, Bus, Clock, Restorer, Storage
from vrepl.driver.restoring import WAIT, ReplicaRestore

__all__ = [
    "App",
    "Bus",
    "Clock",
    "Driver",
    "DriverOptions",
    "PEER_MESSAGE_TYPES",
    "ReplicaRestore",
    "Restorer",
    "Storage",
    "WAIT",
    "batch_bounds",
]

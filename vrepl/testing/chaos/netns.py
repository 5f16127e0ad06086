"""Network namespaces for chaos runs: one per node, one for the clients, one for the
arbitrator, and a bridge namespace that holds the bridge and the nftables rules the nemesis
changes. Also the loopback fallback and the cleanup of anything a run left behind.

Layout of one run (RUN = "vrepl-chaos-<owner pid>-<hex>"):
    RUN-br       bridge `br0`, one veth port per member (`p-n1`, `p-cl`, `p-arb`), table
                 `bridge vchaos` with chain `vfilter` (hook forward): the partitions
    RUN-n1..     `eth0` = 10.77.0.11.. /24, `lo`
    RUN-cl       `eth0` = 10.77.0.100   (the workload)
    RUN-arb      `eth0` = 10.77.0.200   (the arbitrator, when used)
Every veth is created directly between two of these namespaces (`ip -n BR link add ... peer
... netns X`), so nothing ever appears in the root namespace and the subnet exists only here;
deleting the namespaces deletes the veths, the bridge and the rules. The only other state a
run makes are tmpfs mounts under its own directory (named after RUN); `cleanup()` unmounts
them. Processes inside are killed by pid (`ip netns pids`) before their namespace goes.

Must not: add an address, route or rule to the root namespace, or run anything that connects
from it.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field

PREFIX = "vrepl-chaos-"
SUBNET = "10.77.0"
NODE_HOST_BASE = 10     # node i -> 10.77.0.(10 + i)
CLIENT_HOST = 100
ARB_HOST = 200


class NemesisUnsupported(RuntimeError):
    """This fault cannot be injected in this mode (the loopback fallback)."""


def _run(cmd: list[str], check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


@functools.lru_cache(maxsize=1)
def namespaces_available() -> str | None:
    """Why the namespaced topology cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed (apt-get install -y iproute2 nftables)"
    probe = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    p = _run(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        return f"ip netns add failed: {p.stderr.strip()}"
    try:
        p = _run(["ip", "netns", "exec", probe, "nft", "add", "table", "bridge", "probe"], check=False)
        if p.returncode != 0:
            return f"nftables bridge family unavailable: {p.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def new_run_name() -> str:
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class Member:
    name: str        # "n1", "cl", "arb"
    host: str        # its address
    netns: str | None  # None on loopback


@dataclass
class Topology:
    """Where each member lives, how to run a command there, and the partition controls."""

    run: str
    base_dir: str
    namespaced: bool
    members: dict[str, Member] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    closed: bool = False

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def create(cls, base_dir: str, nodes: int, arbitrator: bool, namespaced: bool) -> "Topology":
        run = new_run_name()
        run_dir = os.path.join(base_dir, run)
        os.makedirs(run_dir)
        topo = cls(run, run_dir, namespaced)
        names = [f"n{i}" for i in range(1, nodes + 1)] + ["cl"] + (["arb"] if arbitrator else [])
        _REGISTRY.append(topo)
        if not namespaced:
            for name in names:
                topo.members[name] = Member(name, "127.0.0.1", None)
            return topo
        try:
            br = topo.bridge_ns
            _run(["ip", "netns", "add", br])
            _run(["ip", "-n", br, "link", "set", "lo", "up"])
            _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", br, "link", "set", "br0", "up"])
            for name in names:
                ns = f"{run}-{name}"
                host = topo._host_of(name)
                _run(["ip", "netns", "add", ns])
                topo.members[name] = Member(name, host, ns)
                port = f"p-{name}"
                _run(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
                _run(["ip", "-n", br, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", br, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{host}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "netns", "exec", br, "nft", "-f", "-"], input=(
                "table bridge vchaos {\n"
                "  chain vfilter { type filter hook forward priority 0; policy accept; }\n"
                "}\n"))
        except BaseException:
            topo.close()
            raise
        return topo

    @staticmethod
    def _host_of(name: str) -> str:
        if name == "cl":
            return f"{SUBNET}.{CLIENT_HOST}"
        if name == "arb":
            return f"{SUBNET}.{ARB_HOST}"
        return f"{SUBNET}.{NODE_HOST_BASE + int(name[1:])}"

    @property
    def bridge_ns(self) -> str:
        return f"{self.run}-br"

    def exec_prefix(self, name: str) -> list[str]:
        ns = self.members[name].netns
        return ["ip", "netns", "exec", ns] if ns else []

    def host(self, name: str) -> str:
        return self.members[name].host

    # -- tmpfs (disk full) -------------------------------------------------------------------

    def mount_tmpfs(self, path: str, size_kib: int) -> None:
        if os.geteuid() != 0:
            raise NemesisUnsupported("tmpfs mounts need root")
        if not os.path.realpath(path).startswith(os.path.realpath(self.base_dir) + os.sep):
            raise ValueError(f"{path} is outside this run's directory")
        os.makedirs(path, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", f"{self.run}-tmpfs", path])
        self.mounts.append(path)

    # -- partitions (nftables in the bridge namespace) ---------------------------------------

    def _nft(self, *args: str) -> None:
        if not self.namespaced:
            raise NemesisUnsupported("partitions and packet loss need the namespaced topology")
        _run(["ip", "netns", "exec", self.bridge_ns, "nft", *args])

    def _rule(self, rule: str) -> None:
        self._nft("add", "rule", "bridge", "vchaos", "vfilter", *rule.split())

    def block(self, src: str, dst: str) -> None:
        """Drop every IP packet from member src to member dst (one direction)."""
        self._rule(f"ip saddr {self.host(src)} ip daddr {self.host(dst)} drop")

    def cut(self, a: str, b: str) -> None:
        self.block(a, b)
        self.block(b, a)

    def partition(self, *groups: list[str]) -> None:
        """Members in different groups cannot talk; members not named keep every link."""
        for i, ga in enumerate(groups):
            for gb in groups[i + 1:]:
                for a in ga:
                    for b in gb:
                        self.cut(a, b)

    def drop_percent(self, percent: int, among: list[str]) -> None:
        """Drop `percent` % of the IP packets sent by each member in `among` to any other."""
        hosts = ", ".join(self.host(m) for m in among)
        self._rule(f"ip saddr {{ {hosts} }} ip daddr {{ {hosts} }} numgen random mod 100 < {int(percent)} drop")

    def heal(self) -> None:
        self._nft("flush", "chain", "bridge", "vchaos", "vfilter")

    def rules(self) -> str:
        if not self.namespaced:
            return ""
        return _run(["ip", "netns", "exec", self.bridge_ns, "nft", "list", "chain", "bridge", "vchaos",
                     "vfilter"], check=False).stdout

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what still runs in our namespaces, unmount, delete the namespaces. Idempotent."""
        if self.closed:
            return
        self.closed = True
        errors = []
        for path in reversed(self.mounts):
            p = _run(["umount", "-l", path], check=False)
            if p.returncode != 0 and os.path.ismount(path):
                errors.append(p.stderr.strip())
        if self.namespaced:
            for ns in [m.netns for m in self.members.values() if m.netns] + [self.bridge_ns]:
                kill_netns_pids(ns)
                _run(["ip", "netns", "del", ns], check=False)
        if self in _REGISTRY:
            _REGISTRY.remove(self)
        if errors:
            raise RuntimeError("; ".join(errors))


def kill_netns_pids(ns: str) -> None:
    p = _run(["ip", "netns", "pids", ns], check=False)
    pids = [int(x) for x in p.stdout.split() if x.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _running(pid)]
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child of ours stays in /proc until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


_REGISTRY: list[Topology] = []


@atexit.register
def _close_all() -> None:
    for topo in list(_REGISTRY):
        try:
            topo.close()
        except Exception:  # at exit: best effort, chaos_cleanup.py finishes the job
            pass


# -- cleanup of anything left by any run (tools/chaos_cleanup.py) --------------------------------

def _owner_alive(name: str) -> bool:
    rest = name[len(PREFIX):]
    pid = rest.split("-", 1)[0]
    return pid.isdigit() and os.path.exists(f"/proc/{pid}")


def leftovers(stale_only: bool = True, run: str | None = None) -> dict[str, list[str]]:
    """Namespaces and mounts named after a chaos run (only those whose owner process is gone
    when stale_only; only run `run` when given), as {"netns": [...], "mounts": [...]}."""
    out: dict[str, list[str]] = {"netns": [], "mounts": []}
    if shutil.which("ip"):
        p = _run(["ip", "netns", "list"], check=False)
        for line in p.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if run is not None and not name.startswith(run + "-"):
                continue
            if name.startswith(PREFIX) and not (stale_only and _owner_alive(name)):
                out["netns"].append(name)
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                source, target = line.split()[:2]
                if source.startswith(PREFIX) or (PREFIX in target and source.endswith("-tmpfs")):
                    owner = source[: -len("-tmpfs")] if source.endswith("-tmpfs") else source
                    if run is not None and owner != run:
                        continue
                    if not (stale_only and _owner_alive(owner)):
                        out["mounts"].append(target.replace("\\040", " "))
    except FileNotFoundError:
        pass
    return out


def cleanup(stale_only: bool = True, run: str | None = None) -> dict[str, list[str]]:
    """Remove what leftovers() lists; returns what it removed."""
    found = leftovers(stale_only, run)
    for target in sorted(found["mounts"], key=len, reverse=True):
        _run(["umount", "-l", target], check=False)
    for ns in found["netns"]:
        kill_netns_pids(ns)
        _run(["ip", "netns", "del", ns], check=False)
    return found

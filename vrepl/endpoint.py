"""'host:port' as the configuration and the commands write an address.

Owns: `parse_endpoint`. Must not: import anything of vrepl but its errors (a leaf: `vrepl
ship` and `vrepl restore` parse their `--to`/`--from` with it without loading the replica
package that vrepl/config.py validates settings with).
"""

from __future__ import annotations

from vrepl.errors import ConfigError


def parse_endpoint(text: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ConfigError if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {text!r} is not host:port")
    return host.strip("[]"), int(port)

"""A command's shared secret, from --secret-file or the environment.

Owns: `read_secret()`, which `vrepl restore` (the cluster secret) and `vrepl ship` (the
sender secret) call at their entry. Must not: import more than vrepl's errors and exit
codes (a leaf: `vrepl ship` reads its secret without loading the restore command's
receiver, the WAL or the vnode, issue 16), or print anything (the command prints the one
line of a CliError).
"""

from __future__ import annotations

import os

from vrepl.errors import CliError
from vrepl.exitcodes import EXIT_USAGE


def read_secret(secret_file: str | None, env_name: str, what: str) -> bytes:
    """The secret in `secret_file` (stripped), else in $`env_name`; CliError (usage) if it
    cannot be read or is empty. `what` names it in the error ("cluster secret")."""
    if secret_file:
        try:
            with open(secret_file, "rb") as fh:
                secret = fh.read().strip()
        except OSError as exc:
            raise CliError(f"{secret_file}: {exc.strerror}", EXIT_USAGE) from None
    else:
        secret = os.environ.get(env_name, "").encode()
    if not secret:
        raise CliError(f"no {what}: pass --secret-file or set ${env_name}", EXIT_USAGE)
    return secret

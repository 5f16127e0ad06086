"""Coverage-guided fuzzing of vrepl's parsers with atheris.

Usage: python -m vrepl.testing.fuzz TARGET [-runs=N] [-max_total_time=S] [corpus dir ...]
TARGET is one of vrepl.testing.fuzz_targets.TARGETS. libFuzzer flags pass through, so
`-rss_limit_mb=512` also bounds memory. A crash prints the input and saves it as crash-*.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import logging
    import os
    import tempfile

    try:
        import atheris
    except ImportError:
        print("vrepl: error: atheris is not installed (pip install atheris)", file=sys.stderr)
        return 2
    # Python-level coverage for the modules under test (the Cython core is native code and
    # is exercised, not instrumented).
    with atheris.instrument_imports(include=["vrepl"]):
        from vrepl.testing import fuzz_targets
    targets = fuzz_targets.TARGETS
    if len(argv) < 2 or argv[1] not in targets:
        print(__doc__, file=sys.stderr)
        print(f"targets: {', '.join(sorted(targets))}", file=sys.stderr)
        return 2
    logging.disable(logging.CRITICAL)  # repair() logs each truncation it makes
    args = [a for a in argv[2:]]
    if not any(not a.startswith("-") for a in args):
        corpus = tempfile.mkdtemp(prefix=f"vrepl-fuzz-{argv[1]}-")
        for i, seed in enumerate(fuzz_targets.seeds()):
            with open(os.path.join(corpus, f"seed{i}"), "wb") as fh:
                fh.write(seed)
        args.append(corpus)
    atheris.Setup([argv[0], *args], targets[argv[1]])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

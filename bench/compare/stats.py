"""Pure arithmetic of the comparison: percentiles, summaries, ratios and number formatting.

No I/O, no clock, no processes: everything here is a function of its arguments, so the unit
tests (tests/unit/test_compare_harness.py) can check it exactly.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

# The percentiles the issue names; keys are the names used in JSON and in the tables.
PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values: the smallest value such that at
    least pct % of the values are <= it. Nearest rank (no interpolation) so p99.9 of 5000
    samples is an observed latency, the 4995th, and not a blend of two."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 < pct <= 100.0:
        raise ValueError(f"percentile {pct} outside (0, 100]")
    # Rank computed in integer thousandths of a percent, so 99.9 % of 1000 is exactly rank 999
    # and not 1000 through floating-point error.
    rank = -(-len(sorted_values) * round(pct * 1000) // 100_000)
    return sorted_values[max(rank, 1) - 1]


def summarize_latencies_ns(latencies_ns: Sequence[int]) -> dict:
    """Summary in microseconds of one latency run: count, mean, min, max and PERCENTILES."""
    if not latencies_ns:
        return {"count": 0}
    values = sorted(latencies_ns)
    out = {
        "count": len(values),
        "mean_us": sum(values) / len(values) / 1e3,
        "min_us": values[0] / 1e3,
        "max_us": values[-1] / 1e3,
    }
    for name, pct in PERCENTILES:
        out[f"{name}_us"] = percentile(values, pct) / 1e3
    return out


def summarize_throughput(per_client: Sequence[dict], duration_s: float) -> dict:
    """Aggregate of the clients of one throughput run. Each client reports the writes it had
    confirmed within the measured window and its own window length; the rate is the sum of
    per-client rates, which stays right if one client's window was slightly longer."""
    if duration_s <= 0:
        raise ValueError("duration must be positive")
    writes = sum(c["writes"] for c in per_client)
    batches = sum(c["batches"] for c in per_client)
    rate = sum(c["writes"] / c["elapsed_s"] for c in per_client if c["elapsed_s"] > 0)
    errors = sum(c.get("errors", 0) for c in per_client)
    return {"clients": len(per_client), "writes": writes, "batches": batches,
            "duration_s": duration_s, "writes_per_s": rate, "errors": errors}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either figure is missing or the denominator 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    if math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator


def fmt_ratio(value: float | None) -> str:
    """'n/a' for a missing ratio, else two significant decimals followed by x: '4.20x'."""
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}x"
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x"


def fmt_us(value: float | None) -> str:
    """A latency in microseconds for a table: '87 µs', '1.25 ms', '2.0 s' or 'n/a'."""
    if value is None:
        return "n/a"
    if value < 1000:
        return f"{value:,.0f} µs"
    if value < 1_000_000:
        return f"{value / 1e3:,.2f} ms"
    return f"{value / 1e6:,.1f} s"


def fmt_rate(value: float | None) -> str:
    """A throughput for a table, writes/s with thousands separators, or 'n/a'."""
    if value is None:
        return "n/a"
    return f"{value:,.0f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table. align holds 'l' or 'r' per column (default: first column left,
    the others right, as figures are)."""
    if align is None:
        align = ["l"] + ["r"] * (len(header) - 1)
    if len(align) != len(header) or any(len(r) != len(header) for r in rows):
        raise ValueError("every row and the alignment must have one cell per header column")
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)

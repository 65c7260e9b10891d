"""Numbers as people read them, written one way in every table, report and error line: decimal (SI) prefixes
for counts, FLOPs and bytes of a model or device, binary prefixes for memory a host or file system reports."""

from __future__ import annotations

_DECIMAL = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def si(x: float, unit: str = "") -> str:
    """Three significant digits and a decimal prefix: si(3.21e9) = '3.21 G', si(8e10, 'B') = '80 GB'."""
    for prefix, scale in _DECIMAL:
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def binary(n: float) -> str:
    """Bytes with a binary prefix: '512.0 MiB' below a quarter GiB, '2.10 GiB', '1.5 TiB' from a TiB on."""
    if n >= 2**40:
        return f"{n / 2**40:,.4g} TiB"
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def count(n: float) -> str:
    """A whole count with thousands separators: 1234567.8 -> '1,234,568'."""
    return f"{n:,.0f}"

"""Human units: binary (KiB, MiB, GiB) for cache sizes, decimal GB for GPU memory and weights."""

from __future__ import annotations

_BINARY = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
_DECIMAL = ["bytes", "kB", "MB", "GB", "TB", "PB"]


def format_bytes(n: float, digits: int = 1, binary: bool = True) -> str:
    """``327680`` → ``'320 KiB'``; ``2684354560`` → ``'2.5 GiB'`` (trailing .0 dropped);
    ``binary=False`` gives decimal units (``'436 GB'``)."""
    units, step = (_BINARY, 1024) if binary else (_DECIMAL, 1000)
    n = float(n)
    unit = 0
    while abs(n) >= step and unit < len(units) - 1:
        n /= step
        unit += 1
    if unit == 0:
        return f"{int(n):,} bytes"
    text = f"{n:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{n:,.0f}"
    return f"{text} {units[unit]}"


def format_gb(n: float, digits: int = 2) -> str:
    """Decimal gigabytes, as GPU memory and weights are quoted: ``1.4e9`` → ``'1.4 GB'``."""
    gb = float(n) / 1e9
    if gb >= 100:
        return f"{gb:,.0f} GB"
    text = f"{gb:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text} GB"


def plural(count: int, word: str) -> str:
    """``1 token``, ``2 tokens``: a count with its noun, so the page never says "1 tokens"."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"

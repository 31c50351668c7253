"""Sizes for people: the one byte-count formatter (decimal units for downloads, binary for GGUF layouts)."""

from __future__ import annotations

_DECIMAL = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3))
_BINARY = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_size(n: int | None, *, binary: bool = False) -> str:
    """``3.0 GB`` (one decimal, as download sizes are quoted) or ``2.00 GiB`` (two decimals, memory and
    tensor bytes); ``?`` when unknown."""
    if n is None:
        return "?"
    units, digits = (_BINARY, 2) if binary else (_DECIMAL, 1)
    for unit, scale in units:
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} B"

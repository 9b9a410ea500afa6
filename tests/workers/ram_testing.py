"""Test helpers for the RAM tier: authentic copies, and damage done to a holder's stored bytes
from outside (the holder itself has no hook for it)."""

from __future__ import annotations

from typing import Any

from workers.ram import auth as ram_auth
from workers.ram.holder import RamHolder

TOKEN = "test-secret"
LAYOUT: dict = {"leaves": [], "pieces": []}


def holder(token: str = TOKEN, **kw: Any) -> RamHolder:
    return RamHolder(token=token, **{"keep": 2, **kw})


def copy_header(step: int, data: bytes | bytearray, *, token: str = TOKEN, incarnation: int = 1,
                source: int = 0, sources: int = 1, layout: dict | None = None) -> dict:
    """A copy's frame header (no ``writer``: the connection's hello names it), authenticated
    with ``token``."""
    layout = LAYOUT if layout is None else layout
    mac = ram_auth.copy_mac(ram_auth.Keys.from_token(token).copy, incarnation=incarnation,
                            step=step, source=source, sources=sources, layout=layout, data=data)
    return {"incarnation": incarnation, "step": step, "source": source, "sources": sources,
            "layout": layout, "mac": mac, "persist": False}


def put(h: RamHolder, writer: str, step: int, data: bytes, *, token: str = TOKEN,
        **kw: Any) -> int:
    """``RamHolder.put`` of an authentic copy."""
    header = copy_header(step, data, token=token, **kw)
    header.pop("persist")
    return h.put(token, writer=writer, data=data, **header)


def damage(h: RamHolder, *, step: int, source: int) -> bool:
    """Flip the first byte of a stored copy in place (memory rot, or a tampering holder)."""
    for c in h._store.all():
        if (c.step, c.source) == (step, source) and c.data:
            c.data = bytes([c.data[0] ^ 0xFF]) + bytes(c.data[1:])
            return True
    return False

"""The host-RAM checkpoint tier's decisions: who holds whose copy, and which tier a restore uses.

Every host's shards of the train state are copied, every ``ram.every`` steps, to a holder on its
own node (survives the host process) and to a holder on a peer host in *another slice* (survives
the node). A restore uses the newest step for which a complete, intact set exists in RAM: every
source process of one incarnation, each copy's MAC verified. It uses RAM only when that step
is at least as new as every durable step (RAM is faster); otherwise the newest durable step:
Orbax's (saved from the devices) or the holders' (saved from their RAM copies, off the
training processes). Pure: no Ray, no JAX, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class ReplicaEntry:
    """One copy of one source host's shards at one step, as a holder reports it.

    ``intact``: the holder verified the copy's MAC (keyed from the run's secret).
    """

    holder: str
    incarnation: int
    step: int
    source: int
    """The source host's JAX process index in its incarnation."""
    sources: int
    """How many processes that incarnation had: a complete set has one copy of each."""
    nbytes: int
    intact: bool = True


@dataclass(frozen=True, kw_only=True)
class TierChoice:
    """``tier`` "ram": restore ``step`` from the holders in ``holders`` (source -> holder);
    "durable": from Orbax (``step`` is its newest committed step; None: nothing, fresh start);
    "copy": from the copies the holders saved durably (``workers.ram.copy_store``)."""

    tier: Literal["ram", "durable", "copy"]
    step: int | None
    reason: str
    incarnation: int | None = None
    holders: dict[int, str] = field(default_factory=dict)
    nbytes: int = 0


def copy_due(step: int, *, every: int) -> bool:
    """Whether ``step``'s state is copied: every ``every`` steps. The one decision the hosts'
    replicators ask (``bench/ab_blocks.py`` wraps it for the bench's side-by-side mode)."""
    return step % every == 0


HOLDER_SHARE = 0.75
"""Of the RAM a host has beside its devices' train state, the share a node's holder may keep
under ``checkpoint.ram.max_host_bytes: auto``: the rest is headroom for the copy being packed,
activations and the processes themselves."""


def holder_cap(host_bytes: int, devices_bytes: int = 0) -> int:
    """``max_host_bytes: auto`` as a number: ``HOLDER_SHARE`` of a host's RAM (``host_bytes``)
    beyond what its devices' state takes of it (``devices_bytes``: the CPU emulation, where the
    devices live in the host's RAM; 0 on accelerators)."""
    return max(0, int((host_bytes - devices_bytes) * HOLDER_SHARE))


def peers(slices: Sequence[str]) -> dict[int, int | None]:
    """Host index -> the host holding its replica: the same position in the next slice (so one
    slice's loss never takes both copies); in one slice, the next host; alone, nobody.

    ``slices[i]`` is host i's slice name; hosts of a slice are contiguous, as in a mesh plan.
    """
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for index, name in enumerate(slices):
        if name not in members:
            order.append(name)
            members[name] = []
        members[name].append(index)
    out: dict[int, int | None] = {}
    for index, name in enumerate(slices):
        mine = members[name]
        position = mine.index(index)
        if len(order) > 1:
            other = members[order[(order.index(name) + 1) % len(order)]]
            out[index] = other[position % len(other)]
        elif len(mine) > 1:
            out[index] = mine[(position + 1) % len(mine)]
        else:
            out[index] = None
    return out


def peer_nodes(mesh: Sequence[tuple[str, str]], spare: Sequence[tuple[str, str]] = ()
               ) -> list[str | None]:
    """Per mesh host, the node of the holder of its peer copy. ``mesh`` and ``spare``: (slice
    name, node id) of the mesh's hosts in order and of the hosts kept warm on spare slices.
    Several slices: ``peers``. One slice with a spare slice warm: the same position on the
    spare (a notice takes a slice as a unit, so a peer in the same slice would go with it; the
    spare is where the next mesh forms, so its restore even reads its own node). Otherwise
    ``peers`` (the next host of the slice, or nobody)."""
    slices = [s for s, _ in mesh]
    if len(set(slices)) == 1 and spare:
        first = [node for name, node in spare if name == spare[0][0]]
        return [first[i % len(first)] for i in range(len(mesh))]
    return [None if j is None else mesh[j][1] for j in peers(slices).values()]


def choose_tier(entries: Iterable[ReplicaEntry], durable_step: int | None, *,
                copy_step: int | None = None, exclude_steps: Collection[int] = ()
                ) -> TierChoice:
    """The fastest tier holding the newest complete state (see module doc).

    A step counts in RAM only if every source of one incarnation has an intact copy there;
    damaged copies are passed over (another holder's copy of the same source may serve).
    ``durable_step``: the newest committed Orbax step; ``copy_step``: the newest step the
    holders saved durably from their copies. On a tie: RAM, then Orbax, then the saved copy.
    """
    complete: dict[tuple[int, int], dict[int, ReplicaEntry]] = {}
    expected: dict[tuple[int, int], int] = {}
    damaged = 0
    for e in entries:
        if not e.intact:
            damaged += 1
            continue
        if e.step in exclude_steps:
            continue
        key = (e.step, e.incarnation)
        expected[key] = e.sources
        complete.setdefault(key, {}).setdefault(e.source, e)
    full = sorted((key for key, found in complete.items()
                   if len(found) == expected[key] and set(found) == set(range(expected[key]))),
                  reverse=True)
    note = f" ({damaged} damaged cop{'y' if damaged == 1 else 'ies'} ignored)" if damaged else ""
    ram_step = full[0][0] if full else None
    ranked = [(step, -rank, tier) for rank, (tier, step) in enumerate(
        (("ram", ram_step), ("durable", durable_step), ("copy", copy_step))) if step is not None]
    if not ranked:
        return TierChoice(tier="durable", step=None,
                          reason=f"nothing saved or copied yet: fresh start{note}")
    step, _, tier = max(ranked)
    if tier == "copy":
        return TierChoice(tier="copy", step=step,
                          reason=f"the copy saved from RAM at step {step} is the newest{note}")
    if tier == "durable":
        why = (f"RAM holds step {ram_step} only" if ram_step is not None
               else "no complete set of RAM copies")
        return TierChoice(tier="durable", step=step,
                          reason=f"Orbax step {step} is the newest ({why}){note}")
    incarnation = full[0][1]
    found = complete[(step, incarnation)]
    return TierChoice(tier="ram", step=step, incarnation=incarnation,
                      holders={s: e.holder for s, e in sorted(found.items())},
                      nbytes=sum(e.nbytes for e in found.values()),
                      reason=f"RAM step {step} complete on {len(found)} source(s){note}")

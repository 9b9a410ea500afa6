"""The data position in every checkpoint tier, and where a restore resumed the data.

Every tier that holds a train state also holds a *data record*: the Orbax checkpoint as its own
item (``data``), each RAM-tier copy in its layout (so the saves written from RAM and the copies a
drain hands over carry it too), and what autoresume's new driver restores is one of those. A
restore checks the record against the state it restored and reports where the data resumed
(tier, step, epoch, record index), which the driver writes to ``summary.json`` (``restores``)
and the timeline (``Compiling.data``).

Two kinds of source (``docs/data.md``, "The position in every tier"):

- ``step``: a random-access source (``workers.input``, every ``DataSource`` of the task
  contract): the batch of step ``s`` is a pure function of ``(seed, s)``, so the position *is*
  the step. The record adds the epoch and the record index (``position(step)`` where the source
  has one) to say where that is; nothing else is needed to resume, on any number of processes.
- ``iterator``: a stateful source, one whose data also offers ``state()`` (this process's
  iterator state, JSON) and ``set_state(states, process_index=, process_count=)`` (every
  process's states, in process order). Each process's state goes with every tier; a restore
  hands the states back. A source whose state cannot be re-cut for another number of processes
  (``reshardable`` False, the default) refuses a resize with the reason, instead of silently
  reading another order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.shared.errors import DataError

FORMAT = 1
_SETTING = "task.data"


def is_stateful(source: Any) -> bool:
    """The source keeps an iterator state (``state``/``set_state``) beside the step."""
    return callable(getattr(source, "state", None)) and callable(getattr(source, "set_state",
                                                                         None))


def record(source: Any, step: int, *, process_index: int, process_count: int,
           iterators: Sequence[Any] | None = None) -> dict:
    """The data record of a state at ``step`` (the next batch read is step ``step``'s).

    ``iterators``: every process's iterator state (the Orbax item); None for one process's
    copy, which carries its own state only (``iterator``)."""
    rec: dict[str, Any] = {"format": FORMAT, "kind": "step", "step": int(step),
                           "processes": int(process_count)}
    position = getattr(source, "position", None)
    if callable(position):
        p = position(int(step))
        rec.update(epoch=int(p.epoch), index=int(p.index), records=int(p.records),
                   global_batch=int(p.global_batch))
    if is_stateful(source):
        rec["kind"] = "iterator"
        if iterators is not None:
            rec["iterators"] = list(iterators)
        else:
            rec["process_index"] = int(process_index)
            rec["iterator"] = source.state()
    return rec


def from_copies(records: Mapping[int, dict | None]) -> dict | None:
    """One record from the copies' (source index → that copy's record): None if any copy has
    none (written before records existed), else the first, with every source's iterator state
    (``iterators``, in source order) for an iterator source. Copies of different steps or kinds
    are refused (they cannot make one state)."""
    if not records or any(r is None for r in records.values()):
        return None
    recs = {int(k): dict(v) for k, v in records.items() if v is not None}
    first = recs[min(recs)]
    for src, r in recs.items():
        if (r.get("kind"), r.get("step")) != (first.get("kind"), first.get("step")):
            raise DataError(_SETTING, f"the RAM copies disagree on the data position: source "
                            f"{src} holds {r.get('kind')} step {r.get('step')}, source "
                            f"{min(recs)} {first.get('kind')} step {first.get('step')}",
                            "restore from the durable tier (a new run dir, or remove the copies)")
    out = {k: v for k, v in first.items() if k not in ("iterator", "process_index")}
    if first.get("kind") == "iterator":
        out["iterators"] = [recs[i].get("iterator") for i in sorted(recs)]
    return out


def resume(source: Any, saved: dict | None, *, step: int | None, tier: str, process_index: int,
           process_count: int) -> dict:
    """Check ``saved`` (the record the tier held, None if it held none) against the restored
    state's ``step`` (None: a fresh start), give an iterator source its state, and say where the
    data resumed: ``{tier, step, kind, epoch, index, ..., recorded, processes, processes_now}``.

    ``DataError`` (not retryable: the run ends with the reason) when the record names another
    step than the state, when an iterator source's state is missing, or when it was written by
    another number of processes and the source cannot be re-sharded."""
    now = record(source, step or 0, process_index=process_index, process_count=process_count)
    where: dict[str, Any] = {"tier": tier, "step": int(step or 0), "kind": now["kind"],
                             "recorded": saved is not None, "processes_now": process_count}
    for key in ("epoch", "index", "records", "global_batch"):
        if key in now:
            where[key] = now[key]
    if step is None:  # from the seed: the data starts at its beginning
        where.update(tier="seed", recorded=False)
        return where
    stateful = is_stateful(source)
    if saved is None:
        if stateful:
            raise DataError(_SETTING, f"the {tier} tier's step {step} holds no data iterator "
                            "state (written before records existed, or by a source without "
                            "one), and this source keeps one: resuming would read another order",
                            "resume with the source the run was written with, or start a "
                            "new run dir")
        return where
    if saved.get("step") != step:
        raise DataError(_SETTING, f"the {tier} tier holds the train state of step {step} but "
                        f"the data position of step {saved.get('step')}: they must be one",
                        "restore another step (move the bad step aside), or start a new run dir")
    where["processes"] = saved.get("processes")
    if stateful:
        iterators = saved.get("iterators")
        if saved.get("kind") != "iterator" or not isinstance(iterators, list):
            raise DataError(_SETTING, f"the {tier} tier's step {step} holds no data iterator "
                            f"state (a {saved.get('kind')!r} record) and this source keeps one",
                            "resume with the source the run was written with, or start a "
                            "new run dir")
        if len(iterators) != process_count and not getattr(source, "reshardable", False):
            why = getattr(source, "reshard_reason", "") or "its state is per process"
            raise DataError(_SETTING, f"the data iterator state of step {step} was written by "
                            f"{len(iterators)} processes and this group has {process_count}; "
                            f"{type(source).__name__} cannot re-shard it ({why}), so a resize "
                            "would skip or repeat samples",
                            "keep the number of hosts (controller.elastic.enabled=false, and "
                            "spare slices or standbys for replacements), or use a source whose "
                            "position is the step (workers.input, docs/data.md)")
        source.set_state(iterators, process_index=process_index, process_count=process_count)
        where["iterators"] = len(iterators)
    return where


def gather(value: Any, process_count: int) -> list[Any]:
    """Every process's JSON ``value``, in process order (a collective: every process calls it
    at the same point, as every process calls a save)."""
    if process_count == 1:
        return [value]
    from jax.experimental import multihost_utils

    raw = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([raw.size], np.int32)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:raw.size] = raw
    every = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(every[i, :int(sizes.reshape(-1)[i])]).decode())
            for i in range(process_count)]


"""Synthetic runs shared by the goodput, sink and report tests (numbers worked out by hand)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from orchestrator.lifecycle import RunState, Transition
from orchestrator.lifecycle import payloads as payload_types
from orchestrator.metrics.records import StepRecord
from policies.causes import StopCause

T0 = 1000.0
S01 = ["s0", "s1"]


def transition(seq: int, state: str, prev: str | None, at: float, *, inc: int = 0,
               slices: list[str] | None = None, step: int = 0, reason: str = "",
               payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"seq": seq, "state": state, "prev": prev, "at": at, "prev_duration_s": 0.0,
            "reason": reason or f"to {state.lower()}", "incarnation": inc,
            "slices": list(slices or []), "hosts": 2 * len(slices or []), "step": step,
            "payload": payload}


def typed(row: Mapping[str, Any]) -> Transition:
    """A timeline line as the typed ``Transition`` the controller hands its listeners (the
    payload rebuilt from its ``type``: causes as ``StopCause``, lists as tuples)."""
    payload = None
    if row.get("payload"):
        data = dict(row["payload"])
        cls = getattr(payload_types, data.pop("type"))
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: (StopCause(v) if k == "cause" and v is not None
                      else tuple(v) if isinstance(v, list) else v)
                  for k, v in data.items() if k in names}
        payload = cls(**kwargs)
    return Transition(seq=row["seq"], state=RunState(row["state"]),
                      prev=RunState(row["prev"]) if row.get("prev") else None, at=row["at"],
                      prev_duration_s=row.get("prev_duration_s", 0.0), reason=row["reason"],
                      incarnation=row["incarnation"], slices=tuple(row["slices"]),
                      hosts=row["hosts"], step=row["step"], payload=payload)


def step_record(step: int, wall: float, *, inc: int, slices: int, step_time: float = 0.5,
                ckpt: float = 0.0) -> StepRecord:
    return StepRecord(step=step, loss=5.0 / (1 + step * 0.01), step_time_s=step_time, tokens=512,
                      flops=1e9, grad_norm=1.0, wall_time=wall, devices=4 * slices,
                      peak_flops_per_device=1e10, peak_source="configured",
                      mfu=1e9 / (step_time * 4 * slices * 1e10), incarnation=inc, slices=slices,
                      checkpoint_blocking_s=ckpt, lr=1e-3)


def preempt_shrink_grow_run() -> tuple[list[dict[str, Any]], list[StepRecord], float]:
    """Start, preemption (drain, lost steps 51..100, shrink to s0), then grow to s0+s2.

    Returns (timeline, step records, now). The run is still going at ``now`` = T0 + 160.
    """
    t = T0
    tl = [
        transition(0, "PLANNING", None, t + 0),
        transition(1, "FORMING", "PLANNING", t + 2, slices=S01),
        transition(2, "COMPILING", "FORMING", t + 10, slices=S01),
        transition(3, "RUNNING", "COMPILING", t + 20, slices=S01, step=0),
        transition(4, "DRAINING", "RUNNING", t + 75, slices=S01, step=100, reason="preemption"),
        transition(5, "RELEASING", "DRAINING", t + 78, slices=S01, step=100),
        transition(6, "WAITING_FOR_CAPACITY", "RELEASING", t + 80, slices=["s0"]),
        transition(7, "FORMING", "WAITING_FOR_CAPACITY", t + 100, inc=1, slices=["s0"],
                   reason="preempted: host 1"),
        transition(8, "RESTORING", "FORMING", t + 105, inc=1, slices=["s0"]),
        transition(9, "COMPILING", "RESTORING", t + 108, inc=1, slices=["s0"], step=50),
        transition(10, "RUNNING", "COMPILING", t + 115, inc=1, slices=["s0"], step=50),
        transition(11, "CHECKPOINTING", "RUNNING", t + 130, inc=1, slices=["s0"], step=80),
        transition(12, "FORMING", "CHECKPOINTING", t + 135, inc=2, slices=["s0", "s2"],
                   reason="grow"),
        transition(13, "RESTORING", "FORMING", t + 140, inc=2, slices=["s0", "s2"]),
        transition(14, "COMPILING", "RESTORING", t + 142, inc=2, slices=["s0", "s2"], step=80),
        transition(15, "RUNNING", "COMPILING", t + 145, inc=2, slices=["s0", "s2"], step=80),
    ]
    steps = [step_record(k, t + 20 + 0.5 * k, inc=0, slices=2, ckpt=1.0 if k == 50 else 0.0)
             for k in range(1, 101)]
    steps += [step_record(k, t + 115 + 0.5 * (k - 50), inc=1, slices=1) for k in range(51, 81)]
    steps += [step_record(k, t + 145 + 0.5 * (k - 80), inc=2, slices=2) for k in range(81, 101)]
    return tl, steps, t + 160


def tr(seq: int, state: str, prev: str | None, at: float, **kw: Any) -> Transition:
    """``typed(transition(...))``: what a sink's ``on_transition`` receives."""
    return typed(transition(seq, state, prev, at, **kw))

"""Trace replay: a JSONL of timestamped events, in the run's own event-log format, as happenings.

Accepted lines: a run's ``events.jsonl`` record (``{"at", "decision", "event": {...}}``; the
controller's ``"decision": "action"`` lines are skipped: they are what the old run *did*), or one
event per line in our own schema (``orchestrator.events.model.Event``, docs/events.md). Each
event is validated by the same ``Event.from_json`` the intake uses. The same event id seen
twice (a record per verdict) is replayed once. Times are shifted so the first event lands
``trace.start_offset_s`` after the simulation starts.

Names: the trace's slices map to the simulated slices in order of first appearance, its hosts to
(slice, worker) positions in order of first appearance within their slice (or across the job
when the event names no slice); a host named by its mesh index (``host_kind`` "index", or
bare digits from our own CLI's ``--host 1``) is the host at that index of the mesh when the
event arrives, as the intake resolves it. Effects: a
preemption notice takes its slice away at its deadline, scheduled maintenance during its window,
``host_lost`` / ``slice_lost`` at once (these two are *not* submitted to the intake: in a real
run the controller learns of a death from Ray, i.e. from the worker group).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from orchestrator.events.model import Event, MalformedEvent
from orchestrator.shared.errors import OrchestratorError
from orchestrator.sim.config import SimConfig
from orchestrator.sim.models import draw_delay
from orchestrator.sim.processes import Happening


class TraceError(OrchestratorError):
    """A trace line cannot be replayed; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class TracedEvent:
    line: int
    at: float
    event: Event


def read_trace(path: str | Path) -> list[TracedEvent]:
    """Parse and validate every line; the first bad line raises TraceError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}",
                         fix="point trace.path at a readable JSONL file") from None
    out: list[TracedEvent] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where} is not JSON ({exc.msg} at column {exc.colno})",
                             fix="write one JSON object per line (a run's events.jsonl, or "
                                 "one event per line as in docs/events.md)") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{where} is a JSON {type(rec).__name__}, not an object",
                             fix="write one JSON object per line")
        if rec.get("decision") == "action" or rec.get("decision") == "dead_letter":
            continue
        body = rec.get("event", rec)
        if not isinstance(body, dict):
            raise TraceError(f"{where}: \"event\" is not an object",
                             fix="each events.jsonl record carries the event as an object")
        at = body.get("observed_at", rec.get("received_at", rec.get("at")))
        if at is None:
            raise TraceError(f"{where}: the event has no time (observed_at, received_at or at)",
                             fix="give every event an observed_at in unix seconds")
        try:
            event = Event.from_json(body)
        except MalformedEvent as exc:
            raise TraceError(f"{where}: {exc.reason}", fix=exc.fix) from None
        if event.id in seen:
            continue
        seen.add(event.id)
        out.append(TracedEvent(line=n, at=float(event.observed_at), event=event))
    if not out:
        raise TraceError(f"trace {path} holds no events",
                         fix="use a file with at least one event line (events.jsonl records "
                             "with an \"event\" object, or events in our schema)")
    return sorted(out, key=lambda e: (e.at, e.line))


class _Names:
    """Trace slice/host names -> simulated positions, in order of first appearance."""

    def __init__(self, n_slices: int, hosts_per_slice: int) -> None:
        self.n_slices, self.hps = n_slices, hosts_per_slice
        self.slices: dict[str, int] = {}
        self.hosts: dict[str, tuple[int, int]] = {}
        self.used: dict[int, int] = {}

    def slice(self, name: str, where: str) -> int:
        if name not in self.slices:
            if len(self.slices) >= self.n_slices:
                raise TraceError(f"{where}: the trace names more slices than the simulated "
                                 f"cluster has ({self.n_slices})",
                                 fix="raise topology.slices or topology.spare_slices")
            self.slices[name] = len(self.slices)
        return self.slices[name]

    def host(self, name: str, kind: str | None, slice_name: str | None,
             where: str) -> tuple[int, int]:
        key = f"{slice_name}/{name}"
        if key not in self.hosts:
            s = self.slice(slice_name, where) if slice_name is not None else (
                len(self.hosts) // self.hps) % self.n_slices
            w = self.used.get(s, 0)
            if w >= self.hps:
                raise TraceError(f"{where}: slice {slice_name or s} gets more hosts than "
                                 f"topology.hosts_per_slice={self.hps}",
                                 fix="raise topology.hosts_per_slice to the trace's hosts per "
                                     "slice")
            self.used[s] = w + 1
            self.hosts[key] = (s, w)
        return self.hosts[key]


def happenings(traced: list[TracedEvent], cfg: SimConfig, n_slices: int) -> list[Happening]:
    """The trace as happenings on the simulated cluster (times relative to the start)."""
    names = _Names(n_slices, cfg.topology.hosts_per_slice)
    rng = random.Random(f"{cfg.seed}:trace")
    shift = cfg.trace.start_offset_s - traced[0].at
    effects = cfg.trace.effects
    out: list[Happening] = []
    for te in traced:
        ev, where = te.event, f"{cfg.trace.path}:{te.line}"
        t = te.at + shift
        tgt = ev.target
        s = names.slice(tgt.slice, where) if tgt.slice is not None else None
        w = index = None
        if tgt.host is not None and tgt.host.isdigit() and tgt.host_kind in ("index", None):
            s, index = None, int(tgt.host)
        elif tgt.host is not None:
            s, w = names.host(tgt.host, tgt.host_kind, tgt.slice, where)
        kind = ev.kind.value
        common = dict(t=t, slice_index=s, worker=w, event_id=f"trace-{ev.id}", effect=effects,
                      mesh_index=index)
        if kind == "preemption_notice":
            lead = (ev.deadline - ev.observed_at if ev.deadline
                    else cfg.failures.preemption_notice_s)
            out.append(Happening(kind="preemption", lead_s=max(0.0, lead),
                                 back_s=draw_delay(cfg.capacity.slice_return, rng), **common))
        elif kind == "maintenance_scheduled":
            start = ev.window_start or ev.deadline or ev.observed_at
            end = ev.window_end or start + cfg.failures.maintenance_duration_s
            out.append(Happening(kind="maintenance", lead_s=max(0.0, start - ev.observed_at),
                                 duration_s=max(1.0, end - start), **common))
        elif kind in ("host_lost", "slice_lost"):
            if not effects:
                continue
            whole = kind == "slice_lost" or w is None
            delay = cfg.capacity.slice_return if whole else cfg.capacity.host_repair
            out.append(Happening(kind="slice_loss" if whole else "host_failure",
                                 back_s=draw_delay(delay, rng), **common))
        else:
            out.append(Happening(kind="notice", event_kind=kind, **common))
    return out

"""``python -m orchestrator.events explain``: what would the orchestrator do with this message?

For each payload (a file, stdin, every ``*.json`` in ``--dir``; a file may hold one JSON
document, JSON lines, a JSON list such as ``gcloud pubsub subscriptions pull --format=json``
prints, or base64 of any of those) it shows the format, the parsed event, the hosts it targets in
a topology, the intake's verdict (accepted / duplicate / stale / irrelevant / dead letter, with
the reason) and the reaction the policy would choose. Without a topology (no ``--topology``, or
one with no hosts) a payload that names a host or slice is ``unknown_target``, never stale: no
hosts given says nothing of whether it is the run's. It runs the same code as the driver
(``parsing``, ``relevance.judge``, ``targeting``, the observation builder in ``observation`` and
``policies.reaction``) and touches nothing. With ``--topology RUN_DIR`` it judges with the run's
own recorded config (RUN_DIR/config.yaml, written by the driver at each start): its ``controller``
and ``events`` sections give the reaction policy and the events settings, ``run.name`` the job;
without one, the defaults (the output says which). Payloads are judged in order, each with what
the earlier ones left (ids seen, health reports, cordons), as the driver would.
Exit 0 when every payload is understood (parsed), 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.events import bounded, parsing
from orchestrator.events.config import EventsConfig
from orchestrator.events.model import MalformedEvent
from orchestrator.events.observation import (
    RunFacts,
    build_observation,
    health_reports_for,
    run_policy,
)
from orchestrator.events.relevance import judge
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.hosts import HostRef
from policies.reaction import ReactionKind, ReactionPolicy

TOPOLOGY_FILE = "topology.json"
CONFIG_FILE = "config.yaml"
UNKNOWN_TARGET = "unknown_target"
"""explain's own verdict (never the intake's): the payload names a host or slice and no
topology says whether it is the run's."""
TOPOLOGY_FIX = ("pass --topology RUN_DIR (the run's directory; or its topology.json or "
                "run.json) to judge it against the run's hosts")


@dataclass(frozen=True)
class Topology:
    """The run as explain sees it: hosts, the id -> name map, job, cluster and incarnation."""

    hosts: tuple[HostRef, ...] = ()
    id_to_name: Mapping[str, str] = field(default_factory=dict)
    job: str | None = None
    cluster: str | None = None
    incarnation: int = 0


@dataclass(frozen=True)
class Settings:
    """What the driver judged with: reaction policy, events settings, the run's name, and where
    they came from (``RUN_DIR/config.yaml`` or ``defaults``)."""

    policy: ReactionPolicy = field(default_factory=ReactionPolicy)
    events: EventsConfig = field(default_factory=EventsConfig)
    job: str | None = None
    source: str = "defaults"


@dataclass
class Judged:
    """What earlier payloads left for the next, as in the driver: ids seen, health reports,
    cordons and the last health drain."""

    seen: set[str] = field(default_factory=set)
    facts: RunFacts = field(default_factory=RunFacts)


class ExplainError(Exception):
    """Bad input to explain itself (not a payload problem): message names the fix."""


def load_settings(path: Path | None) -> Settings:
    """The run's own settings when ``path`` is a run directory (or its run.json/topology.json)
    holding the driver's config.yaml; the defaults otherwise."""
    if path is None:
        return Settings()
    run_dir = path if path.is_dir() else path.parent
    config = run_dir / CONFIG_FILE
    if not (path.is_dir() or path.name in ("run.json", TOPOLOGY_FILE)) or not config.is_file():
        return Settings()
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        if not isinstance(data, Mapping):
            raise ValueError("not a YAML mapping")
        policy, events = run_policy(data)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ExplainError(f"cannot read the run's config {config}: {exc}; restore it (the "
                           "driver writes it at each start) or pass a topology JSON") from None
    except ConfigError as exc:
        raise ExplainError(f"the run's config {config} is not valid: {exc}") from None
    job = (data.get("run") or {}).get("name") if isinstance(data.get("run"), Mapping) else None
    return Settings(policy=policy, events=events, job=job or None, source=str(config))


def load_topology(path: Path | None) -> Topology:
    """``path``: a topology JSON (``{"job", "cluster", "incarnation", "hosts": [...],
    "id_to_name": {...}}``), a run's ``run.json``, or a run directory (its ``topology.json``,
    else ``run.json``). Hosts take HostRef's fields, plus an optional ``instance_id``."""
    if path is None:
        return Topology()
    if path.is_dir():
        path = path / TOPOLOGY_FILE if (path / TOPOLOGY_FILE).exists() else path / "run.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExplainError(f"cannot read topology {path}: {exc}; pass a topology JSON, a "
                           "run.json or a run directory") from None
    if isinstance(data, list):
        data = {"hosts": data}
    if not isinstance(data, Mapping):
        raise ExplainError(f"topology {path} must be a JSON object or a list of hosts")
    hosts: list[HostRef] = []
    ids = {str(k): str(v) for k, v in dict(data.get("id_to_name") or {}).items()}
    for i, h in enumerate(data.get("hosts") or []):
        if not isinstance(h, Mapping):
            raise ExplainError(f"topology {path}: hosts[{i}] is not an object")
        instance = str(h.get("instance") or h.get("name") or "")
        hosts.append(HostRef(
            index=int(h.get("index", i)), slice_name=str(h.get("slice_name") or h.get("slice")
                                                         or "slice-0"),
            worker_id=int(h.get("worker_id", 0)),
            node_id=str(h.get("node_id") or instance or f"host-{i}"),
            node_ip=str(h.get("node_ip") or h.get("ip") or ""), instance=instance,
            devices=int(h.get("devices", 0))))
        if h.get("instance_id") and instance:
            ids[str(h["instance_id"])] = instance
    incarnation = data.get("incarnation", 0)
    return Topology(hosts=tuple(hosts), id_to_name=ids, job=data.get("job"),
                    cluster=data.get("cluster"),
                    incarnation=incarnation if isinstance(incarnation, int) else 0)


def read_payloads(sources: list[str], directory: Path | None
                  ) -> Iterator[tuple[str, str, bytes]]:
    """(file, name, payload bytes) for each payload in the given files ("-" = stdin) and
    directory; ``name`` also says where in the file (``[i]``, ``:line``, ``(base64)``)."""
    files: list[tuple[str, bytes]] = []
    for src in sources:
        if src == "-":
            files.append(("<stdin>", sys.stdin.buffer.read()))
        else:
            try:
                files.append((src, Path(src).read_bytes()))
            except OSError as exc:
                raise ExplainError(f"cannot read {src}: {exc.strerror}") from None
    if directory is not None:
        if not directory.is_dir():
            raise ExplainError(f"--dir {directory} is not a directory")
        files += [(str(p), p.read_bytes()) for p in sorted(directory.glob("*.json"))]
    for file, data in files:
        for name, payload in _split(file, data):
            yield file, name, payload


def _split(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """One file -> payloads: a JSON list's items, JSON lines, or base64 of those; else whole."""
    try:
        value = bounded.loads(data, max_bytes=bounded.PUBSUB_MAX_BYTES, max_depth=64)
    except MalformedEvent:
        value = None
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        for i, item in enumerate(value):
            yield f"{name}[{i}]", json.dumps(item).encode()
        return
    if value is not None:
        yield name, data
        return
    lines = [ln for ln in data.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith(b"{") for ln in lines):
        for i, line in enumerate(lines):
            yield f"{name}:{i + 1}", line
        return
    try:
        decoded = base64.b64decode(b"".join(data.split()), validate=True)
        bounded.loads(decoded, max_bytes=bounded.PUBSUB_MAX_BYTES)
    except (binascii.Error, ValueError, MalformedEvent):
        yield name, data
        return
    yield from _split(f"{name} (base64)", decoded)


def explain_one(name: str, data: bytes, *, topo: Topology, settings: Settings, state: Judged,
                now: float | None, file: str | None = None) -> dict[str, Any]:
    """Everything the driver would decide about one payload, as a JSON-able dict; ``state``
    carries what it leaves for the next payload."""
    cfg = settings.events
    out: dict[str, Any] = {"payload": name, "file": file if file is not None else name,
                           "understood": False}
    try:
        value = bounded.loads(data, max_bytes=cfg.pubsub.max_payload_bytes,
                              max_depth=cfg.max_payload_depth)
        out["format"] = parsing.detect_format(value)
        at = time.time() if now is None else now
        event = parsing.parse_value(value, now=at, source="explain", notice_s=cfg.notice_s)
    except MalformedEvent as exc:
        out["verdict"] = {"decision": "dead_letter", "reason": exc.reason, "fix": exc.fix}
        return out
    if now is None:  # judge as if it arrived when it happened
        at = event.occurred_at if event.occurred_at is not None else event.observed_at
        event = event.with_observed(at)
    out["understood"] = True
    out["event"] = event.to_json(with_raw=False)
    verdict, targeting = judge(
        event, job=topo.job or settings.job or event.target.job or event.labels.get("job") or "",
        now=at, hosts=topo.hosts, incarnation=topo.incarnation, seen=state.seen,
        attributes=parsing.envelope_attributes(value), filters=cfg.pubsub.filters or None,
        grace_s=cfg.stale_grace_s, id_to_name=topo.id_to_name,
        cluster=topo.cluster or cfg.cluster)
    if _needs_topology(event, verdict, targeting, topo):
        return _unknown_target(out, event)
    out["verdict"] = {"decision": verdict.decision, "reason": verdict.reason}
    if targeting is not None:
        by_id = {h.node_id: h for h in topo.hosts}
        out["targets"] = {"job_wide": targeting.job_wide, "reason": targeting.reason,
                          "hosts": [_host(by_id[n]) for n in sorted(targeting.node_ids)]}
    if not verdict.accepted:
        out["reaction"] = {"kind": "ignore", "reason": f"{verdict.decision}: {verdict.reason}"}
        return out
    state.seen.add(event.id)
    assert targeting is not None
    mesh = frozenset(h.node_id for h in topo.hosts)  # the topology is the mesh it runs on
    facts = replace(state.facts, mesh_hosts=mesh, job_hosts=mesh, health_reports=(
        *state.facts.health_reports, *health_reports_for(event, targeting, now=at)))
    reaction = settings.policy.decide(build_observation(event, targeting, facts, now=at))
    drained = reaction.kind is ReactionKind.CORDON_AND_REPLACE and reaction.drains
    state.facts = replace(facts, cordoned=facts.cordoned | reaction.cordon,
                          last_health_drain_at=at if drained else facts.last_health_drain_at)
    out["reaction"] = {"kind": reaction.kind.value, "reason": reaction.reason,
                       "cause": reaction.cause.value if reaction.cause else None,
                       "doomed": sorted(reaction.doomed), "cordon": sorted(reaction.cordon),
                       "at_step": reaction.at_step, "deadline": reaction.deadline}
    return out


def _needs_topology(event: Any, verdict: Any, targeting: Any, topo: Topology) -> bool:
    """Found stale only for naming a host or slice of a mesh explain was not shown: no hosts
    given is no evidence that the named one is not the run's."""
    return (not topo.hosts and verdict.decision == "stale" and targeting is not None
            and (event.target.host is not None or event.target.slice is not None))


def _unknown_target(out: dict[str, Any], event: Any) -> dict[str, Any]:
    """The verdict and reaction when the hosts are needed and not known."""
    t = event.target
    named = " in ".join(
        ([f"{getattr(t, 'host_kind', None) or 'host'} {str(t.host)!r}"] if t.host is not None
         else []) + ([f"slice {t.slice!r}"] if t.slice is not None else []))
    out["verdict"] = {"decision": UNKNOWN_TARGET,
                      "reason": f"current and for this job, and names {named}: whether that "
                                "is one of the run's hosts is not known without a topology"}
    out["targets"] = {"job_wide": False, "hosts": None, "reason": f"{named}; no --topology"}
    out["reaction"] = {"kind": "unknown", "reason": "depends on the run's hosts: "
                       + TOPOLOGY_FIX}
    return out


def _host(h: HostRef) -> str:
    return f"{h.index}:{h.instance or h.node_id}"


def render(result: dict[str, Any]) -> str:
    """Human-readable lines for one payload."""
    v = result["verdict"]
    lines = [f"{result['payload']}: {v['decision'].upper()}"
             + (f" ({result.get('format')})" if result.get("format") else "")]
    if v["decision"] == "dead_letter":
        lines += [f"  reason: {v['reason']}", f"  fix:    {v['fix']}"]
        return "\n".join(lines)
    ev = result["event"]
    lines.append(f"  event:    {ev['kind']} id={ev['id']}")
    lines.append(f"  target:   {json.dumps(ev['target'])}")
    for key in ("deadline", "window_start", "window_end"):
        if ev.get(key) is not None:
            lines.append(f"  {key + ':':<9} {_iso(ev[key])}")
    if ev["labels"].get("parse.ignored"):
        lines.append(f"  ignored:  {ev['labels']['parse.ignored']}")
    if "targets" in result:
        t = result["targets"]
        if t["hosts"] is None:
            lines.append(f"  hosts:    unknown ({t['reason']})")
        else:
            hosts = "the whole job" if t["job_wide"] else (", ".join(t["hosts"]) or "none")
            lines.append(f"  hosts:    {hosts} ({t['reason']})")
    if v["reason"]:
        lines.append(f"  verdict:  {v['decision']}: {v['reason']}")
    r = result["reaction"]
    lines.append(f"  reaction: {r['kind']}: {r['reason']}")
    return "\n".join(lines)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) + f" ({t:.0f})"


def run(args: Any) -> int:
    """The subcommand: print each payload's explanation; 0 if all understood, 1 if not."""
    try:
        topo = load_topology(args.topology)
        if args.job:
            topo = Topology(hosts=topo.hosts, id_to_name=topo.id_to_name, job=args.job,
                            cluster=topo.cluster, incarnation=topo.incarnation)
        if args.cluster:
            topo = Topology(hosts=topo.hosts, id_to_name=topo.id_to_name, job=topo.job,
                            cluster=args.cluster, incarnation=topo.incarnation)
        if not args.files and args.dir is None:
            raise ExplainError("nothing to explain: pass FILE, - (stdin) or --dir DIR")
        settings, state = load_settings(args.topology), Judged()
        results = [explain_one(name, data, topo=topo, settings=settings, state=state,
                               now=args.now, file=file)
                   for file, name, data in read_payloads(args.files, args.dir)]
    except ExplainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"config": settings.source, "payloads": results,
                          "understood": sum(r["understood"] for r in results),
                          "total": len(results)}, indent=2))
    else:
        print("\n".join(render(r) for r in results))
        bad = sum(not r["understood"] for r in results)
        print(f"{len(results) - bad} of {len(results)} payload(s) understood "
              f"(settings: {settings.source})")
    return 0 if results and all(r["understood"] for r in results) else 1


def add_parser(sub: Any) -> None:
    """Register ``explain`` on the CLI's subparsers."""
    ex = sub.add_parser("explain", help="what would the orchestrator do with these messages?")
    ex.add_argument("files", nargs="*", metavar="FILE",
                    help="payload file(s); - reads stdin")
    ex.add_argument("--dir", type=Path, help="also every *.json in this directory")
    ex.add_argument("--topology", type=Path,
                    help="topology JSON, a run.json, or a run directory (its topology.json or "
                         "run.json): the hosts, job and cluster to judge against; a run "
                         "directory's config.yaml gives the reaction and events settings")
    ex.add_argument("--job", help="this job's name (default: the topology's)")
    ex.add_argument("--cluster", help="this job's cluster name (events.cluster)")
    ex.add_argument("--now", type=float,
                    help="judge at this unix time (default: each payload at its own time)")
    ex.add_argument("--json", action="store_true", help="machine-readable output")

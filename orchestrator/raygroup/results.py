"""Ray's exceptions and the hosts' result dicts as the controller seam's typed statuses.

The one place a Ray exception becomes a ``FailureKind`` and the hosts' per-call dicts become one
``Progress``/``Compiled``: pure functions, tested without a cluster
(``tests/controller/test_ray_mapping.py``, ``test_compile_source.py``).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, RayActorError

from orchestrator.controller.seam import Compiled, GroupFailed, HostsLost, Progress, Restored
from orchestrator.shared.hosts import HostRef
from policies.causes import FailureKind

log = structlog.get_logger(__name__)


def failure_kind(exc: BaseException) -> FailureKind:
    """The one mapping of Ray's exceptions to the seam's closed set."""
    if isinstance(exc, NodeDiedError):
        return FailureKind.NODE_DIED
    if isinstance(exc, ActorUnavailableError):
        return FailureKind.ACTOR_UNAVAILABLE
    if isinstance(exc, (ActorDiedError, RayActorError)):
        return FailureKind.ACTOR_DIED
    return FailureKind.STEP_ERROR


def peer_timeout(message: str) -> bool:
    """Whether a host's step error is its collective giving up on a peer that did not answer
    (Gloo's context or a send/recv timing out): the peer hangs, this host is not at fault."""
    low = message.lower()
    return "DEADLINE_EXCEEDED" in message or ("gloo" in low and "timed out" in low)


_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_STORAGE_TEXT = ("no space left on device", "disk quota exceeded", "[errno 28]", "[errno 122]")


def storage_fault(exc: BaseException) -> str | None:
    """What filled up, when ``exc`` (or what it wraps: Orbax, tensorstore, Ray's task error)
    is a full disk or an exhausted quota; else None. Retrying cannot fix it, so the run stops
    with the fix instead of spending its restart budget."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc, getattr(exc, "cause", None)]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return f"{_STORAGE_ERRNOS[e.errno]}: {e}"[:500]
        todo += [e.__cause__, e.__context__]
    text = str(exc).lower()
    hit = next((t for t in _STORAGE_TEXT if t in text), None)
    if hit is None:
        return None
    line = next(x.strip() for x in str(exc).splitlines() if hit in x.lower())
    return line[:500]


def storage_message(what: str) -> str:
    return (f"A host ran out of storage while writing ({what}). Committed checkpoints are "
            "intact and the run resumes from the last one. Fix: free space on the checkpoint "
            "storage (checkpoint.dir, else run.run_dir) or raise its quota, then run the same "
            "command again; retrying before that would only fail the same way.")


def lost_kind(kind: FailureKind, gone: set[str], hosts: Sequence[HostRef]) -> FailureKind:
    """Refine a failure once the dead nodes are known: every host of a slice gone is a lost
    slice; some hosts' nodes gone is a node death (not just an actor's)."""
    if not gone:
        return kind
    slices: dict[str, set[str]] = {}
    for h in hosts:
        slices.setdefault(h.slice_name, set()).add(h.node_id)
    if any(nodes <= gone for nodes in slices.values()):
        return FailureKind.SLICE_LOST
    return FailureKind.NODE_DIED


def combine(results: Sequence[dict]) -> Progress | HostsLost:
    """Every host's chunk result as one ``Progress``; hosts that disagree on the step they
    stopped at cannot go on together (a failure, never an exception out of the loop)."""
    steps = sorted({int(r["step"]) for r in results})
    if len(steps) != 1:
        return HostsLost(hosts=tuple(range(len(results))), kind=FailureKind.STEP_ERROR,
                         message=f"hosts stopped at different steps {steps}",
                         step_reached=steps[-1] if steps else None)
    committed = [r.get("committed_step") for r in results]
    known = [c for c in committed if c is not None]
    # A step counts as committed only when every host's share of it is.
    agreed = min(known) if known and len(known) == len(committed) else None
    first = results[0]
    return Progress(step=steps[0], committed_step=agreed, records=tuple(first.get("records", ())),
                    stopped_early=any(r.get("stopped_early") for r in results))


def compiled(results: Sequence[dict]) -> Compiled:
    """Every host's compile result as one ``Compiled``: the slowest host's seconds, and
    whether the hosts loaded their stored executables ("loaded"), compiled ("compiled": also
    host 0 compiling once for the group and the others loading its file, ``compile.share``) or
    some of each ("mixed"); why a host with a store compiled is logged."""
    sources = {r.get("source", "compiled") for r in results}
    if _compiled_once(results):
        sources = {"compiled"}
        log.info("executable_shared", hosts=len(results) - 1, key=results[0].get("key"))
    for i, r in enumerate(results):
        if r.get("source") == "compiled" and r.get("key"):
            log.info("executable_compiled", host=i, key=r.get("key"), reason=r.get("reason"))
    first = results[0]
    return Compiled(compile_s=max(float(r["compile_s"]) for r in results),
                    flops=first.get("flops_analytic") or first.get("flops_xla"),
                    tokens=first.get("tokens"),
                    source=sources.pop() if len(sources) == 1 else "mixed",
                    key=first.get("key"))


def _compiled_once(results: Sequence[dict]) -> bool:
    """Host 0 compiled and every other host loaded that same executable (one key)."""
    return (len(results) > 1 and results[0].get("source") == "compiled"
            and all(r.get("source") == "loaded" for r in results[1:])
            and len({r.get("key") for r in results}) == 1 and results[0].get("key") is not None)


def restored(outs: Sequence[dict], note: str = "") -> Restored:
    """The hosts' durable restores as one ``Restored``; hosts that restored different steps are
    a group failure (their states would not fit together)."""
    steps = {o["restored_step"] for o in outs}
    if len(steps) != 1:
        raise GroupFailed(HostsLost(hosts=tuple(range(len(outs))), kind=FailureKind.STEP_ERROR,
                                    message=f"hosts restored different steps "
                                            f"{sorted(steps, key=str)}"))
    o = outs[0]
    return Restored(restored_step=o["restored_step"], step=int(o["step"]),
                    restore_s=float(o["restore_s"]), skipped=tuple(o.get("skipped", ())),
                    tier="durable", tier_reason=note, data=o.get("data"))

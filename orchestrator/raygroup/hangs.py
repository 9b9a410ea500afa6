"""Name the host a step, save, restore or compile hang is about (issue 28, item 11).

At the bound every host still inside the phase is pending, most of them only waiting in a
collective for the one that hung. Each host is asked ``whereabouts()`` at once (a short call
its actor answers on another thread while the phase runs, ``max_concurrency`` >= 4) and
``policies.hangs`` names the ones that did not answer or that the others wait for. The init
phase has its own probe (``runtime.never_joined``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
import structlog

from orchestrator.controller.seam import Hung
from policies.hangs import HangObservation, Whereabouts, name_hung

log = structlog.get_logger(__name__)

PROBE_S = 2.0


def ask_whereabouts(actors: Sequence[Any], hosts: Sequence[int], *,
                    probe_s: float = PROBE_S) -> dict[int, Whereabouts | None]:
    """Each of ``hosts``' answer, asked concurrently; None for no answer within ``probe_s``."""
    refs = {i: actors[i].whereabouts.remote() for i in hosts if 0 <= i < len(actors)}
    ready, _ = (ray.wait(list(refs.values()), num_returns=len(refs), timeout=probe_s)
                if refs else ([], []))
    out: dict[int, Whereabouts | None] = {i: None for i in hosts}
    for i, ref in refs.items():
        if ref not in ready:
            continue
        try:
            got = ray.get(ref)
            out[i] = Whereabouts(step=int(got["step"]), entered=int(got["entered"]),
                                 calls=tuple(got.get("calls", ())))
        except Exception as exc:  # a dead host answers nothing either
            log.debug("whereabouts_failed", host=i, error=str(exc)[:200])
    return out


def named(actors: Sequence[Any], status: Hung, *, probe_s: float = PROBE_S) -> Hung:
    """``status`` with its hosts narrowed to those the hang is about, and why in its message
    (every pending host stays named when none can be told apart)."""
    if status.phase == "init" or not status.hosts:
        return status
    try:
        answers = ask_whereabouts(actors, status.hosts, probe_s=probe_s)
    except Exception as exc:  # naming is a diagnosis: never worse than the hang itself
        log.warning("hang_probe_failed", error=str(exc)[:300])
        return status
    verdict = name_hung(HangObservation(phase=status.phase, pending=tuple(status.hosts),
                                        answers=answers, probe_s=probe_s))
    log.info("hang_named", phase=status.phase, hosts=list(verdict.hosts),
             reasons={str(k): v for k, v in verdict.reasons.items()},
             waiting=list(verdict.waiting))
    return Hung(phase=status.phase, hosts=verdict.hosts, seconds=status.seconds,
                message=verdict.describe(status.phase, status.seconds))

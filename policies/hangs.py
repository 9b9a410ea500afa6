"""Which hosts a hang is about: those that did not answer, or that the others wait for.

A phase that passes its bound has every host still inside it, but in a collective (a step's
all-reduce, Orbax's save and restore barriers) all of them wait for the one that never arrived.
Asked where they are (a short call each host answers while its phase runs), the hosts tell
them apart: one that does not answer at all, one that is steps behind, one that never entered
the step the others are in, one not inside the phase's call at all. When nothing tells them
apart every host still inside the phase is named, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PHASE_CALLS = {"step": ("run_steps",), "save": ("save", "copy_now"), "compile": ("compile",),
               "restore": ("restore", "restore_from_ram", "restore_copies",
                           "restore_from_disk_copy")}
"""The host calls each bounded phase of the driver may wait for."""


@dataclass(frozen=True, kw_only=True)
class Whereabouts:
    """One host's answer: the last step it finished, the last step whose computation it
    entered (``entered == step + 1`` while inside a step) and the long calls it runs now."""

    step: int
    entered: int
    calls: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HangObservation:
    phase: str
    pending: tuple[int, ...]
    """Hosts whose call had not returned at the bound."""
    answers: Mapping[int, Whereabouts | None]
    """Per host, its answer, or None: no answer within the probe's bound (or a dead host)."""
    probe_s: float


@dataclass(frozen=True, kw_only=True)
class HangVerdict:
    hosts: tuple[int, ...]
    """The hosts the hang is about (every pending host when none could be told apart)."""
    reasons: dict[int, str] = field(default_factory=dict)
    """Why each named host is named; empty when none could be told apart."""
    waiting: tuple[int, ...] = ()
    """Pending hosts not named: they wait for the named ones."""

    def describe(self, phase: str, seconds: float) -> str:
        head = f"{phase} did not finish within {seconds:g}s on hosts {list(self.hosts)}"
        if not self.reasons:
            return f"{head} (asked where they were, none could be told apart)"
        why = "; ".join(f"host {i} {r}" for i, r in sorted(self.reasons.items()))
        tail = f"; hosts {list(self.waiting)} waited for them" if self.waiting else ""
        return f"{head} ({why}{tail})"


def name_hung(obs: HangObservation) -> HangVerdict:
    """Name the pending hosts that did not answer, that are not inside the phase's call while
    others are, or that are behind the furthest pending host (fewer steps finished, or the
    next step not entered)."""
    reasons: dict[int, str] = {}
    heard: dict[int, Whereabouts] = {}
    for i in obs.pending:
        w = obs.answers.get(i)
        if w is None:
            reasons[i] = f"did not answer within {obs.probe_s:g}s"
        else:
            heard[i] = w
    calls = set(PHASE_CALLS.get(obs.phase, ()))
    if any(calls & set(w.calls) for w in heard.values()):
        for i, w in heard.items():
            if not calls & set(w.calls):
                reasons[i] = f"was not in the {obs.phase} (in {', '.join(w.calls) or 'no call'})"
    if heard:
        top_step = max(w.step for w in heard.values())
        top_entered = max(w.entered for w in heard.values() if w.step == top_step)
        for i, w in heard.items():
            if i in reasons:
                continue
            if w.step < top_step:
                reasons[i] = f"was at step {w.step} (others at {top_step})"
            elif w.entered < top_entered:
                reasons[i] = f"never entered step {top_entered} (the others wait in it)"
    if not reasons:
        return HangVerdict(hosts=tuple(obs.pending))
    named = tuple(i for i in obs.pending if i in reasons)
    return HangVerdict(hosts=named, reasons={i: reasons[i] for i in named},
                       waiting=tuple(i for i in obs.pending if i not in reasons))

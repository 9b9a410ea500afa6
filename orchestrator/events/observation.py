"""The facts the reaction policy decides on, built in one place for the driver and ``explain``.

``policies.reaction`` is pure: what it decides depends only on the ``ReactionObservation`` it is
given. The controller's reactions (``orchestrator/controller/reactions.py``) and ``python -m
orchestrator.events explain`` both build that observation here, so explain cannot quietly leave
out a field the driver fills (job hosts, step time, health history, cordons) and disagree with
it. ``run_policy`` turns a run's recorded config sections into the policy and events settings the
driver used, so explain judges with the run's own settings rather than defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.events.config import EventsConfig
from orchestrator.events.targeting import Targeting
from policies.health import HealthReport
from policies.reaction import ReactionObservation, ReactionPolicy


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What the run knows when an event is handled, besides the event: the mesh it runs on
    (empty between meshes), the hosts the job holds or held last, the step and its timings, the
    health reports so far (this event's included, see ``health_reports_for``) and the cordons."""

    mesh_hosts: frozenset[str] = frozenset()
    job_hosts: frozenset[str] = frozenset()
    step: int = 0
    step_time_s: float | None = None
    expected_save_s: float | None = None
    health_reports: tuple[HealthReport, ...] = ()
    cordoned: frozenset[str] = frozenset()
    last_health_drain_at: float | None = None


def health_reports_for(event: Any, targeting: Targeting, *, now: float
                       ) -> tuple[HealthReport, ...]:
    """The unhealthy reports an event carries (one per named host for ``host_unhealthy``, none
    otherwise): the caller adds them to the history it passes in ``RunFacts.health_reports``."""
    if event.kind.value != "host_unhealthy":
        return ()
    return tuple(HealthReport(host=n, at=now, healthy=False) for n in sorted(targeting.node_ids))


def build_observation(event: Any, targeting: Targeting, facts: RunFacts, *,
                      now: float) -> ReactionObservation:
    """The reaction policy's input for ``event`` (an ``orchestrator.events.model.Event``)
    resolved to ``targeting``, given the run's ``facts`` at ``now`` (its fields are the
    observation's run-side fields, by name). Pure."""
    return ReactionObservation(
        now=now, kind=event.kind.value, targets=targeting.node_ids,
        job_wide=targeting.job_wide, deadline=event.deadline, window_start=event.window_start,
        window_end=event.window_end, **vars(facts))


def run_policy(config: Mapping[str, Any] | None) -> tuple[ReactionPolicy, EventsConfig]:
    """The reaction policy and events settings of a run from its config as a mapping (the
    driver's RUN_DIR/config.yaml): built by the same code the driver uses (``controller`` ->
    ``ControllerConfig.build_policies``, ``events`` -> ``EventsConfig``); defaults for a missing
    section. Raises ``ConfigError`` naming a bad setting."""
    from orchestrator.controller.config import ControllerConfig
    from orchestrator.shared import configtools

    config = config or {}
    controller = configtools.build(ControllerConfig, config.get("controller"), prefix="controller")
    events = configtools.build(EventsConfig, config.get("events"), prefix="events")
    return controller.build_policies().reaction, events

"""Cordon thresholds, hysteresis for flapping hosts, spacing between health drains."""

from __future__ import annotations

import pytest

from policies.health import HealthKind, HealthObservation, HealthPolicy, HealthReport


def reports(host: str, *events: tuple[float, bool]) -> tuple[HealthReport, ...]:
    return tuple(HealthReport(host=host, at=t, healthy=ok) for t, ok in events)


P = HealthPolicy(cordon_after=3, window_s=300.0, min_drain_interval_s=60.0)


def test_below_threshold_is_watched():
    """Two unhealthy reports of three needed: watch, no cordon, no drain."""
    d = P.decide(HealthObservation(now=20.0, host="h1", reports=reports("h1", (0, False),
                                                                        (10, False))))
    assert d.kind is HealthKind.WATCH and not d.cordon and not d.drain
    assert "2 of 3" in d.reason


def test_threshold_cordons_and_drains():
    """The third unhealthy report within the window cordons and drains the host."""
    d = P.decide(HealthObservation(now=20.0, host="h1",
                                   reports=reports("h1", (0, False), (10, False), (20, False))))
    assert d.kind is HealthKind.CORDON_AND_DRAIN and d.cordon and d.drain
    assert "controller.health.cordon_after=3" in d.reason


def test_old_reports_leave_the_window():
    """Reports older than window_s do not count."""
    d = P.decide(HealthObservation(now=400.0, host="h1",
                                   reports=reports("h1", (0, False), (10, False), (400, False))))
    assert d.kind is HealthKind.WATCH


def test_flapping_host_is_cordoned_once_and_never_drains_again():
    """Unhealthy/healthy/unhealthy...: healthy reports don't reset the count; after the cordon,
    further flaps cause no more drains."""
    flaps = reports("h1", (0, False), (5, True), (10, False), (15, True), (20, False), (25, True))
    d = P.decide(HealthObservation(now=20.0, host="h1", reports=flaps[:5]))
    assert d.kind is HealthKind.CORDON_AND_DRAIN
    later = flaps + reports("h1", (30, False), (40, False), (50, False))
    for now in (30.0, 40.0, 50.0):
        d = P.decide(HealthObservation(now=now, host="h1", reports=later,
                                       cordoned=frozenset({"h1"}), last_health_drain_at=20.0))
        assert d.kind is HealthKind.ALREADY_CORDONED and not d.drain


def test_fatal_report_cordons_immediately():
    """A fatal report (e.g. a hardware failure event) needs no threshold."""
    rep = (HealthReport(host="h2", at=5.0, healthy=False, fatal=True),)
    assert P.decide(HealthObservation(now=5.0, host="h2", reports=rep)).drain


def test_second_host_right_after_a_drain_is_cordoned_but_drain_deferred():
    """Within min_drain_interval_s of the last health drain: cordon now, drain later."""
    rep = reports("h3", (100, False), (101, False), (102, False))
    d = P.decide(HealthObservation(now=102.0, host="h3", reports=rep, last_health_drain_at=80.0))
    assert (d.kind, d.drain_not_before) == (HealthKind.CORDON_DRAIN_LATER, 140.0)
    assert d.cordon and not d.drain
    d = P.decide(HealthObservation(now=150.0, host="h3", reports=rep, last_health_drain_at=80.0))
    assert d.kind is HealthKind.CORDON_AND_DRAIN


def test_host_outside_mesh_is_only_cordoned():
    """A spare host crossing the threshold is cordoned; there is nothing to drain."""
    rep = reports("h4", (0, False), (1, False), (2, False))
    d = P.decide(HealthObservation(now=2.0, host="h4", reports=rep, in_mesh=False))
    assert d.kind is HealthKind.CORDON and d.cordon and not d.drain


def test_other_hosts_reports_do_not_count():
    """Only the observed host's reports count toward its threshold."""
    rep = reports("h5", (0, False)) + reports("h6", (1, False), (2, False))
    assert P.decide(HealthObservation(now=2.0, host="h5", reports=rep)).kind is HealthKind.WATCH


@pytest.mark.parametrize("kw", [dict(cordon_after=0), dict(window_s=0.0),
                                dict(min_drain_interval_s=-1.0)])
def test_invalid_health_policy(kw):
    """Nonsense thresholds are refused."""
    with pytest.raises(ValueError):
        HealthPolicy(**kw)

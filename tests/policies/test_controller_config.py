"""The `controller` config section: defaults, validation with dotted settings, policy bundle."""

from __future__ import annotations

import pytest

from orchestrator.controller.config import ControllerConfig
from orchestrator.shared.configtools import apply_overrides, build
from orchestrator.shared.errors import ConfigError
from policies.causes import StopCause
from policies.chaos import FaultKind
from policies.checkpoint_interval import FixedInterval, SaveObservation, YoungDaly
from policies.preemption import PlacementKind, PlacementObservation
from policies.resize import BatchMode
from policies.restart_budget import GiveUp, RestartObservation, RestartRecord


def make(data: dict) -> ControllerConfig:
    return build(ControllerConfig, data, prefix="controller")


def test_defaults_build_policies():
    """The defaults are valid and produce a complete, working policy bundle."""
    pol = ControllerConfig().build_policies()
    assert pol.budget.limits[StopCause.APPLICATION_ERROR] == 2
    assert set(pol.budget.limits) == set(StopCause)
    assert isinstance(pol.save, FixedInterval)
    assert pol.save.decide(SaveObservation(step=50, last_save_step=0)).save
    assert pol.resize.mode is BatchMode.KEEP
    assert pol.chaos.faults == ()
    d = pol.placement.decide(PlacementObservation(now=0, available_slices=("a",), target_slices=2))
    assert d.kind is PlacementKind.SHRINK


def test_yaml_shape_and_overrides():
    """Nested YAML plus dotted CLI overrides reach the policies."""
    data = apply_overrides(
        {"budgets": {"host_lost": 1}, "checkpoint_interval": {"kind": "young_daly"}},
        ["elastic.enabled=false", "batch_on_resize=scale", "lr_on_scale=sqrt",
         "chaos=[{at_step: 5, host: 1, kind: preempt, deadline_s: 2}]"],
    )
    cfg = make(data)
    pol = cfg.build_policies()
    assert isinstance(pol.save, YoungDaly)
    assert not pol.placement.elastic and not pol.grow.enabled
    assert (pol.resize.mode, pol.resize.lr_scaling) == (BatchMode.SCALE, "sqrt")
    [fault] = pol.chaos.due(5)
    assert (fault.host, fault.kind, fault.deadline_s) == (1, FaultKind.PREEMPT, 2.0)
    first = pol.budget.decide(RestartObservation(cause=StopCause.HOST_LOST, now=0.0))
    assert first.delay_s > 0
    hist = (RestartRecord(cause=StopCause.HOST_LOST, at=0.0),)
    assert isinstance(
        pol.budget.decide(RestartObservation(cause=StopCause.HOST_LOST, now=1.0, history=hist)),
        GiveUp)


@pytest.mark.parametrize(
    ("data", "setting"),
    [
        ({"budgets": {"timeout": -1}}, "controller.budgets.timeout"),
        ({"budgets": {"nope": 1}}, "controller.budgets.nope"),
        ({"backoff": {"base_s": 10, "max_s": 5}}, "controller.backoff.max_s"),
        ({"backoff": {"multiplier": 0.5}}, "controller.backoff.multiplier"),
        ({"backoff": {"jitter": 2}}, "controller.backoff.jitter"),
        ({"max_wait_for_capacity_s": -1}, "controller.max_wait_for_capacity_s"),
        ({"budget_window_s": -5}, "controller.budget_window_s"),
        ({"elastic": {"min_slices": 0}}, "controller.elastic.min_slices"),
        ({"elastic": {"shrink_after_s": 900}}, "controller.elastic.shrink_after_s"),
        ({"batch_on_resize": "double"}, "controller.batch_on_resize"),
        ({"checkpoint_interval": {"kind": "sometimes"}}, "controller.checkpoint_interval.kind"),
        ({"checkpoint_interval": {"every_steps": 0}}, "controller.checkpoint_interval.every_steps"),
        ({"checkpoint_interval": {"kind": "young_daly", "min_steps": 100, "every_steps": 50}},
         "controller.checkpoint_interval.min_steps"),
        ({"checkpoint_interval": {"prior_mtbi_s": 0}},
         "controller.checkpoint_interval.prior_mtbi_s"),
        ({"deadline": {"on_short_deadline": "pray"}}, "controller.deadline.on_short_deadline"),
        ({"deadline": {"save_if_time_left_factor": 0}},
         "controller.deadline.save_if_time_left_factor"),
        ({"health": {"cordon_after": 0}}, "controller.health.cordon_after"),
        ({"health": {"window_s": 0}}, "controller.health.window_s"),
        ({"chaos": [{"at_step": 1, "host": 0, "kind": "meteor"}]}, "controller.chaos[0].kind"),
        ({"chaos": [{"at_step": -1, "host": 0, "kind": "kill"}]}, "controller.chaos[0].at_step"),
        ({"chaos": [{"at_step": 1, "host": -2, "kind": "kill"}]}, "controller.chaos[0].host"),
        ({"chaos": [{"at_step": 1, "host": 0, "kind": "kill"},
                    {"at_step": 1, "host": 0, "kind": "kill"}]}, "controller.chaos[1]"),
        ({"chaos": [{"host": 0, "kind": "kill"}]}, "controller.chaos[0]"),
    ],
)
def test_bad_settings_name_the_setting(data, setting):
    """Each invalid value raises ConfigError naming the full dotted setting and a fix."""
    with pytest.raises(ConfigError) as info:
        make(data)
    assert info.value.setting == setting
    assert info.value.fix

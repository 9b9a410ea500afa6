"""What the controller is built with is passed in: policies (any save rule, e.g. ``any_of``),
listeners and the seams; ``wiring.from_config`` is the one place defaults come from."""

from __future__ import annotations

import dataclasses
import inspect

from orchestrator.config import load_config
from orchestrator.controller.core import Controller
from orchestrator.controller.plugins import ChaosPlugin
from orchestrator.controller.seam import Intake
from orchestrator.controller.wiring import from_config
from orchestrator.events.intake import EventIntake
from policies.checkpoint_interval import FixedInterval, any_of, every_seconds, every_steps
from tests.controller.harness import BASE, make


def test_defaults_come_from_the_config_in_one_function():
    cfg = load_config(None, [*BASE, "controller.chaos=[{at_step: 3, host: 0, kind: kill}]"])
    wiring = from_config(cfg)
    assert isinstance(wiring.policies.save, FixedInterval)
    assert [type(x) for x in wiring.listeners] == [ChaosPlugin]
    assert from_config(load_config(None, BASE)).listeners == ()


def test_an_injected_save_rule_places_the_save_steps(tmp_path):
    """Every 100 steps or every 0.7 s (7 steps of 0.1 s, once the step time is measured):
    the time rule places the saves; the configured 5 never applies."""
    cfg = load_config(None, BASE)
    policies = dataclasses.replace(from_config(cfg).policies,
                                   save=any_of(every_steps(100), every_seconds(0.7)))
    sim = make(tmp_path, policies=policies)
    assert sim.run().state == "SUCCEEDED"
    saves = sorted({s for c in sim.fleet.groups[0].chunks for s in c["save_steps"]})
    assert saves == [7, 14]


def test_the_seams_are_constructor_arguments():
    params = inspect.signature(Controller).parameters
    assert {"make_group", "cluster", "clock", "intake", "policies", "listeners"} <= set(params)


def test_the_event_intake_is_the_intake_protocol():
    """Every method the controller calls on ``run.intake``, with its keyword-only arguments."""
    wanted = {n for n, f in vars(Intake).items() if callable(f) and not n.startswith("_")}
    assert wanted >= {"poll", "submit", "record_action", "replay_unhandled", "replay_kept_out",
                      "set_instance_ids"}
    for name in wanted:
        ours = inspect.signature(getattr(Intake, name)).parameters
        theirs = inspect.signature(getattr(EventIntake, name)).parameters
        assert set(ours) <= set(theirs), name
    assert "id_to_name" in Intake.__annotations__

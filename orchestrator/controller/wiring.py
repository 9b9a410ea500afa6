"""What a controller is built with when its caller does not say: one function from the config.

Why one function: the driver, the simulator and the tests wire a run the same way, and any of
them may replace a part (``Controller(policies=..., listeners=...)``) without the controller
building anything itself. The worker-group factory, the cluster view, the clock and the intake
are always the caller's (they are Ray, a simulation or fakes: never the controller's to choose).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.controller.config import Policies
from orchestrator.controller.listener import RunListener
from orchestrator.controller.plugins import ChaosPlugin


@dataclass(frozen=True)
class Wiring:
    """The pure policies the controller decides with, and the config's listeners (chaos)."""

    policies: Policies
    listeners: tuple[RunListener, ...] = ()


def from_config(cfg: RunConfig) -> Wiring:
    """The policies ``controller.*`` describes; the chaos plug-in when ``controller.chaos``
    lists faults. Add listeners as ``[*from_config(cfg).listeners, yours]``."""
    policies = cfg.controller.build_policies()
    chaos = (ChaosPlugin(policies.chaos),) if policies.chaos.faults else ()
    return Wiring(policies=policies, listeners=chaos)

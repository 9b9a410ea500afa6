"""The run controller: lifecycle handlers over one worker-group seam (no Ray, no JAX here).

Read in this order: ``core`` (the loop), ``context`` (what handlers share), ``planning``,
``forming``, ``running``, ``draining``, ``recovering`` (one module per phase), ``reactions``
(events → drains), ``plugins`` (chaos), ``ledger`` and ``summary`` (run data), ``seam`` (the
protocols the Ray side implements: ``orchestrator.raygroup``), ``config`` (the ``controller``
section of the run's config).

``Controller``, ``Hooks`` and ``RunSummary`` are loaded on first use: the config tree
(``orchestrator.config``) imports ``orchestrator.controller.config``, which must not pull the
controller's handlers (they import the config tree back).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Controller", "Hooks", "RunSummary"]


def __getattr__(name: str) -> Any:
    if name == "Controller":
        from orchestrator.controller.core import Controller
        return Controller
    if name == "Hooks":
        from orchestrator.controller.context import Hooks
        return Hooks
    if name == "RunSummary":
        from orchestrator.controller.summary import RunSummary
        return RunSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

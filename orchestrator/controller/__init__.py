"""The run controller: lifecycle handlers over one worker-group seam (no Ray, no JAX here).

Read in this order: ``core`` (the loop), ``context`` (what handlers share), ``planning``,
``forming``, ``running``, ``draining``, ``recovering`` (one module per phase), ``reactions``
(events → drains), ``listener`` (the one interface of everything that observes or extends a
run), ``plugins`` (chaos), ``ledger`` and ``summary`` (run data), ``seam`` (the protocols the
Ray side implements: ``orchestrator.raygroup``), ``config`` (the ``controller`` section of the
run's config).

``Controller``, ``RunListener`` and ``RunSummary`` are loaded on first use: the config tree
(``orchestrator.config``) imports ``orchestrator.controller.config``, which must not pull the
controller's handlers (they import the config tree back).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Controller", "RunListener", "RunSummary"]


def __getattr__(name: str) -> Any:
    if name == "Controller":
        from orchestrator.controller.core import Controller
        return Controller
    if name == "RunListener":
        from orchestrator.controller.listener import RunListener
        return RunListener
    if name == "RunSummary":
        from orchestrator.controller.summary import RunSummary
        return RunSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

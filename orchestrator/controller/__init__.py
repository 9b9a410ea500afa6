"""The run controller: lifecycle handlers over one worker-group seam (no Ray, no JAX here).

Read in this order: ``core`` (the loop), ``context`` (what handlers share), ``planning``,
``forming``, ``running``, ``draining``, ``recovering`` (one module per phase), ``reactions``
(events → drains), ``plugins`` (chaos), ``ledger`` and ``summary`` (run data), ``seam`` (the
protocols the Ray side implements: ``orchestrator.ray_group``).
"""

from orchestrator.controller.context import Hooks
from orchestrator.controller.core import Controller
from orchestrator.controller.summary import RunSummary

__all__ = ["Controller", "Hooks", "RunSummary"]

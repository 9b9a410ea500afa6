"""The local cluster's error, shared by its modules."""

from __future__ import annotations

from orchestrator.shared.errors import OrchestratorError


class LocalClusterError(OrchestratorError):
    """The local cluster could not be started, found or stopped; the message names the fix."""

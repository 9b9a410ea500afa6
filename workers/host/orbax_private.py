"""Every use of Orbax's private modules (``orbax.checkpoint._src``) by the hosts, in this one
module.

Orbax caches its signaling client, which holds the JAX distributed client of the group it was
made in; a process that leaves its group for the next must drop that cache, and Orbax has no
public call for it. ``pyproject.toml`` pins orbax-checkpoint to the minor series tested here
(``TESTED``), ``USES`` lists each symbol relied on, and ``tests/test_private_apis.py`` checks
they still exist (its failure names this module and what moved). Nothing else in orchestrator/,
workers/ or policies/ imports ``orbax.checkpoint._src`` (``tests/test_import_direction.py``).
"""

from __future__ import annotations

TESTED = "orbax-checkpoint 0.12.x"
USES: tuple[tuple[str, str], ...] = (
    ("orbax.checkpoint._src.futures.signaling_client", "get_signaling_client.cache_clear"),
)
"""(module, attribute path) of every private symbol used below."""


def clear_signaling_client_cache() -> None:
    """Forget the cached signaling client (the next save makes one for the current group)."""
    from orbax.checkpoint._src.futures import signaling_client

    signaling_client.get_signaling_client.cache_clear()

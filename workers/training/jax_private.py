"""Every use of JAX's private modules (``jax._src``) by the hosts, in this one module.

JAX offers no public handle on the client ``jax.distributed.initialize`` started, whose
key-value store a group's processes use to tell each other about a shared compile (Orbax uses
it the same way). ``pyproject.toml`` pins jax to the minor series tested here (``TESTED``),
``USES`` lists each symbol relied on, and ``tests/test_private_apis.py`` checks they still exist
with the shape used (its failure names this module and what moved). Nothing else in
orchestrator/, workers/ or policies/ imports ``jax._src`` (``tests/test_import_direction.py``).
"""

from __future__ import annotations

from typing import Any

TESTED = "jax 0.10.x"
USES: tuple[tuple[str, str], ...] = (
    ("jax._src.distributed", "global_state.client"),
)
"""(module, attribute path) of every private symbol used below."""
CLIENT_CLASS = ("jax._src.lib", "_jax.DistributedRuntimeClient")
"""Where the client's class is, for the check of what ``compile_share.RuntimeWord`` calls on it:
``key_value_set(key, value, allow_overwrite)`` and ``blocking_key_value_get(key, timeout_in_ms)``
(``CLIENT_METHODS``: name -> the parameters used, in order)."""
CLIENT_METHODS = {"key_value_set": ("key", "value", "allow_overwrite"),
                  "blocking_key_value_get": ("key", "timeout_in_ms")}


def distributed_client() -> Any | None:
    """The distributed runtime's client in this process, None when none was started."""
    from jax._src import distributed

    return distributed.global_state.client

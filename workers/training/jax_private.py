"""Every use of JAX's private modules (``jax._src``) by the hosts, in this one module.

JAX offers no public handle on the client ``jax.distributed.initialize`` started, whose
key-value store a group's processes use to tell each other about a shared compile (Orbax uses
it the same way), and no setting for the address its CPU backend's gloo collectives listen on.
``pyproject.toml`` pins jax to the minor series tested here (``TESTED``), ``USES`` lists each
symbol relied on, and ``tests/test_private_apis.py`` checks they still exist with the shape used
(its failure names this module and what moved). Nothing else in orchestrator/, workers/ or
policies/ imports ``jax._src`` (``tests/test_import_direction.py``).
"""

from __future__ import annotations

from typing import Any

TESTED = "jax 0.10.x"
USES: tuple[tuple[str, str], ...] = (
    ("jax._src.distributed", "global_state.client"),
    ("jax._src.config", "cpu_collectives_implementation"),
    ("jax._src.xla_bridge", "register_backend_factory"),
    ("jax._src.xla_bridge", "make_cpu_client"),
    ("jax._src.lib", "_jax.make_gloo_tcp_collectives"),
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


def gloo_host(host: str | None) -> None:
    """Where the gloo collectives of the next CPU backend this process starts listen: on
    ``host`` (loopback, for a group whose processes are all on this machine), or, None, where
    JAX puts them: this machine's host name, resolved (on a cloud VM, its external address,
    though the group's processes talk over loopback). JAX's CPU backend factory is registered
    anew, as JAX registers it; call it before the backend starts (``JaxRuntime.join``)."""
    from jax._src import config, distributed, xla_bridge
    from jax._src.lib import _jax

    def on_host() -> Any:
        client, collectives = distributed.global_state.client, None
        if client is not None and config.cpu_collectives_implementation.value == "gloo":
            collectives = _jax.make_gloo_tcp_collectives(distributed_client=client,
                                                         hostname=host)
        return xla_bridge.make_cpu_client(collectives=collectives)

    factory = xla_bridge.make_cpu_client if host is None else on_host
    xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)

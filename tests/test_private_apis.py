"""The private symbols of Ray, JAX and Orbax that the project relies on, each wrapped in one
module (``orchestrator/raygroup/ray_private.py``, ``workers/training/jax_private.py``,
``workers/host/orbax_private.py``), still exist with the shape used. Run it before widening a
version bound in pyproject.toml; a failure names the wrapper module and what moved. Pure: imports
only, no cluster or runtime is started."""

from __future__ import annotations

import importlib
import inspect
import os
from importlib import metadata
from typing import Any

import pytest

from orchestrator.raygroup import ray_private
from workers.host import orbax_private
from workers.training import jax_private

WRAPPERS = {ray_private: "ray", jax_private: "jax", orbax_private: "orbax-checkpoint"}


def _resolve(wrapper: Any, module: str, path: str) -> Any:
    """``module``'s attribute at ``path``, or a failure naming what moved and where it is used."""
    where = (f"{wrapper.__name__} (tested with {wrapper.TESTED}, installed "
             f"{WRAPPERS[wrapper]} {metadata.version(WRAPPERS[wrapper])})")
    try:
        value: Any = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{where}: private module {module} is gone ({exc}); update {where.split()[0]}")
    for name in path.split("."):
        if not hasattr(value, name):
            pytest.fail(f"{where}: {module}.{path} moved ({name!r} is missing); update "
                        f"{wrapper.__name__} and pin the version it is tested with")
        value = getattr(value, name)
    return value


@pytest.mark.parametrize("wrapper", list(WRAPPERS), ids=lambda w: w.__name__)
def test_every_wrapped_symbol_exists(wrapper):
    assert wrapper.USES, f"{wrapper.__name__} lists no symbol"
    for module, path in wrapper.USES:
        _resolve(wrapper, module, path)


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def test_ray_shapes_used():
    """``get_draining_nodes()`` takes nothing; ``set_sigterm_handler(handler)`` is looked up on
    its module when Ray's Node calls it (so swapping it there takes effect); Ray's services read
    ``ENABLE_RAY_CLUSTER`` from its module when asked (so setting it there takes effect)."""
    draining = _resolve(ray_private, "ray._private.state", "state.get_draining_nodes")
    assert _params(draining) == (), (
        f"{ray_private.__name__}: get_draining_nodes now takes {_params(draining)}")
    handler = _resolve(ray_private, "ray._private.utils", "set_sigterm_handler")
    assert len(_params(handler)) == 1, (
        f"{ray_private.__name__}: set_sigterm_handler now takes {_params(handler)}")
    node = inspect.getsource(importlib.import_module("ray._private.node"))
    assert "ray._private.utils.set_sigterm_handler(" in node, (
        f"{ray_private.__name__}: Ray's Node no longer calls ray._private.utils."
        "set_sigterm_handler through its module; sigterm_handler_skipped would not take effect")
    flag = _resolve(ray_private, "ray._private.ray_constants", "ENABLE_RAY_CLUSTER")
    assert isinstance(flag, bool)
    services = inspect.getsource(importlib.import_module("ray._private.services"))
    assert "ray_constants.ENABLE_RAY_CLUSTER" in services, (
        f"{ray_private.__name__}: Ray's services no longer read ray_constants."
        "ENABLE_RAY_CLUSTER; disable_multi_node would not keep the loopback address")


def test_ray_wrappers_restore_what_they_change(monkeypatch):
    from ray._private import ray_constants, utils

    original = utils.set_sigterm_handler
    with ray_private.sigterm_handler_skipped():
        assert utils.set_sigterm_handler is not original
        assert utils.set_sigterm_handler(lambda *a: None) is None
    assert utils.set_sigterm_handler is original
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")
    ray_private.disable_multi_node()
    assert ray_constants.ENABLE_RAY_CLUSTER is False
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_ray_worker_output_shape_used():
    """``ray.init(log_to_driver=True)`` registers its printer of the workers' lines under
    ``RAY_PRINTER`` on the dispatcher ``route_worker_output`` swaps it on (by name)."""
    dispatcher = _resolve(ray_private, "ray._private.ray_logging",
                          "global_worker_stdstream_dispatcher")
    for method in ("add_handler", "remove_handler", "emit"):
        assert callable(getattr(dispatcher, method, None)), (
            f"{ray_private.__name__}: the dispatcher has no {method} any more")
    worker = inspect.getsource(importlib.import_module("ray._private.worker"))
    assert ("global_worker_stdstream_dispatcher.add_handler(" in worker
            and f'"{ray_private.RAY_PRINTER}"' in worker), (
        f"{ray_private.__name__}: Ray no longer names its printer {ray_private.RAY_PRINTER!r}; "
        "route_worker_output would leave it printing beside ours")
    seen = []
    ray_private.route_worker_output(seen.append)
    try:
        dispatcher.emit({"lines": ["x"]})
    finally:
        ray_private.unroute_worker_output()
    dispatcher.emit({"lines": ["y"]})
    assert seen == [{"lines": ["x"]}]


def test_jax_client_shape_used():
    """The runtime's client is read from ``global_state.client`` (None before initialize), and
    its key-value calls take the parameters ``compile_share.RuntimeWord`` passes."""
    assert jax_private.distributed_client() is None  # no runtime in this process
    cls = _resolve(jax_private, *jax_private.CLIENT_CLASS)
    for method, params in jax_private.CLIENT_METHODS.items():
        fn = getattr(cls, method, None)
        assert fn is not None, f"{jax_private.__name__}: the client has no {method} any more"
        head = (fn.__doc__ or "").splitlines()[0] if fn.__doc__ else ""
        got = tuple(p.split(":")[0].strip() for p in
                    head[head.find("(") + 1:head.rfind(")")].split(",")
                    if p.strip() and p.split(":")[0].strip() != "self")
        assert got[:len(params)] == params, (
            f"{jax_private.__name__}: {method} now takes {got}, RuntimeWord passes {params}")


def test_orbax_cache_is_an_lru_cache():
    getter = _resolve(orbax_private, "orbax.checkpoint._src.futures.signaling_client",
                      "get_signaling_client")
    assert callable(getattr(getter, "cache_clear", None)), (
        f"{orbax_private.__name__}: get_signaling_client is no longer cached with cache_clear")
    orbax_private.clear_signaling_client_cache()


def test_jax_cpu_backend_shape_used():
    """``gloo_host`` builds gloo's collectives with a ``hostname``, hands them to JAX's CPU
    client maker and registers the factory under "cpu" as JAX does (priority 0, not quietly)."""
    gloo = _resolve(jax_private, "jax._src.lib", "_jax.make_gloo_tcp_collectives")
    assert "hostname" in (gloo.__doc__ or ""), (
        f"{jax_private.__name__}: make_gloo_tcp_collectives takes no hostname any more")
    maker = _resolve(jax_private, "jax._src.xla_bridge", "make_cpu_client")
    assert "collectives" in _params(maker), (
        f"{jax_private.__name__}: make_cpu_client now takes {_params(maker)}")
    register = _resolve(jax_private, "jax._src.xla_bridge", "register_backend_factory")
    assert {"priority", "fail_quietly"} <= set(_params(register)), (
        f"{jax_private.__name__}: register_backend_factory now takes {_params(register)}")
    from jax._src import xla_bridge

    cpu = xla_bridge._backend_factories["cpu"]
    assert (cpu.priority, cpu.fail_quietly) == (0, False), (
        f"{jax_private.__name__}: JAX registers its CPU backend as {cpu}; match it")

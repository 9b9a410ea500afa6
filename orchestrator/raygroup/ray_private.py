"""Every use of Ray's private modules (``ray._private``) by the driver, in this one module.

Ray offers no public API for these four needs; a private module may change in any release, so
``pyproject.toml`` pins ray to the minor series tested here (``TESTED``), ``USES`` lists each
symbol relied on, and ``tests/test_private_apis.py`` checks they still exist with the shape used
(its failure names this module and what moved). Nothing else in orchestrator/, workers/ or
policies/ imports ``ray._private`` (``tests/test_import_direction.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

TESTED = "ray 2.60.x"
USES: tuple[tuple[str, str], ...] = (
    ("ray._private.state", "state.get_draining_nodes"),
    ("ray._private.utils", "set_sigterm_handler"),
    ("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),
    ("ray._private.ray_logging", "global_worker_stdstream_dispatcher"),
)
"""(module, attribute path) of every private symbol used below."""


def draining_nodes() -> dict[str, int]:
    """Ray Core's draining nodes, ``{node_id_hex: deadline_ms}`` (0: no deadline): the GCS's
    list, which Ray Train reads through the same private accessor. Needs ``ray.init``."""
    from ray._private.state import state

    return dict(state.get_draining_nodes())


@contextlib.contextmanager
def sigterm_handler_skipped() -> Iterator[None]:
    """Inside the block, Ray's ``set_sigterm_handler`` (which its ``Node`` calls, and Python
    allows from the main thread only) does nothing. Process-wide: the caller serialises."""
    from ray._private import utils

    original = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


def disable_multi_node() -> None:
    """Ray's single-machine mode (the one it uses on macOS/Windows): ``ray.init`` then keeps a
    loopback bootstrap address instead of rewriting it to the machine's external one. Sets the
    switch in this process and, through its environment variable, in the processes it starts."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


RAY_PRINTER = "ray_print_logs"
"""The name ``ray.init(log_to_driver=True)`` gives its handler of the workers' lines."""
WORKER_OUTPUT = "orchestrator_worker_output"


def route_worker_output(handler: Callable[[dict], None]) -> None:
    """The workers' lines (Ray's batches: ``lines``, ``pid``, ``ip``, ``actor_name``,
    ``is_err``) go to ``handler`` instead of Ray's printer, which writes them with colour codes
    and dedup notices onto the driver's own stdout and stderr. Needs
    ``ray.init(log_to_driver=True)`` first; ``unroute_worker_output`` undoes it."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.remove_handler(RAY_PRINTER)
    dispatcher.remove_handler(WORKER_OUTPUT)
    dispatcher.add_handler(WORKER_OUTPUT, handler)


def unroute_worker_output() -> None:
    """The handler of ``route_worker_output`` is dropped (Ray's dispatcher outlives a
    ``ray.shutdown``)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.remove_handler(WORKER_OUTPUT)

"""``ram-ab`` of ``bench/tiers.py``: the RAM tier copies only in alternate blocks of ``BLOCK``
steps (1..10 on, 11..20 off, ...), so one run compares steps with and without it, immune to the
drift between runs minutes apart.

A measurement aid, so it lives here and not in the orchestrator's config: ``python -m
bench.ab_blocks ARGS`` runs the driver (``orchestrator.main`` with ARGS) with one change, a Ray
``worker_process_setup_hook`` (Ray's public ``runtime_env`` API) that every process of the job
runs first, before any host actor exists. The hook (``install``) wraps the one decision the
hosts' replicators ask, ``policies.ram_tier.copy_due``, so it says no in the off blocks; a host
lost in an off block loses up to ``BLOCK`` more steps. The driver itself is untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

BLOCK = 10
HOOK = "bench.ab_blocks.install"


def on_block(step: int, block: int = BLOCK) -> bool:
    """Whether ``step`` is in an on-block: 1..block, 2*block+1..3*block, ..."""
    return ((step - 1) // block) % 2 == 0


def install(block: int = BLOCK) -> None:
    """In a host's process: ``policies.ram_tier.copy_due`` also needs an on-block step (and the
    replicator's name for it, where it was imported already: not in a fresh worker). A second
    call changes nothing."""
    from policies import ram_tier

    every_n: Callable[..., bool] = ram_tier.copy_due
    if getattr(every_n, "ab_block", None) is not None:
        return

    def copy_due(step: int, *, every: int) -> bool:
        return every_n(step, every=every) and on_block(step, block)

    copy_due.ab_block = block  # type: ignore[attr-defined]
    ram_tier.copy_due = copy_due
    replicator = sys.modules.get("workers.ram.replicator")
    if replicator is not None:
        replicator.copy_due = copy_due  # type: ignore[attr-defined]


def with_hook(init: Callable[..., Any]) -> Callable[..., Any]:
    """``ray.init`` that adds ``HOOK`` to the job's runtime_env."""

    def init_with_hook(*args: Any, **kwargs: Any) -> Any:
        env = dict(kwargs.pop("runtime_env", None) or {})
        env["worker_process_setup_hook"] = HOOK
        return init(*args, runtime_env=env, **kwargs)

    return init_with_hook


def main(argv: Sequence[str] | None = None) -> int:
    """The driver, its job's processes hooked (see the module doc)."""
    import ray

    from orchestrator.main import main as driver

    ray.init = with_hook(ray.init)
    return driver(argv)


if __name__ == "__main__":
    sys.exit(main())

"""RUNNING's choice of the RAM tier's copy interval under ``checkpoint.ram.every: auto``.

Before each chunk the driver weighs the measured copy cost (the median of host 0's blocking
seconds over its five newest periodic copies, once five are measured; a group's first
``PACK_WARMUP`` copies, which measure its start, are left out) against the step time with
``policies.ram_interval`` and passes the interval with the chunk, so every host copies at the
same steps (a restore needs every host's copy of one step). A change is logged with its
reason and kept for ``summary.json``.
"""

from __future__ import annotations

from orchestrator.controller.context import Run, log
from policies.ram_interval import IntervalObservation, RamIntervalPolicy

MIN_COPIES = 5
"""Copies measured before the interval is chosen, and how many of the newest it weighs (the
interval follows the copies as they are now, not as they were while the run started)."""


def copy_every(run: Run, save_every: int) -> int | None:
    """The interval for the next chunk; None when the tier is off or its interval is fixed
    (the hosts keep the configured one). ``save_every``: the durable interval in force."""
    ram = run.cfg.checkpoint.ram
    if ram.enabled is not True or ram.every != "auto":
        return None
    led = run.ledger
    policy = RamIntervalPolicy(max_overhead=ram.max_overhead,
                               failures_per_hour=ram.failures_per_hour, max_every=save_every)
    current = led.copy_every or 1
    measured = len(led.pack_costs) >= MIN_COPIES
    choice = policy.choose(IntervalObservation(
        step_s=led.median_step_s(), copy_s=led.median_pack_s(MIN_COPIES) if measured else None,
        deliver_s=led.median_deliver_s(MIN_COPIES) if measured else None,
        current=current,
        failures=sum(not r.announced for r in led.restarts),
        observed_s=run.now() - run.started_at))
    if led.copy_every is None or choice.every != current or (
            choice.overhead is not None and led.copy_intervals
            and led.copy_intervals[-1].get("overhead") is None):
        record = {"step": led.step, **choice.as_record()}
        led.copy_intervals.append(record)
        del led.copy_intervals[1:-20]  # the first choice and the newest ones
        log.info("ram_copy_interval", **record)
    led.copy_every = choice.every
    return choice.every

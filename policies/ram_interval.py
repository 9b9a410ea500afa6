"""How often the RAM tier copies (``checkpoint.ram.every: auto``): as often as its cost allows.

A copy blocks the step for ``copy_s`` (packing the shards into host memory; the sending runs
off the step's path, ``workers/ram/replicator.py``), and a copy packs only once the one before
it is delivered: where delivering takes ``deliver_s`` (measured when a copy had to wait for it),
a copy every ``k`` steps also waits ``deliver_s - k * step_s`` when that is positive. Copying
every ``k`` steps costs ``(copy_s + wait(k)) / (k * step_s)`` of the run, and a host lost
without notice costs about ``k / 2`` steps on average (at most ``k``). So ``k`` is the smallest
power of two whose cost stays within ``max_overhead`` (2 %): a small model copies every step, a
large one every few. (Weighing the wait apart matters: at 1 GiB per host here a copy every step
waited ~0.3 s for the one before, so its blocking seconds priced every interval at that.)

A known failure rate can only make the copies rarer: where failures are so rare that the
Young/Daly interval ``sqrt(2 * copy_s * MTBF)`` is longer than that, it minimises the expected
waste (copies plus lost steps) better, so ``k`` follows it (as a power of two, at most the
durable interval: past it the durable tier is as fresh). The rate is the configured one
(``checkpoint.ram.failures_per_hour``) or, once a failure happened, the one the run observed;
with neither, the budget alone decides. Powers of two and a margin before lowering keep a
noisy measurement from flapping the interval. Pure: no Ray, no JAX, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_POW2 = 12
"""The interval the budget alone may ask for is at most 2**12 steps."""

LOWER_MARGIN = 0.75
"""Lower the interval only when the lower one costs at most this share of the budget."""


@dataclass(frozen=True, kw_only=True)
class IntervalObservation:
    """What the driver measured: medians of recent steps and copies (None: not yet), the
    unannounced failures over ``observed_s`` seconds, and the interval in force."""

    step_s: float | None
    copy_s: float | None
    current: int
    deliver_s: float | None = None
    """Seconds from a copy's pack to its delivery, where measured (None: within a step)."""
    failures: int = 0
    observed_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class IntervalChoice:
    every: int
    reason: str
    overhead: float | None = None
    """The copies' share of step time at ``every`` (None: not measured)."""
    failures_per_hour: float | None = None
    rate_source: str = "none"
    """"configured", "observed" or "none"."""
    young_every: float | None = None

    def as_record(self) -> dict:
        return {"every": self.every, "reason": self.reason,
                "overhead": None if self.overhead is None else round(self.overhead, 5),
                "failures_per_hour": (None if self.failures_per_hour is None
                                      else round(self.failures_per_hour, 4)),
                "rate_source": self.rate_source,
                "young_every": None if self.young_every is None else round(self.young_every, 2)}


@dataclass(frozen=True, kw_only=True)
class RamIntervalPolicy:
    max_overhead: float = 0.02
    failures_per_hour: float | None = None
    max_every: int | None = None
    """The durable save interval in steps, if known: the failure rate never stretches past it."""

    def __post_init__(self) -> None:
        if not 0 < self.max_overhead < 1:
            raise ValueError("max_overhead must be in (0, 1)")

    def choose(self, obs: IntervalObservation) -> IntervalChoice:
        if not obs.step_s or obs.copy_s is None or obs.step_s <= 0:
            return IntervalChoice(every=obs.current, reason="copy and step times not measured "
                                  f"yet: every {obs.current} step(s)")
        copy_s, step_s = max(0.0, obs.copy_s), obs.step_s
        deliver_s = max(0.0, obs.deliver_s or 0.0)

        def cost(k: int) -> float:
            return (copy_s + max(0.0, deliver_s - k * step_s)) / (k * step_s)

        budget_k = next((k for k in (1 << n for n in range(MAX_POW2 + 1))
                         if cost(k) <= self.max_overhead), 1 << MAX_POW2)
        rate, source = self._rate(obs)
        young = None
        target = budget_k
        if rate is not None and copy_s > 0:
            young = math.sqrt(2 * copy_s * 3600.0 / rate) / step_s
            stretched = _pow2_at_most(young)
            if self.max_every is not None:
                stretched = min(stretched, max(1, self.max_every))
            target = max(budget_k, stretched)
        every = obs.current
        if target > obs.current or (target < obs.current
                                    and cost(target) <= LOWER_MARGIN * self.max_overhead):
            every = target
        why = (f"a copy blocks {copy_s * 1e3:.2f} ms of a {step_s * 1e3:.1f} ms step"
               + (f" (and waits for the one before it until {deliver_s * 1e3:.0f} ms after "
                  "its pack)" if deliver_s > step_s else "")
               + f": every {every} step(s) costs {cost(every):.2%} of step time (budget "
               f"{self.max_overhead:.0%})")
        if every > 1 and budget_k == every:
            why += f"; every {every // 2} would cost {cost(every // 2):.2%}"
        if young is not None:
            why += (f"; at {rate:.3g} failures/h ({source}) the Young/Daly interval is "
                    f"{young:.1f} steps")
        if every != target:
            why += f"; kept (the measured {target} is within the margin)"
        return IntervalChoice(every=every, reason=why, overhead=cost(every),
                              failures_per_hour=rate, rate_source=source, young_every=young)

    def _rate(self, obs: IntervalObservation) -> tuple[float | None, str]:
        if self.failures_per_hour is not None:
            return self.failures_per_hour, "configured"
        if obs.failures > 0 and obs.observed_s > 0:
            return obs.failures * 3600.0 / obs.observed_s, "observed"
        return None, "none"


def _pow2_at_most(x: float) -> int:
    return 1 if x < 2 else 1 << math.floor(math.log2(x) + 1e-12)

"""The soak's pure parts: the seeded fault schedule, the history a soak keeps, the invariants
checked on it, and the table (``bench/soak.py`` runs it; no cluster here, so all of it is
unit-tested on synthetic histories).

One schedule for the whole run (the chaos list is on the command line, which every driver life
repeats unchanged, as autoresume resubmits it): a fault fires once per driver life that passes
its step, so a restart that rolls back past a fault meets it again.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

KINDS = ("preempt_short", "preempt_long", "kill", "hang", "unhealthy", "kill_in_save",
         "crash_in_notice", "hang_init")
"""What the soak draws: the chaos plug-in's kinds, the preemption split by its deadline."""

WEIGHTS = {"preempt_short": 3, "preempt_long": 3, "kill": 3, "hang": 1, "unhealthy": 1,
           "kill_in_save": 2, "crash_in_notice": 2, "hang_init": 1}
"""Hangs cost a timeout each (step_s, init_s): drawn less often."""

ONCE = ("unhealthy",)
"""At most once a soak: a cordoned slice stays out, and the run keeps 2 of its 3 slices."""

NOTICE_KINDS = ("preempt_short", "preempt_long", "unhealthy", "crash_in_notice")
IN_ACTOR_KINDS = ("kill", "hang", "kill_in_save", "hang_init")
EXTERNAL = ("none", "sigkill", "sigterm")

CAUSES = ("spot_preemption", "maintenance", "hardware_health", "host_lost", "timeout",
          "application_error", "operator")
"""The driver's stop causes (policies.causes.StopCause): a failure line of the timeline is
``RELEASING`` with a reason ``<cause>: ...``."""

RELEASING_BOUND_S = 6.0
"""A live host's release (a 5 s bound waits on a dead survivor: issue 51's open point)."""
FORMING_SLACK_S = 30.0


@dataclass(frozen=True)
class Fault:
    at_step: int
    host: int
    kind: str
    deadline_s: float | None = None

    def chaos_kind(self) -> str:
        return "preempt" if self.kind.startswith("preempt") else self.kind

    def chaos_entry(self) -> str:
        """One ``controller.chaos`` element in override syntax."""
        s = f"at_step: {self.at_step}, host: {self.host}, kind: {self.chaos_kind()}"
        return s + (f", deadline_s: {self.deadline_s}" if self.deadline_s is not None else "")


@dataclass(frozen=True)
class LifePlan:
    """What is done to one driver life from outside: nothing (it runs to its end), or a
    SIGKILL/SIGTERM ``after_s`` after its start, then maybe a corrupt newest checkpoint."""

    external: str
    after_s: float = 0.0
    corrupt_after: bool = False


@dataclass(frozen=True)
class Plan:
    seed: int
    total_steps: int
    faults: tuple[Fault, ...]
    lives: tuple[LifePlan, ...]
    """The last one is always ``none``: the run is let finish."""


def _deadline(kind: str, rng: random.Random) -> float | None:
    if kind == "preempt_short":
        return round(rng.uniform(0.05, 2.0), 2)
    if kind == "preempt_long":
        return float(rng.choice((20, 30, 45, 60)))
    if kind == "crash_in_notice":
        return float(rng.choice((10, 30)))
    return None


def draw_kind(rng: random.Random, used: set[str]) -> str:
    kinds = [k for k in KINDS if not (k in ONCE and k in used)]
    return rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]


def draw_faults(rng: random.Random, total_steps: int, n: int, hosts: int,
                pair_p: float = 0.3) -> tuple[Fault, ...]:
    """``n`` faults at random steps in [10, total_steps - 5); with probability ``pair_p`` a
    fault is followed 0-3 steps later by a second one on another host (inside the first's
    handover or drain for a notice, inside the same chunk for a kill; a ``hang_init`` strikes
    at the next forming, inside a recovery by construction)."""
    lo, hi = 10, max(11, total_steps - 5)
    out: list[Fault] = []
    used: set[str] = set()
    keys: set[tuple[int, int, str]] = set()
    while len(out) < n:
        step = rng.randrange(lo, hi)
        batch = [(step, rng.randrange(hosts))]
        if rng.random() < pair_p and len(out) + 1 < n:
            batch.append((min(hi - 1, step + rng.randint(0, 3)),
                          (batch[0][1] + rng.randrange(1, hosts)) % hosts))
        for s, h in batch:
            kind = draw_kind(rng, used)
            f = Fault(at_step=s, host=h, kind=kind, deadline_s=_deadline(kind, rng))
            if (f.at_step, f.host, f.chaos_kind()) in keys:
                continue
            keys.add((f.at_step, f.host, f.chaos_kind()))
            used.add(kind)
            out.append(f)
    return tuple(sorted(out, key=lambda f: (f.at_step, f.host)))


def draw_lives(rng: random.Random, n_external: int) -> tuple[LifePlan, ...]:
    lives = [LifePlan(external=rng.choice(("sigkill", "sigterm")),
                      after_s=round(rng.uniform(25.0, 70.0), 1),
                      corrupt_after=rng.random() < 0.35) for _ in range(n_external)]
    return (*lives, LifePlan(external="none"))


def draw_plan(seed: int, minutes: float, total_steps: int, hosts: int = 4) -> Plan:
    """The whole schedule from ``seed``: about 2 faults and 0.5 driver interruptions a minute
    (at least 3 and 1)."""
    rng = random.Random(seed)
    n_faults = max(3, round(2 * minutes))
    faults = draw_faults(rng, total_steps, n_faults, hosts)
    lives = draw_lives(rng, max(1, round(0.5 * minutes)))
    return Plan(seed=seed, total_steps=total_steps, faults=faults, lives=lives)


# ---- history ------------------------------------------------------------------------------


@dataclass
class Life:
    """What one driver life did, as the soak saw it."""

    index: int
    plan: LifePlan
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    external_at: float | None = None
    """When the SIGKILL/SIGTERM was sent (None: not sent, the driver ended first)."""
    wrote_summary: bool = False
    summary: dict = field(default_factory=dict)
    """state, step, lost_steps, restarts, recoveries (of this life's summary.json)."""
    fired: list[dict] = field(default_factory=list)
    """The driver's chaos_armed / chaos_notice lines: {event, kind, host, step, at}."""
    transitions: list[dict] = field(default_factory=list)
    """This life's timeline: {state, prev, at, prev_duration_s, step, reason}."""
    leftovers: list[str] = field(default_factory=list)
    corrupted: list[str] = field(default_factory=list)
    """Files truncated after this life (the newest checkpoint's shards)."""
    note: str = ""

    def to_json(self) -> dict:
        return {**asdict(self), "plan": asdict(self.plan)}


# ---- invariants ---------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    first_life: int | None = None
    """The first life the failure shows in (the reproducing prefix ends there)."""


def check_succeeded(lives: list[Life], total_steps: int) -> Check:
    last = lives[-1] if lives else None
    s = last.summary if last else {}
    ok = bool(last) and last.exit_code == 0 and s.get("state") == "SUCCEEDED" \
        and s.get("step") == total_steps
    return Check("succeeded", ok, f"last life exit {last.exit_code if last else None}, "
                 f"{s.get('state')} at step {s.get('step')} of {total_steps}",
                 None if ok else len(lives) - 1)


def check_summaries(lives: list[Life]) -> Check:
    """Every life whose driver could write wrote summary.json: not one SIGKILLed, by the soak's
    schedule or at the soak's own time bound (exit code None)."""
    exempt = [x.index for x in lives if _sigkilled(x) or x.exit_code is None]
    missing = [x.index for x in lives if not x.wrote_summary and x.index not in exempt]
    return Check("summaries", not missing,
                 f"missing in lives {missing}" if missing else
                 f"every life wrote one (SIGKILLed lives {exempt or 'none'} cannot)",
                 missing[0] if missing else None)


def _sigkilled(life: Life) -> bool:
    return life.plan.external == "sigkill" and life.external_at is not None


def match_faults(life: Life) -> dict:
    """Each fault the driver fired in this life against its summary's recoveries.

    A notice (chaos_notice) matches the recovery or further failure carrying its event id
    ``chaos-<step>-<host>-<kind>``; an armed in-actor fault (chaos_armed) matches the first
    unclaimed failure (an unannounced recovery or a further failure) at or after its arming.
    An armed fault with no failure after it is ``not_fired`` when its group ended first
    (a later RELEASING, DRAINING or a terminal state: a fault is cleared with its group), else
    ``unmatched`` (also when the timeline shows a failure after it that no recovery records).
    A SIGKILLed life wrote no summary: its faults are ``unverifiable``."""
    out: dict[str, list] = {"matched": [], "not_fired": [], "unmatched": [], "unverifiable": []}
    if not life.wrote_summary:
        out["unverifiable"] = list(life.fired)
        return out
    recs = life.summary.get("recoveries") or []
    ids = {r.get("event_id") for r in recs}
    ids |= {f.get("event_id") for r in recs for f in r.get("further_failures") or []}
    failures = sorted([float(r["started_at"]) for r in recs if r.get("kind") == "unannounced"]
                      + [float(f["at"]) for r in recs for f in r.get("further_failures") or []
                         if f.get("at") is not None])
    ends = [float(t["at"]) for t in life.transitions
            if t.get("state") in ("RELEASING", "DRAINING", "SUCCEEDED", "FAILED", "STOPPED")]
    for f in sorted(life.fired, key=lambda f: f["at"]):
        if f["event"] == "chaos_notice":
            hit = any(str(i).startswith(f"chaos-{f['step']}-") and
                      str(i).endswith(f"-{f['kind']}") for i in ids if i)
            out["matched" if hit else "unmatched"].append(f)
            continue
        if f["kind"] == "crash_in_notice":  # its notice is matched above; this is the crash
            out["matched"].append(f)
            continue
        later = [t for t in failures if t >= f["at"] - 0.5]
        if later:
            failures.remove(later[0])
            out["matched"].append(f)
        elif any(at >= f["at"] for at, _, _ in timeline_failures(life)):
            out["unmatched"].append(f)  # it struck (the timeline says so), no recovery record
        elif any(e >= f["at"] for e in ends):
            out["not_fired"].append(f)
        else:
            out["unmatched"].append(f)
    return out


def why_unmatched(f: dict, life: Life, earlier: list[Life]) -> str:
    """What the history says about a fault with no recovery (the report's diagnosis)."""
    if f["event"] == "chaos_notice" and any(
            e["event"] == "chaos_notice" and e["step"] == f["step"] and e["kind"] == f["kind"]
            for x in earlier for e in x.fired):
        return ("an earlier life fired a notice at the same step and kind, so with the same id "
                "chaos-<step>-<host>-<kind>: the event dedupe window (RUN_DIR/"
                "event_dedupe.json) outlives the driver and drops the re-fired notice")
    if not any(t.get("state") == "RUNNING" and float(t["at"]) > f["at"]
               for t in life.transitions):
        return ("the life ended with this fault's recovery still open (no RUNNING after it); "
                "summary.json lists closed recoveries only")
    return "no recovery, further failure or group end after it"


def timeline_failures(life: Life) -> list[tuple[float, str, str]]:
    """(at, cause, reason) of each failure the timeline shows: a RELEASING line whose reason
    starts with a stop cause (a drain's RELEASING says what it saved instead)."""
    out = []
    for t in life.transitions:
        reason = str(t.get("reason") or "")
        cause = reason.split(":", 1)[0]
        if t.get("state") == "RELEASING" and cause in CAUSES and ":" in reason:
            out.append((float(t["at"]), cause, reason))
    return out


def check_causes(lives: list[Life]) -> Check:
    """No failure charged to a cause the soak never injects: it injects no application
    error (a hang must be a timeout), and a corrupt checkpoint is no lost host."""
    wrong = [(x.index, reason) for x in lives for _, cause, reason in timeline_failures(x)
             if cause == "application_error" or (cause == "host_lost" and "unreadable" in reason)]
    return Check("causes", not wrong,
                 "; ".join(f"life {i}: {r[:160]}" for i, r in wrong[:4]) or
                 "every failure charged to a cause the soak injects",
                 wrong[0][0] if wrong else None)


def check_faults_recovered(lives: list[Life]) -> Check:
    per = [(x, match_faults(x)) for x in lives]
    bad = [(x, m["unmatched"]) for x, m in per if m["unmatched"]]
    counts = {k: sum(len(m[k]) for _, m in per) for k in
              ("matched", "not_fired", "unmatched", "unverifiable")}
    detail = ", ".join(f"{k} {v}" for k, v in counts.items())
    if bad:
        detail += "; unmatched: " + "; ".join(
            f"life {x.index}: " + ", ".join(
                f"{f['event']} {f['kind']} host {f['host']} step {f['step']} "
                f"({why_unmatched(f, x, lives[:x.index])})" for f in fs) for x, fs in bad)
    return Check("faults_recovered", not bad, detail, bad[0][0].index if bad else None)


def check_no_leftovers(lives: list[Life]) -> Check:
    bad = [x for x in lives if x.leftovers]
    return Check("no_leftovers", not bad,
                 "; ".join(f"life {x.index}: {len(x.leftovers)} process(es), e.g. "
                           f"{x.leftovers[0][:80]}" for x in bad) or "none in any life",
                 bad[0].index if bad else None)


def state_maxima(lives: list[Life]) -> dict[str, dict]:
    """Longest time spent in each state (from ``prev_duration_s``), and in which life."""
    out: dict[str, dict] = {}
    for x in lives:
        for t in x.transitions:
            prev, d = t.get("prev"), t.get("prev_duration_s")
            if prev is None or d is None:
                continue
            if prev not in out or float(d) > out[prev]["max_s"]:
                out[prev] = {"max_s": round(float(d), 2), "life": x.index, "step": t.get("step"),
                             "then": t.get("state"), "reason": str(t.get("reason"))[:120]}
    return out


def check_time_bounds(lives: list[Life], init_s: float) -> list[Check]:
    bounds = {"RELEASING": RELEASING_BOUND_S, "FORMING": init_s + FORMING_SLACK_S}
    out = []
    for state, bound in bounds.items():
        over = [(x.index, float(t["prev_duration_s"]), t.get("step"), t.get("reason"))
                for x in lives for t in x.transitions
                if t.get("prev") == state and float(t.get("prev_duration_s") or 0) > bound]
        worst = state_maxima(lives).get(state, {}).get("max_s")
        detail = f"max {worst} s, bound {bound} s"
        if over:
            detail += "; over: " + "; ".join(f"life {i} {d:.1f} s at step {s} ({str(r)[:60]})"
                                             for i, d, s, r in over[:5])
        out.append(Check(f"{state.lower()}_bounded", not over, detail,
                         over[0][0] if over else None))
    return out


def history_text(lives: list[Life]) -> str:
    """The history, one block per life: what was done to it, what it fired, how it went."""
    out = []
    for x in lives:
        s = x.summary
        out.append(f"life {x.index}: {x.plan.external}"
                   + (f" after {x.plan.after_s} s" if x.plan.external != "none" else "")
                   + (" (sent)" if x.external_at else "") + f", exit {x.exit_code}, "
                   f"{s.get('state', 'no summary')} at step {s.get('step')}, lost "
                   f"{s.get('lost_steps')}, restarts {s.get('restarts')}"
                   + (f", corrupted {len(x.corrupted)} shard(s) after" if x.corrupted else ""))
        out += [f"  fired {e['event']} {e['kind']} host {e['host']} step {e['step']}"
                for e in x.fired]
        out += [f"  recovery {r.get('kind')} {r.get('cause')} step {r.get('step')} "
                f"{r.get('event_id') or ''} further {len(r.get('further_failures') or [])}"
                for r in s.get("recoveries") or []]
        out += [f"  {t.get('prev')} -> {t.get('state')} after "
                f"{float(t.get('prev_duration_s') or 0):.2f} s, step {t.get('step')}: "
                f"{str(t.get('reason'))[:70]}" for t in x.transitions]
    return "\n".join(out)


def pure_checks(plan: Plan, lives: list[Life], init_s: float) -> list[Check]:
    """The invariants that need only the history (no run dir, no export)."""
    return [check_succeeded(lives, plan.total_steps), check_summaries(lives),
            check_faults_recovered(lives), check_causes(lives), check_no_leftovers(lives),
            *check_time_bounds(lives, init_s)]


def from_json(result: dict) -> tuple[Plan, list[Life]]:
    """A stored soak result's plan and history, to check again (``--recheck``)."""
    p = result["plan"]
    plan = Plan(seed=p["seed"], total_steps=p["total_steps"],
                faults=tuple(Fault(**f) for f in p["faults"]),
                lives=tuple(LifePlan(**lp) for lp in p["lives"]))
    lives = [Life(**{**x, "plan": LifePlan(**x["plan"])}) for x in result["lives"]]
    return plan, lives


def first_failing_life(checks: list[Check]) -> int | None:
    lives = [c.first_life for c in checks if not c.ok and c.first_life is not None]
    return min(lives) if lives else None


# ---- table --------------------------------------------------------------------------------


def classify(event: dict, plan: Plan) -> str | None:
    """The scheduled kind a driver's chaos line belongs to (None: no such fault scheduled).
    A notice line names its host by instance, not index: matched by step and notice kind."""
    if event["event"] == "chaos_armed":
        return next((f.kind for f in plan.faults if f.at_step == event["step"]
                     and f.host == event.get("host") and f.chaos_kind() == event["kind"]), None)
    wanted = ("unhealthy",) if event["kind"] == "host_unhealthy" else (
        "preempt_short", "preempt_long", "crash_in_notice")
    return next((f.kind for f in plan.faults if f.at_step == event["step"]
                 and f.kind in wanted), None)


def fault_counts(plan: Plan, lives: list[Life]) -> dict[str, dict]:
    """Per kind: scheduled; fired by the drivers (a rollback past a fault's step meets it again
    in the next life; a crash_in_notice counts by its notice); and how each firing ended
    (``match_faults``: recovered, not fired, unmatched, unverifiable)."""
    cols = ("scheduled", "fired", "matched", "not_fired", "unmatched", "unverifiable")
    out = {k: dict.fromkeys(cols, 0) for k in KINDS}
    for f in plan.faults:
        out[f.kind]["scheduled"] += 1
    for x in lives:
        for outcome, events in match_faults(x).items():
            for e in events:
                kind = e.get("soak_kind")
                if kind in out and not (kind == "crash_in_notice"
                                        and e["event"] == "chaos_armed"):
                    out[kind]["fired"] += 1
                    out[kind][outcome] += 1
    return out


def render(result: dict) -> str:
    lines = [f"soak: seed {result['seed']}, {result['total_steps']} steps, "
             f"{len(result['lives'])} driver lives, {result['seconds']} s, 1-minute load at "
             f"start {result['validity'].get('max_load_1min_before')} "
             f"({'valid' if result['validity'].get('valid') else 'NOT A RESULT: busy'})", "",
             "| fault kind | scheduled | fired | recovered | not fired | unmatched | "
             "unverifiable |", "|---|---|---|---|---|---|---|"]
    for k, c in result["fault_counts"].items():
        lines.append(f"| {k} | {c['scheduled']} | {c['fired']} | {c.get('matched', '-')} | "
                     f"{c.get('not_fired', '-')} | {c.get('unmatched', '-')} | "
                     f"{c.get('unverifiable', '-')} |")
    lines += ["", "| life | external | exit | state | step | lost | recoveries | fired |",
              "|---|---|---|---|---|---|---|---|"]
    for x in result["lives"]:
        s = x["summary"]
        ext = x["plan"]["external"] + (" +corrupt" if x["corrupted"] else "")
        if x["plan"]["external"] != "none" and x["external_at"] is None:
            ext += " (ended first)"
        elif x["external_at"] and x["transitions"] and x["transitions"][-1]["state"] in (
                "SUCCEEDED", "FAILED") and x["transitions"][-1]["at"] < x["external_at"]:
            ext += " (after its end)"
        lines.append(f"| {x['index']} | {ext} | {x['exit_code']} | {s.get('state', '-')} | "
                     f"{s.get('step', '-')} | {s.get('lost_steps', '-')} | "
                     f"{len(s.get('recoveries') or [])} | {len(x['fired'])} |")
    lines += ["", "| invariant | result | detail |", "|---|---|---|"]
    for c in result["checks"]:
        lines.append(f"| {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {c['detail']} |")
    lines += ["", "| state | max s | life | step | then |", "|---|---|---|---|---|"]
    for st, m in sorted(result["state_max"].items()):
        lines.append(f"| {st} | {m['max_s']} | {m['life']} | {m['step']} | {m['then']} |")
    return "\n".join(lines)

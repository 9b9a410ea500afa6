"""What the autoresume service does about one alert incident: a pure decision.

The service observes (incident, Ray submissions of the run, last heartbeat, per-run history, now)
and this module answers RESUBMIT / STOP_AND_RESUBMIT / NOTHING / GIVE_UP, possibly with a delay
(backoff). Everything that makes autoresume safe lives here so it can be tested without Ray or
Pub/Sub: duplicate and reordered notifications, a live submission that must not be doubled, the
restart budget over a sliding window, exponential backoff, and a startup grace period.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class IncidentState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class IncidentKind(StrEnum):
    """Which alert fired. Named by the alert policy's ``kind`` user label (see deploy/README.md)."""

    HEARTBEAT_ABSENT = "heartbeat_absent"
    JOB_FAILED = "job_failed"
    STEP_STALLED = "step_stalled"
    MFU_LOW = "mfu_low"
    LOSS_NOT_FINITE = "loss_not_finite"
    UNKNOWN = "unknown"


class JobStatus(StrEnum):
    """Ray job status of one submission, plus UNKNOWN when Ray reported something else."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"

    @property
    def live(self) -> bool:
        """A live submission still holds (or will hold) the cluster: never start a second one."""
        return self in (JobStatus.PENDING, JobStatus.RUNNING)


class Action(StrEnum):
    RESUBMIT = "RESUBMIT"
    STOP_AND_RESUBMIT = "STOP_AND_RESUBMIT"
    NOTHING = "NOTHING"
    GIVE_UP = "GIVE_UP"


@dataclass(frozen=True, kw_only=True)
class Incident:
    """One Cloud Monitoring incident as the alert notification describes it."""

    incident_id: str
    run_id: str
    state: IncidentState
    kind: IncidentKind
    started_at: float | None = None  # unix s; None when the notification did not say


@dataclass(frozen=True, kw_only=True)
class Submission:
    """One Ray job submission that belongs to the run."""

    submission_id: str
    status: JobStatus
    start_time: float | None = None  # unix s
    end_time: float | None = None


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """Last training progress the run reported (from its run directory)."""

    step: int
    at: float  # unix s


@dataclass(frozen=True, kw_only=True)
class RunHistory:
    """What autoresume already did for this run (persisted by the service)."""

    submissions: tuple[str, ...] = ()  # submission ids autoresume created, oldest first
    restart_times: tuple[float, ...] = ()  # unix s of each resubmission
    last_action_at: float | None = None
    handled_incidents: frozenset[str] = frozenset()  # incidents already acted on
    closed_incidents: frozenset[str] = frozenset()  # incidents seen closed (closed wins)
    gave_up: bool = False
    stopped: tuple[str, ...] = ()  # submission ids autoresume itself stopped (stalled)

    def restarts_since(self, since: float) -> int:
        return sum(1 for t in self.restart_times if t >= since)


@dataclass(frozen=True, kw_only=True)
class AutoresumeRules:
    """Tunables of the decision; validated by the service config that builds them."""

    max_restarts: int = 5  # resubmissions allowed within ``window_s``
    window_s: float = 6 * 3600.0
    backoff_base_s: float = 30.0  # delay before restart n (n = restarts in window) = base * 2**n
    backoff_max_s: float = 900.0
    startup_grace_s: float = 600.0  # a submission younger than this is "starting", not stalled
    stall_after_s: float = 900.0  # a RUNNING job whose heartbeat is older than this is stalled
    act_on: frozenset[IncidentKind] = field(
        default_factory=lambda: frozenset(
            {IncidentKind.HEARTBEAT_ABSENT, IncidentKind.JOB_FAILED, IncidentKind.STEP_STALLED}
        )
    )


@dataclass(frozen=True, kw_only=True)
class Observation:
    incident: Incident
    submissions: tuple[Submission, ...]  # every Ray submission of this run, any order
    history: RunHistory
    heartbeat: Heartbeat | None
    now: float
    hold: str | None = None  # why the run must not be resumed (operator marker), if it must not

    @property
    def latest(self) -> Submission | None:
        """The newest submission: by start time, then by restart number in the id."""
        return self.newest(self.submissions)

    @staticmethod
    def newest(submissions: tuple[Submission, ...]) -> Submission | None:
        if not submissions:
            return None
        return max(submissions,
                   key=lambda s: (s.start_time or 0.0, restart_number(s.submission_id)))

    @property
    def live(self) -> tuple[Submission, ...]:
        return tuple(s for s in self.submissions if s.status.live)


@dataclass(frozen=True, kw_only=True)
class Decision:
    action: Action
    reason: str
    delay_s: float = 0.0  # > 0: come back after this long and decide again (backoff)
    submission_id: str | None = None  # the id to submit under (RESUBMIT / STOP_AND_RESUBMIT)
    stop_submission_id: str | None = None  # the id to stop first (STOP_AND_RESUBMIT)

    @property
    def acts_now(self) -> bool:
        return self.action in (Action.RESUBMIT, Action.STOP_AND_RESUBMIT) and self.delay_s <= 0


MAX_RESTART_DIGITS = 9
"""A restart number has at most this many digits (a billion restarts): a longer one is no
restart id, so a job id of 5,000 digits costs no int() of them (Python refuses past 4,300)."""
_RESTART_RE = re.compile(rf"-r([0-9]{{1,{MAX_RESTART_DIGITS}}})$")
_RESTART_SHAPED = re.compile(r"-r[0-9]+$")


def restart_shaped(name: str) -> bool:
    """``name`` ends in ``-r<digits>``: as a run name it would be the restart id of the run named
    by its head (run ``exp-r1`` = run ``exp``'s restart 1), so no run may be named so (the run
    config refuses it) and autoresume acts on no run id of that shape."""
    return bool(_RESTART_SHAPED.search(name))


def submission_id_for(run_id: str, n: int) -> str:
    """Deterministic id of restart ``n``: a duplicate submit of the same n is refused by Ray."""
    return f"{run_id}-r{n}"


def restart_number(submission_id: str) -> int:
    """n of ``<run>-r<n>``; -1 for ids not made by :func:`submission_id_for` (e.g. the first)."""
    m = _RESTART_RE.search(submission_id)
    return int(m.group(1)) if m else -1


def restart_of(run_id: str, submission_id: str) -> int | None:
    """n when ``submission_id`` is exactly ``<run_id>-r<n>`` (n decimal digits), else None.

    The one rule for "this id is one of the run's restarts" (ray_jobs.belongs_to and
    :func:`next_submission_id`): the whole id is matched, so ``llm-run-7-r0`` is not run
    ``llm``'s; more than ``MAX_RESTART_DIGITS`` digits is no restart."""
    prefix = f"{run_id}-r"
    digits = submission_id[len(prefix):]
    if (not run_id or not submission_id.startswith(prefix) or not digits
            or len(digits) > MAX_RESTART_DIGITS or not all("0" <= c <= "9" for c in digits)):
        return None
    return int(digits)


def next_submission_id(run_id: str, known_ids: tuple[str, ...]) -> str:
    """One above every restart number of this run seen in Ray or in the history, so ids never
    repeat; ids of other runs (even ones that start with this run's id) do not count."""
    numbers = [n for n in (restart_of(run_id, s) for s in known_ids) if n is not None]
    return submission_id_for(run_id, max([0, *numbers]) + 1)


def backoff_s(rules: AutoresumeRules, restarts_in_window: int) -> float:
    """Exponential backoff before the next restart, capped."""
    if restarts_in_window <= 0:
        return 0.0
    return min(rules.backoff_max_s, rules.backoff_base_s * 2.0 ** (restarts_in_window - 1))


def precheck(inc: Incident, hist: RunHistory, rules: AutoresumeRules) -> Decision | None:
    """The refusals that need only the incident and the history: a NOTHING decision, or None.

    The service asks this before it scans run directories or lists Ray jobs, so a duplicate,
    closed or ignored incident costs nothing; :func:`decide` asks it first too."""
    if restart_shaped(inc.run_id):
        return Decision(action=Action.NOTHING, reason=(
            f"run id {inc.run_id[:100]!r} ends in -r<digits>, the shape of another run's restart "
            "job id: autoresume acts on no such run (it could stop the other run's restart). "
            "Fix: rename the run (run.name without a -r<digits> ending) and submit it again"))
    if hist.gave_up:
        return Decision(action=Action.NOTHING, reason="restart budget already spent for this run")
    if inc.state is IncidentState.CLOSED or inc.incident_id in hist.closed_incidents:
        return Decision(action=Action.NOTHING, reason="incident is closed")
    if inc.incident_id in hist.handled_incidents:
        return Decision(action=Action.NOTHING, reason="incident already handled (duplicate)")
    if inc.kind not in rules.act_on:
        return Decision(
            action=Action.NOTHING, reason=f"incident kind {inc.kind.value} is not acted on"
        )
    return None


def confirms_close(submissions: tuple[Submission, ...]) -> bool:
    """Ray agrees that a CLOSED incident's run needs no resume: one of its submissions is live,
    or the newest one succeeded. A CLOSED claim that Ray contradicts (the run is dead) is not
    honoured, so a forged or stale CLOSED cannot keep a dead run down."""
    if any(s.status.live for s in submissions):
        return True
    latest = Observation.newest(submissions)
    return latest is not None and latest.status is JobStatus.SUCCEEDED


def decide(obs: Observation, rules: AutoresumeRules) -> Decision:
    """The one decision for this incident now. Order matters: cheap refusals first."""
    inc, hist = obs.incident, obs.history
    early = precheck(inc, hist, rules)
    if early is not None:
        return early

    if obs.hold is not None:
        return Decision(action=Action.NOTHING, reason=f"run is on hold: {obs.hold}")
    latest = obs.latest
    if latest is not None and latest.status is JobStatus.SUCCEEDED:
        return Decision(action=Action.NOTHING, reason="run already succeeded")
    if (latest is not None and latest.status is JobStatus.STOPPED
            and latest.submission_id not in hist.stopped):
        return Decision(
            action=Action.NOTHING,
            reason=f"{latest.submission_id} was stopped deliberately (`ray job stop`, not by "
            "autoresume); a stopped run is not resumed",
        )
    if latest is not None and latest.status is JobStatus.UNKNOWN:
        return Decision(action=Action.NOTHING, reason="Ray reports an unknown job status")

    stop_id: str | None = None
    live = obs.live
    if len(live) > 1:
        return Decision(
            action=Action.NOTHING,
            reason=f"{len(live)} live submissions ({', '.join(s.submission_id for s in live)}); "
            "refusing to act until an operator stops the extras",
        )
    if live:
        current = live[0]
        if current.status is JobStatus.PENDING:
            return Decision(action=Action.NOTHING, reason=f"{current.submission_id} is pending")
        started = current.start_time
        if started is not None and inc.started_at is not None and inc.started_at < started:
            return Decision(
                action=Action.NOTHING,
                reason=f"incident predates the live submission {current.submission_id}",
            )
        if started is not None and obs.now - started < rules.startup_grace_s:
            return Decision(
                action=Action.NOTHING, reason=f"{current.submission_id} is still starting up"
            )
        hb = obs.heartbeat
        if hb is not None and obs.now - hb.at < rules.stall_after_s:
            return Decision(
                action=Action.NOTHING,
                reason=f"{current.submission_id} is running and reported step {hb.step} "
                f"{obs.now - hb.at:.0f}s ago",
            )
        stop_id = current.submission_id

    in_window = hist.restarts_since(obs.now - rules.window_s)
    if in_window >= rules.max_restarts:
        return Decision(
            action=Action.GIVE_UP,
            reason=f"{in_window} restarts within {rules.window_s:.0f}s reached the budget of "
            f"{rules.max_restarts}",
        )
    action = Action.STOP_AND_RESUBMIT if stop_id else Action.RESUBMIT
    known = tuple(s.submission_id for s in obs.submissions) + hist.submissions
    new_id = next_submission_id(inc.run_id, known)
    wait = backoff_s(rules, in_window)
    remaining = 0.0
    if hist.last_action_at is not None:
        remaining = max(0.0, hist.last_action_at + wait - obs.now)
    what = f"stalled {stop_id}" if stop_id else (
        f"{latest.submission_id} is {latest.status.value}" if latest else "no live submission"
    )
    return Decision(
        action=action,
        reason=f"{what}; restart {in_window + 1}/{rules.max_restarts} in window",
        delay_s=remaining,
        submission_id=new_id,
        stop_submission_id=stop_id,
    )

"""Autoresume's trust boundary, second round (issue 49, findings 2-4 and the lows on names), driven
as an attacker with write access to the runs area would: a run named like another run's restart,
a run.json that is huge, deep or not the run's own, and a record that asks for more than "this
run again". Ray is the in-memory job table behind the service's own seam
(tests/autoresume/test_service_unit.py); no cluster is started.

What must hold: no other run's job is stopped, one bad run.json stops autoresume for no other
run, and a resubmission is the run's own command (as Ray recorded it) and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from policies.autoresume import JobStatus, Submission, next_submission_id, restart_of
from tests.autoresume.notifications import encode, notification
from tests.autoresume.test_service_unit import Clock, TableRay, audit, make_run, service


def alert(incident_id: str, run_id: str = "run-a", **kw) -> bytes:
    return encode(notification(incident_id=incident_id, run_id=run_id, **kw))


def stale_heartbeat(run_dir: Path) -> None:
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_time": 0.0}) + "\n")


# ---- finding 2: a run name that is another run's restart id -----------------------------------

@pytest.mark.parametrize("name", ["exp-r1", "exp-r0", "llm-run-7-r12", "a-r007"])
def test_run_name_shaped_like_a_restart_id_is_refused_at_config_load(name):
    """`exp-r1` would be run `exp`'s restart job: the config refuses it, naming the fix; a name
    that only looks close (`exp-r`, `exp-r1x`, `exp-retry1`) still loads."""
    with pytest.raises(ConfigError, match=r"run\.name.*-r<digits>.*Fix: pick a name"):
        load_config(None, [f"run.name={name}"])
    for near in ("exp-r", "exp-r1x", "exp-rr1", "exp-retry1", "r1", "exp_r1"):
        assert load_config(None, [f"run.name={near}"]).run.name == near


def test_alert_for_a_run_named_like_a_restart_stops_nothing(tmp_path):
    """A run directory recorded as `exp-r1` (named before the rule) and run `exp`'s restart job
    `exp-r1`, running but silent: an alert for `exp-r1` stops and submits nothing, audited."""
    stale_heartbeat(make_run(tmp_path, "exp"))
    stale_heartbeat(make_run(tmp_path, "exp-r1"))
    ray, clock = TableRay(), Clock()
    ray.jobs["exp-r1"] = Submission(submission_id="exp-r1", status=JobStatus.RUNNING,
                                    start_time=clock.t - 5000)
    svc = service(tmp_path, ray, clock)
    assert svc.handle_message(alert("i-1", "exp-r1", started_at=int(clock.t - 100))) == "nothing"
    assert ray.stopped == [] and ray.submitted == []
    assert "-r<digits>" in audit(tmp_path)[0]["reason"]


# ---- low: a restart number of 5,000 digits ----------------------------------------------------

def test_job_id_with_thousands_of_digits_is_no_restart_and_raises_nothing(tmp_path):
    """`exp-r` + 5,000 digits is no restart of `exp` (Python's int() refuses it): the alert for
    `exp` is handled, and the next restart id is exp-r1."""
    make_run(tmp_path, "exp")
    huge = "exp-r" + "7" * 5000
    ray = TableRay()
    ray.jobs[huge] = Submission(submission_id=huge, status=JobStatus.FAILED)
    ray.jobs["exp-r0"] = Submission(submission_id="exp-r0", status=JobStatus.FAILED)
    svc = service(tmp_path, ray, Clock())
    assert svc.handle_message(alert("i-1", "exp")) == "submitted"
    assert [s for s, _, _ in ray.submitted] == ["exp-r1"]
    assert restart_of("exp", huge) is None and next_submission_id("exp", (huge,)) == "exp-r1"

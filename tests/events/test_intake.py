"""The intake end to end on the local paths: inbox (via the real CLI), submit, records, restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import structlog

from orchestrator.events.config import EventsConfig
from orchestrator.events.inbox import write_inbox
from orchestrator.events.intake import EventIntake
from orchestrator.events.model import EventKind
from tests.events.helpers import event, hosts, lines, poll_until

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "orchestrator.events", *args], cwd=REPO,
                         check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_cli_preemption_notice_reaches_the_intake_through_the_inbox(tmp_path):
    """`publish --kind preemption --host 1 --deadline-s 30` is returned by poll and logged."""
    with EventIntake(EventsConfig(inbox_poll_s=0.05), run_dir=tmp_path, job="demo") as intake:
        sent = _cli("publish", "--run-dir", str(tmp_path), "--kind", "preemption", "--host", "1",
                    "--deadline-s", "30")
        got = poll_until(intake, hosts(2))
        assert [e.id for e in got] == [sent["published"]["id"]]
        assert got[0].kind is EventKind.PREEMPTION_NOTICE
        assert got[0].deadline == sent["published"]["deadline"]
        intake.record_action(got[0], "drain", hosts=[1])
    records = lines(tmp_path / "events.jsonl")
    assert [r["decision"] for r in records] == ["accepted", "action"]
    assert records[1]["details"] == {"hosts": [1]}
    assert list((tmp_path / "inbox").glob("*.json")) == []  # acked = deleted after recording
    status = _cli("status", "--run-dir", str(tmp_path))
    assert status["events"][0]["event"]["id"] == sent["published"]["id"]


def test_malformed_inbox_file_becomes_dead_letter_and_is_removed(tmp_path):
    """A bad file is recorded with its reason and deleted; the intake keeps running."""
    with EventIntake(EventsConfig(inbox_poll_s=0.05), run_dir=tmp_path, job="demo") as intake:
        write_inbox(tmp_path, b"\xff not utf8")
        write_inbox(tmp_path, json.dumps({"schema_version": 1, "id": "ok", "kind": "stop"})
                    .encode())
        got = poll_until(intake, hosts(2))
        assert [e.id for e in got] == ["ok"]
    dead = lines(tmp_path / "dead_letters.jsonl")
    assert len(dead) == 1 and "not UTF-8" in dead[0]["reason"]
    assert dead[0]["payload"]["base64"]
    assert list((tmp_path / "inbox").glob("*.json")) == []


def test_duplicates_dropped_across_restart(tmp_path):
    """The same id after a driver restart is recorded as a duplicate, not returned."""
    hs = hosts(2)
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j") as intake:
        intake.submit(event(id="same"), source="test")
        intake.submit(event(id="same"), source="test")
        assert [e.id for e in intake.poll(hs, 0)] == ["same"]
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j") as intake:
        intake.submit(event(id="same").to_json(), source="test")
        assert intake.poll(hs, 0) == []
    decisions = [r["decision"] for r in lines(tmp_path / "events.jsonl")]
    assert decisions == ["accepted", "duplicate", "duplicate"]


def test_crash_before_dedupe_save_still_dedupes(tmp_path):
    """Ids are rebuilt from events.jsonl even if event_dedupe.json was never written."""
    hs = hosts(2)
    intake = EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j")
    intake.start()
    intake.submit(event(id="x1"), source="t")
    assert len(intake.poll(hs, 0)) == 1
    (tmp_path / "event_dedupe.json").unlink(missing_ok=True)  # "crash": window not saved
    intake._events.close()  # keep the log, skip close()'s save
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j") as again:
        again.submit(event(id="x1"), source="t")
        assert again.poll(hs, 0) == []


def test_stale_and_irrelevant_are_recorded_with_reasons(tmp_path):
    """Stale (host gone, deadline passed, old incarnation) and other-job events are dropped."""
    clock = iter([float(t) for t in range(1000, 2000)]).__next__
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j",
                     clock=clock) as intake:
        with structlog.testing.capture_logs() as logs:
            intake.submit(event(id="gone", host="9"), source="t")
            intake.submit(event(id="late", deadline=10.0), source="t")
            intake.submit(event(id="old", incarnation=0), source="t")
            intake.submit(event(id="other", job="someone-else"), source="t")
            intake.submit(event(id="good", host="vm-0"), source="t")
            got = intake.poll(hosts(2), incarnation=1)
        assert [e.id for e in got] == ["good"]
    by_id = {r["event"]["id"]: r for r in lines(tmp_path / "events.jsonl")}
    assert by_id["gone"]["decision"] == "stale" and "not in the mesh" in by_id["gone"]["reason"]
    assert "deadline passed" in by_id["late"]["reason"]
    assert "incarnation" in by_id["old"]["reason"]
    assert by_id["other"]["decision"] == "irrelevant"
    dropped = {entry["id"] for entry in logs if entry["event"] == "event_dropped"}
    assert dropped == {"gone", "late", "old"}


def test_observers_see_accepted_events_only_and_cannot_break_the_poll(tmp_path):
    """An observer (the emulated cloud) gets each accepted event once, after it is recorded;
    one that raises is logged and the next observer and the poll go on."""
    seen: list[tuple[str, int]] = []

    def broken(ev, hs):
        raise RuntimeError("observer bug")

    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j") as intake:
        intake.add_observer(broken)
        intake.add_observer(lambda ev, hs: seen.append((ev.id, len(hs))))
        intake.submit(event(id="good", host="vm-1"), source="t")
        intake.submit(event(id="good", host="vm-1"), source="t")
        intake.submit(event(id="gone", host="9"), source="t")
        assert [e.id for e in intake.poll(hosts(2), 0)] == ["good"]
    assert seen == [("good", 2)]


def test_submit_never_raises(tmp_path):
    """Garbage of any Python type is a dead letter, not an exception in the driver."""
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j") as intake:
        for junk in (None, 3, ["x"], b"", "{", {"schema_version": True}, object()):
            intake.submit(junk, source="t")  # type: ignore[arg-type]
        assert intake.poll(hosts(), 0) == []
    assert len(lines(tmp_path / "dead_letters.jsonl")) == 7


def test_metadata_watcher_dict_is_accepted(tmp_path):
    """The dicts the host actor's watcher produces are our schema and parse as is."""
    from workers.host.metadata_watcher import PREEMPTED_KEY, MetadataWatcher

    watcher = MetadataWatcher(callback=lambda e: None, host="vm-1", endpoint="http://127.0.0.1:9",
                              clock=lambda: 500.0)
    payload = watcher.event_for(PREEMPTED_KEY, "TRUE", "etag1")
    with EventIntake(EventsConfig(inbox=False), run_dir=tmp_path, job="j",
                     clock=lambda: 501.0) as intake:
        intake.submit(payload, source="metadata")
        got = intake.poll(hosts(2), 0)
    assert [e.kind for e in got] == [EventKind.PREEMPTION_NOTICE]
    assert got[0].deadline == 530.0

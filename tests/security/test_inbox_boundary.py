"""The operator inbox's trust boundary (issue 29, item 6): RUN_DIR/inbox is a control channel
(stop, drain), so it takes files of the run's own user only, from a folder nobody else can write,
and is off by default where Pub/Sub is configured (a run dir on a shared bucket cannot tell
writers apart). A refused file is a dead letter with the reason, stays where it is, and the run
goes on. Tests run as one user: another user's file is simulated through ``owner_of``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.inbox import InboxWatcher, write_inbox
from orchestrator.events.intake import EventIntake
from tests.events.helpers import hosts, lines, poll_until
from tests.events.test_per_run_subscription import RecordingSubscriber


def _stop(event_id: str) -> bytes:
    return json.dumps({"schema_version": 1, "id": event_id, "kind": "stop"}).encode()


def _nothing_polled(intake: EventIntake, seconds: float = 0.6) -> list:
    got: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        intake.wait(0.1)
        got.extend(intake.poll(hosts(2), 0))
    return got


def test_inbox_file_of_another_user_is_dead_lettered_never_run(tmp_path, monkeypatch):
    """A stop event owned by another uid: not returned, one dead letter naming the owner, the
    file left in place; the run's own event after it still arrives."""
    me = os.geteuid()
    forged = write_inbox(tmp_path, _stop("forged-stop"))
    monkeypatch.setattr(InboxWatcher, "owner_of", staticmethod(
        lambda path, st: me + 1 if Path(path).name == forged.name else st.st_uid),
        raising=False)
    with capture_logs() as logs, EventIntake(EventsConfig(inbox_poll_s=0.05), run_dir=tmp_path,
                                             job="demo") as intake:
        assert _nothing_polled(intake) == []
        write_inbox(tmp_path, _stop("own-stop"))
        assert [e.id for e in poll_until(intake, hosts(2))] == ["own-stop"]
        assert _nothing_polled(intake, 0.3) == []  # refused once, not again
    dead = lines(tmp_path / "dead_letters.jsonl")
    assert [d["message_id"] for d in dead] == [forged.name]
    assert f"owned by uid {me + 1}, not by the run's user ({me})" in dead[0]["reason"]
    assert "publish as the run's own user" in dead[0]["fix"]
    assert forged.read_bytes() == _stop("forged-stop")  # nothing lost
    assert "forged-stop" not in (tmp_path / "events.jsonl").read_text()
    refused = [r for r in logs if r["event"] == "inbox_file_refused"]
    assert len(refused) == 1 and refused[0]["file"] == str(forged)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_inbox_folder_writable_by_others_refuses_every_file(tmp_path, mode):
    """While others can write the folder, even the run user's own file is refused (the
    reason names chmod); once fixed, a new file is taken."""
    (tmp_path / "inbox").mkdir()
    os.chmod(tmp_path / "inbox", mode)
    planted = write_inbox(tmp_path, _stop("planted-drain"))
    with EventIntake(EventsConfig(inbox_poll_s=0.05), run_dir=tmp_path, job="demo") as intake:
        assert _nothing_polled(intake) == []
        os.chmod(tmp_path / "inbox", 0o755)
        write_inbox(tmp_path, _stop("after-fix"))
        assert [e.id for e in poll_until(intake, hosts(2))] == ["after-fix"]
    dead = lines(tmp_path / "dead_letters.jsonl")
    assert [d["message_id"] for d in dead] == [planted.name]
    assert f"writable by others (mode {mode:04o})" in dead[0]["reason"]
    assert "chmod go-w" in dead[0]["reason"]
    assert planted.exists()


def test_symlink_in_the_inbox_is_refused_not_followed(tmp_path):
    """A link to a file elsewhere (e.g. another run's event) is a dead letter, not an event."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(_stop("linked"))
    (tmp_path / "inbox").mkdir(mode=0o755)
    (tmp_path / "inbox" / "00000000000000000001-link.json").symlink_to(elsewhere)
    with EventIntake(EventsConfig(inbox_poll_s=0.05), run_dir=tmp_path, job="demo") as intake:
        assert _nothing_polled(intake) == []
    dead = lines(tmp_path / "dead_letters.jsonl")
    assert len(dead) == 1 and "symbolic link" in dead[0]["reason"]
    assert elsewhere.read_bytes() == _stop("linked")


def test_inbox_off_by_default_where_pubsub_is_configured(tmp_path):
    """A topic configured: a stop dropped in RUN_DIR/inbox is never taken (no watcher runs)."""
    cfg = EventsConfig(inbox_poll_s=0.05, pubsub=PubSubConfig(project="my-proj", topic="t-ev"))
    with capture_logs() as logs, EventIntake(cfg, run_dir=tmp_path, job="demo",
                                             subscriber_factory=RecordingSubscriber()) as intake:
        dropped = write_inbox(tmp_path, _stop("bucket-stop"))
        assert _nothing_polled(intake) == []
    assert dropped.exists()
    assert any(r["event"] == "event_inbox_off" and "events.inbox=true" in r["fix"]
               for r in logs)


def test_inbox_setting_default_and_explicit():
    """Unset: on without Pub/Sub or with the local emulator, off with a subscription or topic;
    an explicit true or false wins."""
    topic = PubSubConfig(project="my-proj", topic="t-ev")
    sub = PubSubConfig(project="my-proj", subscription="s-ev")
    assert EventsConfig().inbox_on
    assert EventsConfig(pubsub=PubSubConfig(emulator=True)).inbox_on
    assert not EventsConfig(pubsub=topic).inbox_on
    assert not EventsConfig(pubsub=sub).inbox_on
    assert EventsConfig(pubsub=topic, inbox=True).inbox_on
    assert not EventsConfig(inbox=False).inbox_on


def test_thousands_of_refused_files_leave_a_bounded_number_of_dead_letters(tmp_path):
    """5,000 files in an inbox others can write (issue 49, low): every one refused and left in
    place, but only the first 100 logged and dead-lettered, then one line saying so."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    os.chmod(inbox, 0o777)
    for i in range(5000):
        (inbox / f"{i:020d}-planted.json").write_bytes(_stop(f"planted-{i}"))
    dead: list[str] = []
    watcher = InboxWatcher(tmp_path, lambda *a: pytest.fail("a refused file was delivered"),
                           refuse=lambda data, reason, name: dead.append(name))
    with capture_logs() as logs:
        assert watcher.scan_once() == 0
        assert watcher.scan_once() == 0  # refused once, not again
    assert len(dead) == 100 and dead[0] == f"{0:020d}-planted.json"
    assert watcher.refusals == 5000 and len(os.listdir(inbox)) == 5000
    assert len([r for r in logs if r["event"] == "inbox_file_refused"]) == 100
    assert len([r for r in logs if r["event"] == "inbox_refusals_capped"]) == 1

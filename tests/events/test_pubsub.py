"""The Pub/Sub path against Google's emulator with the real google-cloud-pubsub client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.events.config import EventsConfig, PubSubConfig
from orchestrator.events.intake import PUBSUB_INFO_FILE, EventIntake
from orchestrator.events.model import EventKind
from tests.events.conftest import load_fixture
from tests.events.helpers import event, hosts, lines, poll_until
from tests.events.pubsub_helpers import PubSubFixture
from tests.support.pubsub_emulator import emulator_fixture, emulator_process, gcloud_available

pytestmark = [pytest.mark.emulator,
              pytest.mark.skipif(not gcloud_available(), reason="needs gcloud (emulator)")]

emulator_host = emulator_fixture(scope="module")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ps(emulator_host):
    fixture = PubSubFixture(emulator_host)
    try:
        yield fixture
    finally:
        fixture.close()


def test_all_formats_through_pubsub_and_dead_letter_topic(ps, tmp_path):
    """Own event, alert, log entry are returned; garbage is a dead letter, also republished."""
    ps.publisher.create_topic(request={"name": ps.topic_path(ps.topic + "-dl")}, timeout=10)
    ps.subscriber.create_subscription(request={"name": ps.sub_path(ps.subscription + "-dl"),
                                               "topic": ps.topic_path(ps.topic + "-dl")})
    cfg = EventsConfig(inbox=False, pubsub=ps.config(dead_letter_topic=ps.topic + "-dl"))
    alert = load_fixture("monitoring_alert_incident_open.json")
    alert["incident"]["metric"]["labels"]["instance_name"] = "vm-1"
    entry = load_fixture("logentry_gce_compute_instances_hostError_real.json")
    entry["protoPayload"]["resourceName"] = "projects/p/zones/z/instances/vm-0"
    with EventIntake(cfg, run_dir=tmp_path, job="demo") as intake:
        ps.publish(event(id="own-1", host="1").to_json())
        ps.publish(alert)
        ps.publish(entry)
        ps.publish(b"\x00\x01 not json")
        got = poll_until(intake, hosts(2), count=3)
        assert sorted(e.kind.value for e in got) == ["alert_firing", "host_lost",
                                                     "preemption_notice"]
        deadline = time.monotonic() + 10
        while not lines(tmp_path / "dead_letters.jsonl") and time.monotonic() < deadline:
            time.sleep(0.05)
    dead = lines(tmp_path / "dead_letters.jsonl")
    assert len(dead) == 1 and "JSON" in dead[0]["reason"] and dead[0]["via"] == "pubsub"
    republished = ps.pull(ps.subscription + "-dl")
    assert len(republished) == 1
    assert republished[0].message.data == b"\x00\x01 not json"
    assert "not JSON" in republished[0].message.attributes["dead_letter_reason"]


def test_redelivered_ids_are_handled_once_and_filters_apply(ps, tmp_path):
    """Two messages with one id -> one event; a message failing the attribute filter is ignored."""
    cfg = EventsConfig(inbox=False, pubsub=ps.config(filters={"cluster": "c1"}))
    with EventIntake(cfg, run_dir=tmp_path, job="demo") as intake:
        ps.publish(event(id="dup").to_json(), cluster="c1")
        ps.publish(event(id="dup").to_json(), cluster="c1")
        ps.publish(event(id="elsewhere").to_json(), cluster="c2")
        got = poll_until(intake, hosts(2), count=1)
        time.sleep(0.5)
        got += intake.poll(hosts(2), 0)
    assert [e.id for e in got] == ["dup"]
    decisions = sorted(r["decision"] for r in lines(tmp_path / "events.jsonl"))
    assert decisions == ["accepted", "duplicate", "irrelevant"]


def test_cli_publishes_through_pubsub(ps, tmp_path, emulator_host):
    """`publish --project P --topic T --job J` with PUBSUB_EMULATOR_HOST reaches the running
    intake, with the message attribute job=J that per-run subscriptions filter on."""
    cfg = EventsConfig(inbox=False, pubsub=ps.config())
    with EventIntake(cfg, run_dir=tmp_path, job="demo") as intake:
        env = {**os.environ, "PUBSUB_EMULATOR_HOST": emulator_host}
        out = subprocess.run(
            [sys.executable, "-m", "orchestrator.events", "publish", "--kind", "preemption",
             "--host", "1", "--deadline-s", "30", "--project", "test-project", "--topic",
             ps.topic, "--job", "demo"], cwd=REPO, env=env, check=True, capture_output=True,
            text=True, timeout=60)
        sent = json.loads(out.stdout)
        got = poll_until(intake, hosts(2))
    assert [e.id for e in got] == [sent["published"]["id"]]
    assert got[0].kind is EventKind.PREEMPTION_NOTICE and got[0].target.job == "demo"
    assert sent["attributes"] == {"kind": "preemption_notice", "job": "demo"}


def test_each_run_pulls_its_own_subscription_and_skips_other_runs_events(emulator_host,
                                                                        tmp_path):
    """Two runs on one topic, no subscription configured: each pulls `<topic>-<run>` (made as
    deploy/terraform/pubsub.tf makes it). An operator event published with `--run-dir` of run
    A carries job=A and is acted on by A only; an event with no job reaches both."""
    from tests.events.pubsub_helpers import PROJECT
    from tests.support.pubsub_emulator import unique_name

    ps = PubSubFixture(emulator_host)
    try:
        topic = unique_name("events")
        ps.publisher.create_topic(request={"name": ps.topic_path(topic)}, timeout=10)
        for run in ("run-a", "run-b"):  # the emulator accepts the filter but does not apply it
            ps.subscriber.create_subscription(request={
                "name": ps.sub_path(f"{topic}-{run}"), "topic": ps.topic_path(topic),
                "filter": f'NOT attributes:job OR attributes.job = "{run}"'}, timeout=10)
        cfg = EventsConfig(inbox=False, pubsub=PubSubConfig(
            project=PROJECT, topic=topic, emulator_host=emulator_host,
            reconnect_initial_s=0.2, reconnect_max_s=1.0))
        dir_a, dir_b = tmp_path / "run-a", tmp_path / "run-b"
        dir_a.mkdir()
        (dir_a / "run.json").write_text(json.dumps({"run_id": "run-a", "job": "run-a"}))
        with EventIntake(cfg, run_dir=dir_a, job="run-a") as a, \
                EventIntake(cfg, run_dir=dir_b, job="run-b") as b:
            assert a.pubsub_config.subscription == f"{topic}-run-a"
            assert b.pubsub_config.subscription == f"{topic}-run-b"
            out = subprocess.run(
                [sys.executable, "-m", "orchestrator.events", "publish", "--run-dir", str(dir_a),
                 "--project", PROJECT, "--topic", topic, "--kind", "stop", "--id", "stop-a"],
                cwd=REPO, env={**os.environ, "PUBSUB_EMULATOR_HOST": emulator_host},
                check=True, capture_output=True, text=True, timeout=60)
            assert json.loads(out.stdout)["attributes"]["job"] == "run-a"
            ps.publish(event(id="platform-1", host="1").to_json(), topic=topic)
            got_a = poll_until(a, hosts(2), count=2, timeout_s=20)
            got_b = poll_until(b, hosts(2), count=1, timeout_s=20)
            _wait(lambda: len(lines(dir_b / "events.jsonl")) >= 2)
        assert sorted(e.id for e in got_a) == ["platform-1", "stop-a"]
        assert [e.id for e in got_b] == ["platform-1"]
        skipped = [r for r in lines(dir_b / "events.jsonl") if r["event"]["id"] == "stop-a"]
        assert [r["decision"] for r in skipped] == ["irrelevant"]
        assert "run-a" in skipped[0]["reason"]
    finally:
        ps.close()


def test_emulator_outage_reconnects_and_nothing_is_handled_twice(tmp_path):
    """Kill the emulator mid-run, restart it on the same port: later events arrive, once each."""
    with emulator_process() as emu:
        cfg = EventsConfig(inbox=False, pubsub=PubSubConfig(
            project="test-project", topic="outage-events", subscription="outage-intake",
            emulator=True, emulator_host=emu.host_port, reconnect_initial_s=0.2,
            reconnect_max_s=1.0))
        with EventIntake(cfg, run_dir=tmp_path, job="demo") as intake:
            ps = PubSubFixture.__new__(PubSubFixture)  # reuse helpers without creating
            _attach(ps, emu.host_port, "outage-events", "outage-intake")
            _wait(lambda: intake._pubsub is not None and intake._pubsub.connects >= 1)
            _publish_when_subscribed(ps, event(id="before").to_json())
            assert [e.id for e in poll_until(intake, hosts(2))] == ["before"]
            ps.close()
            connects = intake._pubsub.connects
            emu.stop()
            time.sleep(1.0)  # the driver keeps polling meanwhile: nothing raises
            assert intake.poll(hosts(2), 0) == []
            emu.start()
            _wait(lambda: intake._pubsub.connects > connects, timeout=60)
            _attach(ps, emu.host_port, "outage-events", "outage-intake")
            _publish_when_subscribed(ps, event(id="before").to_json())  # a late redelivery
            _publish_when_subscribed(ps, event(id="after").to_json())
            got = poll_until(intake, hosts(2), count=1, timeout_s=20)
            time.sleep(0.5)
            got += intake.poll(hosts(2), 0)
            ps.close()
            assert intake._pubsub.failures >= 1
        assert [e.id for e in got] == ["after"]
        accepted = [r["event"]["id"] for r in lines(tmp_path / "events.jsonl")
                    if r["decision"] == "accepted"]
        assert accepted == ["before", "after"]


def test_driver_started_emulator_and_cli_via_pubsub(tmp_path, monkeypatch):
    """events.pubsub.emulator with no address: the intake runs its own; the CLI finds it."""
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    cfg = EventsConfig(inbox=False, pubsub=PubSubConfig(emulator=True))
    with EventIntake(cfg, run_dir=tmp_path, job="demo") as intake:
        info = json.loads((tmp_path / PUBSUB_INFO_FILE).read_text())
        _wait(lambda: intake._pubsub is not None and intake._pubsub.connects >= 1, timeout=30)
        env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
        sent = None
        deadline = time.monotonic() + 20
        got: list = []
        while not got and time.monotonic() < deadline:  # the stream may still be opening
            out = subprocess.run(
                [sys.executable, "-m", "orchestrator.events", "publish", "--run-dir",
                 str(tmp_path), "--via", "pubsub", "--kind", "stop", "--id", "stop-1"],
                cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=60)
            sent = json.loads(out.stdout)
            got = poll_until(intake, hosts(2), timeout_s=2)
        assert sent is not None and sent["topic"] == info["topic"]
        assert [e.id for e in got] == ["stop-1"]
    assert not (tmp_path / PUBSUB_INFO_FILE).exists()


def _attach(ps: PubSubFixture, host: str, topic: str, sub: str) -> None:
    from orchestrator.events.pubsub_source import make_publisher, make_subscriber
    from tests.events.pubsub_helpers import PROJECT

    ps.host = host
    ps.admin_cfg = PubSubConfig(project=PROJECT, emulator_host=host)
    ps.publisher = make_publisher(ps.admin_cfg)
    ps.subscriber = make_subscriber(ps.admin_cfg)
    ps.topic, ps.subscription = topic, sub


def _publish_when_subscribed(ps: PubSubFixture, data: dict) -> None:
    """Publish once the intake has (re)created the subscription (else the message has no sub)."""
    _wait(lambda: _sub_exists(ps), timeout=30)
    ps.publish(data)


def _sub_exists(ps: PubSubFixture) -> bool:
    try:
        ps.subscriber.get_subscription(request={"subscription": ps.sub_path(ps.subscription)},
                                       timeout=5)
        return True
    except Exception:
        return False


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_autoresume_dead_letters_and_acks_poison_messages(ps, tmp_path):
    """Regression: a deeply nested message raised RecursionError in the autoresume service and
    was nacked and redelivered forever. Now: dead-lettered with its reason, acked, gone."""
    import threading

    from orchestrator.autoresume.config import AutoresumeConfig
    from orchestrator.autoresume.intake import run_forever
    from orchestrator.autoresume.service import AutoresumeService
    from orchestrator.events.pubsub_source import make_subscriber

    class NoRay:  # no run directory matches, so Ray is never asked
        def __getattr__(self, name):
            raise AssertionError(f"reached Ray ({name})")

    cfg = AutoresumeConfig(state_dir=str(tmp_path / "state"), run_dirs=(str(tmp_path / "r/*"),))
    service = AutoresumeService(cfg, ray=NoRay())
    ps.publish(b"[" * 200_000 + b"]" * 200_000)  # deep, under Pub/Sub's size limit
    ps.publish(b'{"incident": ' * 5000 + b"1" + b"}" * 5000)
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(service, ps.sub_path(ps.subscription),
                                                         stop),
                              kwargs={"subscriber_factory": lambda: make_subscriber(ps.admin_cfg)},
                              daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(service.dead_letters.read()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a nacked message would come straight back within this
    finally:
        stop.set()
        thread.join(timeout=30)
    dead = service.dead_letters.read()
    assert len(dead) == 2
    assert all("nested" in d["reason"] for d in dead)
    assert ps.pull(ps.subscription) == []  # acked: nothing left to redeliver

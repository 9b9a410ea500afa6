"""Fuzz: >= 10,000 generated payloads through the parser, the intake and the autoresume
service's intake (the same bounded parser), a few hundred more through the emulator. The
"hostile" family is deep nesting (a few levels over the limit up to 10^6) and messages of
10 MiB (Pub/Sub's limit) and just over. Zero crashes; every payload accounted for (an event line
or a dead letter in the intake; a recorded outcome in autoresume).
"""

from __future__ import annotations

import base64
import copy
import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from orchestrator.autoresume.config import AutoresumeConfig, PolicyConfig
from orchestrator.autoresume.intake import handle_delivery
from orchestrator.autoresume.service import AutoresumeService
from orchestrator.events import bounded
from orchestrator.events.config import EventsConfig
from orchestrator.events.intake import EventIntake
from orchestrator.events.model import Event, MalformedEvent
from orchestrator.events.parsing import parse_bytes
from tests.autoresume.notifications import notification
from tests.events.conftest import FIXTURES, load_fixture
from tests.events.helpers import hosts, lines
from tests.events.pubsub_helpers import PubSubFixture
from tests.support.pubsub_emulator import emulator_fixture, gcloud_available

BASE = {"deadline": None, "database": None, "derandomize": True,
        "phases": [Phase.explicit, Phase.generate], "suppress_health_check": list(HealthCheck)}
FIXTURE_DOCS = [load_fixture(p.name) for p in sorted(FIXTURES.glob("*.json"))]
OWN = {"schema_version": 1, "id": "fz", "kind": "preemption", "target": {"host": "1"},
       "deadline": 2e9, "observed_at": 1.0, "labels": {"a": "b"}, "message": "m"}
AUTORESUME_DOC = notification(incident_id="fz-1", run_id="run-x")  # what autoresume acts on
FIXTURE_DOCS.append(AUTORESUME_DOC)

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
                | st.text(max_size=16))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=8)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, (*prefix, i))


@st.composite
def mutated_documents(draw):
    """A real-format document with one node replaced by junk or removed."""
    doc = copy.deepcopy(draw(st.sampled_from([*FIXTURE_DOCS, OWN])))
    paths = [p for p in _paths(doc) if p]
    path = draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if draw(st.booleans()):
        parent[path[-1]] = draw(json_values)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def own_events(draw):
    """Our schema with every field drawn from good and bad values."""
    doc = {"schema_version": draw(st.sampled_from([1, 1, 1, 2, "1", None]))}
    for key, good in (("id", st.text(min_size=1, max_size=20)),
                      ("kind", st.sampled_from(["preemption", "stop", "host_lost", "drain",
                                                "alert_firing", "bogus", ""])),
                      ("target", st.fixed_dictionaries({}, optional={
                          "host": st.sampled_from(["0", "1", "9", "vm-1"]) | st.integers(),
                          "slice": st.sampled_from(["slice-a", "slice-b"]) | json_scalars,
                          "job": st.sampled_from(["fuzz", "other"]) | json_scalars})),
                      ("deadline", st.floats() | st.integers() | st.none()),
                      ("incarnation", st.integers(-2, 3) | json_scalars),
                      ("labels", st.dictionaries(st.text(max_size=5), json_scalars, max_size=3))):
        if draw(st.integers(0, 9)) > 0:
            doc[key] = draw(good | json_values) if draw(st.integers(0, 5)) == 0 else draw(good)
    return json.dumps(doc, allow_nan=True).encode()


def _random_json(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice([None, True, False, rng.randint(-10**20, 10**20), rng.random() * 1e12,
                           float("inf"), "", "x" * rng.randint(1, 30), "\u2028\x00\ud7ff", "1"])
    if roll < 0.75:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["id", "kind", "incident", "logName", "schema_version", "target", "k"]):
            _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def seeded_payload(seed: int) -> bytes:
    """Cheap structured mutations of the real fixtures, driven by one hypothesis-drawn seed.

    Hypothesis spends ~8 ms drawing one nested JSON document on this machine; drawing only the
    seed keeps 10,000 payloads within the test-time budget while hypothesis still drives (and
    would shrink) the input.
    """
    rng = random.Random(seed)
    doc = copy.deepcopy(rng.choice([*FIXTURE_DOCS, OWN]))
    mode = rng.randrange(6)
    if mode == 0:  # byte-level damage to a real document
        data = bytearray(json.dumps(doc).encode())
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[pos] = rng.randrange(256)
            elif op == 1:
                del data[pos:pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 5)))
        return bytes(data)
    if mode == 1:  # wrong encodings of valid JSON
        text = json.dumps({**doc, "message": "é✓ preemption"}, ensure_ascii=False)
        return text.encode(rng.choice(["utf-16", "utf-32", "latin-1", "utf-8-sig"]), "replace")
    if mode == 2:  # truncated
        data = json.dumps(doc).encode()
        return data[: rng.randrange(1, max(2, len(data)))]
    if mode == 3:  # random JSON
        return json.dumps(_random_json(rng)).encode()
    if mode == 4 and rng.random() < 0.01:  # huge
        return json.dumps({**OWN, "message": "x" * (2 << 20)}).encode()
    paths = [p for p in _paths(doc) if p]  # structural: replace or drop one node
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if rng.random() < 0.7:
                parent[path[-1]] = _random_json(rng)
            elif isinstance(parent, dict):
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
    return json.dumps(doc).encode()


TEN_MIB = bounded.PUBSUB_MAX_BYTES


def _nested(depth: int, rng: random.Random) -> str:
    """Text of ``depth`` nested containers (lists or objects), closed or left open."""
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}"), ('{"incident":', "}")])
    inner = rng.choice(["1", '"x"', "null", "{}"])
    closed = rng.random() < 0.8
    return opener * depth + inner + (closer * depth if closed else "")


def hostile_payload(seed: int) -> bytes:
    """Deep nesting and huge messages, alone or inside real documents and push envelopes."""
    rng = random.Random(seed)
    mode = rng.randrange(6)
    if mode == 0:  # pure nesting, just over the limit up to a million levels
        depth = rng.choice([bounded.DEFAULT_MAX_DEPTH + 1, 64, 1000, 5000, 100_000, 1_000_000])
        return _nested(depth, rng).encode()
    if mode == 1:  # nesting right around the limit (some must parse)
        return _nested(rng.randint(bounded.DEFAULT_MAX_DEPTH - 3,
                                   bounded.DEFAULT_MAX_DEPTH + 2), rng).encode()
    doc = copy.deepcopy(rng.choice([*FIXTURE_DOCS, OWN]))
    if mode == 2:  # a deep value inside a real document
        text = json.dumps(doc)
        cut = text.rindex("}")
        return (text[:cut] + ', "deep": ' + _nested(rng.choice([40, 900, 20_000]), rng)
                + text[cut:]).encode()
    if mode == 3:  # a deep payload inside a push envelope
        inner = _nested(rng.choice([40, 3000]), rng).encode()
        return json.dumps({"message": {"data": base64.b64encode(inner).decode()},
                           "subscription": "s"}).encode()
    if mode == 4 and rng.random() < 0.12:  # 10 MiB: exactly the limit, or one byte over
        target = TEN_MIB + rng.choice([0, 0, 1])
        head = json.dumps({**doc, "pad": ""})[:-3]  # without the empty pad string and }
        pad = target - len(head.encode()) - 2
        return (head + '"' + "x" * pad + '"}').encode()
    wide = {f"k{i}": i for i in range(rng.choice([10, 1000, 5000]))}  # wide, not deep
    return json.dumps({**doc, "wide": wide}).encode()


PAYLOADS = {
    "json": (json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()), 1000),
    "mutated": (mutated_documents(), 1000),
    "own": (own_events(), 1000),
    "bytes": (st.binary(max_size=300), 1000),
    "seeded": (st.integers(0, 2**32 - 1).map(seeded_payload), 5400),
    "hostile": (st.integers(0, 2**32 - 1).map(hostile_payload), 600),
}


class Harness:
    """One intake and one autoresume service for a whole fuzz test; counts what went in."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        self.intake = EventIntake(EventsConfig(inbox=False), run_dir=self.dir, job="fuzz")
        self.intake.start()
        cfg = AutoresumeConfig(state_dir=str(self.dir / "autoresume"),
                               run_dirs=(str(self.dir / "runs/*"),),
                               policy=PolicyConfig(startup_grace_s=0.0))
        self.autoresume = AutoresumeService(cfg, ray=NoRay(), clock=lambda: 1_800_000_000.0,
                                            sleep=lambda s: None)
        self.autoresume_outcomes: dict[str, int] = {}
        self.sent = 0

    def to_autoresume(self, payload: bytes) -> None:
        """What the subscription callback does; it acks whenever this returns."""
        outcome = handle_delivery(self.autoresume, payload, message_id=str(self.sent))
        assert isinstance(outcome, str)
        self.autoresume_outcomes[outcome] = self.autoresume_outcomes.get(outcome, 0) + 1

    def finish(self) -> tuple[int, int]:
        self.intake.poll(hosts(2), 1)
        self.intake.close()
        return len(lines(self.dir / "events.jsonl")), len(lines(self.dir / "dead_letters.jsonl"))


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_parser_and_intake_never_crash_and_account_for_everything(name, tmp_path):
    """10,000 payloads over five families: Event or MalformedEvent, exactly one record each."""
    strategy, examples = PAYLOADS[name]
    harness = Harness(tmp_path)
    outcomes = {"event": 0, "malformed": 0}

    @settings(max_examples=examples, **BASE)
    @given(payload=strategy)
    def run(payload: bytes) -> None:
        try:
            result = parse_bytes(payload, now=1000.0, source="fuzz")
            assert isinstance(result, Event)
            json.dumps(result.to_json())  # whatever parsed must serialise again
            outcomes["event"] += 1
        except MalformedEvent as exc:
            assert exc.reason
            outcomes["malformed"] += 1
        harness.intake.submit(payload, source="fuzz")
        harness.to_autoresume(payload)
        harness.sent += 1
        if harness.sent % 200 == 0:
            harness.intake.poll(hosts(2), 1)

    with capture_logs():  # thousands of log lines; rendering them would dominate the run
        run()
    events, dead = harness.finish()
    assert harness.sent >= examples
    assert events + dead == harness.sent
    assert harness.intake.counts["ingest_errors"] == 0
    assert outcomes["event"] + outcomes["malformed"] == harness.sent
    assert sum(harness.autoresume_outcomes.values()) == harness.sent
    print(f"fuzz[{name}]: {outcomes} autoresume: {harness.autoresume_outcomes}")
    if name in ("seeded", "mutated", "own", "hostile"):  # valid paths are reached too
        assert outcomes["event"] > 0 and outcomes["malformed"] > 0
    if name in ("seeded", "mutated"):  # autoresume's own path is reached, not only its guard
        assert set(harness.autoresume_outcomes) - {"dead_letter"}
    if name == "hostile":  # every poison message is a recorded dead letter, not a crash
        dead = harness.autoresume.dead_letters.read()
        assert len(dead) == harness.autoresume_outcomes["dead_letter"] > 0
        assert any("nested" in d["reason"] for d in dead)
        assert any("over the" in d["reason"] for d in dead)


class NoRay:
    """The autoresume Ray seam; fuzzed alerts name no run directory, so it is never called."""

    def __getattr__(self, name: str):
        raise AssertionError(f"fuzz reached Ray ({name}); no run should match")


emulator_host = emulator_fixture(scope="module")


@pytest.mark.emulator
@pytest.mark.skipif(not gcloud_available(), reason="needs gcloud (emulator)")
def test_fuzz_through_pubsub(emulator_host, tmp_path):
    """300 generated payloads through the emulator: each acked once recorded, all accounted."""
    rng = random.Random(7)
    payloads: list[bytes] = []
    for i in range(300):
        choice = i % 4
        if choice == 0:
            payloads.append(rng.randbytes(rng.randint(1, 200)))  # Pub/Sub rejects empty
        elif choice == 1:
            doc = copy.deepcopy(rng.choice(FIXTURE_DOCS))
            payloads.append(json.dumps(doc).encode()[: rng.randint(1, 4000)])
        elif choice == 2:
            payloads.append(json.dumps({**OWN, "id": f"fz-{i % 50}",
                                        "target": {"host": str(rng.randint(0, 3))}}).encode())
        else:
            payloads.append(json.dumps(rng.choice(FIXTURE_DOCS)).encode())
    ps = PubSubFixture(emulator_host)
    tmp = tmp_path
    try:
        cfg = EventsConfig(inbox=False, pubsub=ps.config(max_messages=50))
        with EventIntake(cfg, run_dir=tmp, job="fuzz") as intake:
            futures = [ps.publisher.publish(ps.topic_path(ps.topic), p) for p in payloads]
            for future in futures:
                future.result(timeout=30)
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                intake.poll(hosts(2), 0)
                total = len(lines(tmp / "events.jsonl")) + len(lines(tmp / "dead_letters.jsonl"))
                if total >= len(payloads):
                    break
                time.sleep(0.1)
            intake.poll(hosts(2), 0)
            assert intake.counts["ingest_errors"] == 0
        events = lines(tmp / "events.jsonl")
        dead = lines(tmp / "dead_letters.jsonl")
        assert len(events) + len(dead) == len(payloads)
        accepted = [r["event"]["id"] for r in events if r["decision"] == "accepted"]
        assert len(accepted) == len(set(accepted))  # nothing handled twice
    finally:
        ps.close()

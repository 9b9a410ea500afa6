"""``python -m orchestrator.events explain`` over the corpus of documented payload shapes and
their mutations (snake/camel, optional fields dropped, push-wrapped, gcloud-pull lists, base64),
run as an operator would: a fresh process, from the repository."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.events.conftest import FIXTURES

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = ("compute_operation_",)

# fixture stem -> (kind, verdict, reaction) when judged at its own time against TOPOLOGY
EXPECTED = {
    "logentry_gce_compute_instances_baremetalCaretakerPreempted_ASSEMBLED":
        ("preemption_notice", "accepted", "drain_now"),
    "logentry_gce_compute_instances_hostError_real": ("host_lost", "accepted", "drain_now"),
    "logentry_gce_compute_instances_migrateOnHostMaintenance_ASSEMBLED":
        ("live_migration", "accepted", "note"),
    "logentry_gce_compute_instances_preempted_real_gcpdiag":
        ("preemption_notice", "accepted", "drain_now"),
    "logentry_gce_compute_instances_terminateOnHostMaintenance_ASSEMBLED":
        ("maintenance_scheduled", "accepted", "drain_now"),
    "logentry_gce_compute_instances_upcomingMaintenance_ASSEMBLED":
        ("maintenance_scheduled", "accepted", "note"),  # a week ahead, no step time yet
    "logentry_gke_node_MaintenanceWindowScheduled_ASSEMBLED":
        ("maintenance_scheduled", "accepted", "note"),
    "logentry_gke_node_MaintenanceWindowStarted_ASSEMBLED":
        ("maintenance_scheduled", "accepted", "drain_now"),
    "logentry_gke_node_NodeNotReady_ASSEMBLED": ("host_unhealthy", "accepted", "note"),
    "logentry_gke_node_NodeShutdown_ASSEMBLED": ("preemption_notice", "accepted", "drain_now"),
    "logentry_gke_node_TerminateOnHostMaintenance_ASSEMBLED":
        ("maintenance_scheduled", "accepted", "drain_now"),
    "monitoring_alert_incident_closed": ("alert_resolved", "accepted", "note"),
    "monitoring_alert_incident_open": ("alert_firing", "accepted", "note"),
    "monitoring_alert_tpu_worker_open": ("alert_firing", "accepted", "note"),
    # the same preemption as the raw entry, delivered by a push subscription: a duplicate
    "pubsub_push_body_logsink_compute_instances_preempted_ASSEMBLED":
        ("preemption_notice", "duplicate", "ignore"),
}

TOPOLOGY = {
    "job": "demo", "cluster": "tpu-cluster", "incarnation": 0,
    "hosts": [{"index": i, "slice": s, "worker_id": w, "node_id": f"node{i}",
               "node_ip": f"10.0.0.{i + 1}", "instance": name, "devices": 4}
              for i, (s, w, name) in enumerate([
                  ("slice-a", 0, "spot-vm-termination"),
                  ("slice-a", 1, "tpu-host-a-0"),
                  ("slice-b", 0, "longevity-10gb-3h-master-db-node-fac7b27a-0-6"),
                  ("slice-b", 1, "gl7-ilb-mig-a-27j7"),
                  ("slice-c", 0, "t1v-n-9472280f-w-0"),
                  ("slice-c", 1, "gke-tpu-pool-4c2d9a1e-0")])],
}


def explain(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.events", "explain", *args],
                          cwd=REPO, input=stdin, capture_output=True, timeout=120, check=False)


def by_stem(results: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in results:
        stem = Path(re.sub(r"(\[\d+\]| \(base64\)|:\d+)+$", "", r["payload"])).stem
        out.setdefault(stem.split("__")[0], []).append(r)
    return out


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    """The understood fixtures in one directory, and the topology they are judged against."""
    src = tmp_path / "corpus"
    src.mkdir()
    for path in sorted(FIXTURES.glob("*.json")):
        if not path.name.startswith(OPERATIONS):
            shutil.copy(path, src / path.name)
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(TOPOLOGY))
    return src, topo


def test_every_documented_shape_is_understood_and_acted_on(corpus):
    """Each fixture: its kind, the intake's verdict and the reaction, via the real CLI."""
    src, topo = corpus
    proc = explain("--dir", str(src), "--topology", str(topo), "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    results = by_stem(json.loads(proc.stdout)["payloads"])
    assert set(results) == set(EXPECTED)
    for stem, (kind, verdict, reaction) in EXPECTED.items():
        (r,) = results[stem]
        assert (r["event"]["kind"], r["verdict"]["decision"], r["reaction"]["kind"]) == (
            kind, verdict, reaction), stem
    preempted = results["logentry_gce_compute_instances_preempted_real_gcpdiag"][0]
    assert preempted["targets"]["hosts"] == ["0:spot-vm-termination"]
    assert preempted["reaction"]["doomed"] == ["node0"]
    upcoming = results["logentry_gce_compute_instances_upcomingMaintenance_ASSEMBLED"][0]
    assert "waiting for a step time" in upcoming["reaction"]["reason"]
    worker = results["monitoring_alert_tpu_worker_open"][0]
    assert worker["targets"]["hosts"] == ["1:tpu-host-a-0"]  # slice-a, worker 1


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def respell(value, fn, keep=("labels", "annotations", "attributes", "user_labels",
                             "system_labels", "policy_user_labels")):
    if isinstance(value, list):
        return [respell(v, fn, keep) for v in value]
    if not isinstance(value, dict):
        return value
    return {(k if k.startswith("@") else fn(k)): (v if k in keep else respell(v, fn, keep))
            for k, v in value.items()}


OPTIONAL = ("receiveTimestamp", "severity", "url", "summary", "documentation",
            "condition", "scoping_project_id", "scoping_project_number", "authenticationInfo",
            "request", "serviceName", "resource_display_name", "resource_type_display_name")


def drop_optional(value, top=True):
    """Without the fields no decision reads (a LogEntry's own top-level labels included)."""
    if isinstance(value, dict):
        return {k: drop_optional(v, False) for k, v in value.items()
                if k not in OPTIONAL and not (top and k == "labels")}
    return value


def push(doc: dict) -> dict:
    data = base64.b64encode(json.dumps(doc).encode()).decode()
    return {"message": {"data": data, "attributes": {"logging.googleapis.com/timestamp": "x"},
                        "messageId": "1", "publishTime": "2025-03-17T06:00:15.56Z"},
            "subscription": "projects/p/subscriptions/s"}


def mutations(doc: dict) -> dict[str, bytes]:
    """The ways one payload may reach the intake or an operator's terminal."""
    raw = doc
    if "subscription" in doc:  # unwrap a push body to its inner payload
        raw = json.loads(base64.b64decode(doc["message"]["data"]))
    return {
        "snake": json.dumps(respell(raw, _snake)).encode(),
        "camel": json.dumps(respell(raw, _camel)).encode(),
        "minimal": json.dumps(drop_optional(raw)).encode(),
        "push": json.dumps(push(raw)).encode(),
        "pull_list": json.dumps([{"ackId": "a1", "message": push(raw)["message"]}]).encode(),
        "base64": base64.b64encode(json.dumps(raw).encode()),
        "jsonl": (json.dumps(raw) + "\n" + json.dumps(drop_optional(raw)) + "\n").encode(),
    }


def test_mutations_of_every_shape_are_understood_the_same_way(corpus, tmp_path):
    """camel/snake, dropped optional fields, push-wrapped, pull lists, base64, JSON lines: each
    parses to the same kind and id as the original (explain exit 0)."""
    src, topo = corpus
    out = tmp_path / "mutated"
    out.mkdir()
    originals: dict[str, tuple[str, str]] = {}
    first = json.loads(explain("--dir", str(src), "--json").stdout)["payloads"]
    for stem, (r,) in by_stem(first).items():
        originals[stem] = (r["event"]["kind"], r["event"]["id"])
    for path in sorted(src.glob("*.json")):
        for name, data in mutations(json.loads(path.read_text())).items():
            (out / f"{path.stem}__{name}.json").write_bytes(data)
    proc = explain("--dir", str(out), "--topology", str(topo), "--json")
    assert proc.returncode == 0, proc.stdout.decode()[-2000:]
    results = by_stem(json.loads(proc.stdout)["payloads"])
    assert set(results) == set(originals)
    for stem, items in results.items():
        assert len(items) == 8  # 7 files, the JSON-lines file holds two payloads
        for r in items:
            assert r["understood"], (r["payload"], r["verdict"])
            assert (r["event"]["kind"], r["event"]["id"]) == originals[stem], r["payload"]


def test_dead_letter_sets_exit_1_and_says_why(corpus):
    """A Compute Operation is not understood: exit 1, reason and fix printed."""
    op = FIXTURES / "compute_operation_preempted_real_gcpdiag.json"
    proc = explain(str(op))
    assert proc.returncode == 1
    text = proc.stdout.decode()
    assert "DEAD_LETTER" in text and "log sink" in text and "0 of 1" in text


def test_stdin_and_run_directory_topology(corpus, tmp_path):
    """`explain -` reads stdin; --topology RUN_DIR uses its topology.json (job from run.json
    otherwise)."""
    src, topo = corpus
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "demo-1", "job": "other-job"}))
    data = (src / "monitoring_alert_incident_open.json").read_bytes()
    other = json.loads(explain("-", "--topology", str(run_dir), "--json", stdin=data).stdout)
    assert other["payloads"][0]["verdict"]["decision"] == "irrelevant"  # job "demo" != other
    shutil.copy(topo, run_dir / "topology.json")
    ours = explain("-", "--topology", str(run_dir), stdin=data)
    assert ours.returncode == 0
    assert "reaction: note" in ours.stdout.decode()


def test_bad_usage_exits_2(tmp_path):
    """No input, or an unreadable topology: exit 2 with the fix."""
    assert explain().returncode == 2
    proc = explain("-", "--topology", str(tmp_path / "missing.json"), stdin=b"{}")
    assert proc.returncode == 2 and b"topology" in proc.stderr



# ---- in-process: the run's own settings, the file each result came from ----------------------

UNHEALTHY = {"schema_version": 1, "kind": "host_unhealthy", "source": "test", "id": "sick-1",
             "target": {"job": "demo", "host": "tpu-host-a-0", "host_kind": "instance"}}
RUN_SETTINGS = ["run.name=demo", "controller.health.cordon_after=1",
                "controller.health.min_drain_interval_s=0", "events.stale_grace_s=5"]


def explain_here(capsys, *args: str) -> tuple[int, dict]:
    """The CLI in this process (no subprocess): exit code and its --json output."""
    from orchestrator.events.cli import main

    code = main(["explain", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def driver_reaction(overrides: list[str], topology: Path, payload: dict, now: float) -> dict:
    """What the driver's reactions decide for ``payload`` on the topology's mesh under a run
    config: its policy built from the config, its observation from the shared builder."""
    from orchestrator.config import load_config
    from orchestrator.events.explain import load_topology
    from orchestrator.events.model import Event
    from orchestrator.events.observation import RunFacts, build_observation, health_reports_for
    from orchestrator.events.targeting import resolve_targets

    cfg = load_config(None, overrides)
    hosts = load_topology(topology).hosts
    event = Event.from_json(payload, now=now)
    targeting = resolve_targets(event, hosts, cluster=cfg.events.cluster)
    mesh = frozenset(h.node_id for h in hosts)
    facts = RunFacts(mesh_hosts=mesh, job_hosts=mesh,
                     health_reports=health_reports_for(event, targeting, now=now))
    r = cfg.controller.build_policies().reaction.decide(
        build_observation(event, targeting, facts, now=now))
    return {"kind": r.kind.value, "reason": r.reason, "doomed": sorted(r.doomed),
            "cordon": sorted(r.cordon)}


def test_run_config_gives_the_drivers_verdict(tmp_path, capsys):
    """--topology RUN_DIR judges with the run's config.yaml (here: cordon on the first unhealthy
    report), as the driver's builder does; the defaults (cordon after 3) would only note it."""
    import yaml

    from orchestrator.config import load_config
    from orchestrator.shared import configtools

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "topology.json").write_text(json.dumps(TOPOLOGY))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        configtools.to_dict(load_config(None, RUN_SETTINGS)), sort_keys=False))
    (run_dir / "ev.json").write_text(json.dumps(UNHEALTHY))
    now = 1_700_000_000.0
    code, out = explain_here(capsys, str(run_dir / "ev.json"), "--topology", str(run_dir),
                             "--now", str(now))
    assert code == 0 and out["config"] == str(run_dir / "config.yaml")
    (r,) = out["payloads"]
    seen = {k: r["reaction"][k] for k in ("kind", "reason", "doomed", "cordon")}
    assert seen == driver_reaction(RUN_SETTINGS, run_dir / "topology.json", UNHEALTHY, now)
    assert seen["kind"] == "cordon_and_replace" and seen["cordon"] == ["node1"]
    (tmp_path / "bare.json").write_text(json.dumps(TOPOLOGY))  # no config.yaml beside it
    _, bare = explain_here(capsys, str(run_dir / "ev.json"), "--topology",
                           str(tmp_path / "bare.json"), "--now", str(now))
    assert bare["config"] == "defaults"
    r = bare["payloads"][0]["reaction"]
    assert {k: r[k] for k in ("kind", "reason", "doomed", "cordon")} == driver_reaction(
        ["run.name=demo"], run_dir / "topology.json", UNHEALTHY, now)
    assert r["kind"] == "note"


def test_each_result_names_its_file(tmp_path, capsys):
    """--dir ... --json: every result says which file it came from (a list's items included)."""
    src = tmp_path / "in"
    src.mkdir()
    one = {**UNHEALTHY, "kind": "operator_drain", "id": "d-1"}
    (src / "a.json").write_text(json.dumps(one))
    (src / "b.json").write_text(json.dumps([{**one, "id": "d-2"}, {**one, "id": "d-3"}]))
    code, out = explain_here(capsys, "--dir", str(src), "--job", "demo")
    assert code == 0
    assert [(r["file"], r["payload"]) for r in out["payloads"]] == [
        (str(src / "a.json"), str(src / "a.json")),
        (str(src / "b.json"), f"{src / 'b.json'}[0]"),
        (str(src / "b.json"), f"{src / 'b.json'}[1]")]


def test_without_a_topology_a_named_host_is_unknown_not_stale(tmp_path, capsys):
    """No --topology: a current preemption naming an instance is `unknown_target` with the
    --topology fix, not stale; a notice past its deadline is still stale; a topology without
    that instance still calls it stale (not in the mesh)."""
    sample = str(FIXTURES / "logentry_gce_compute_instances_preempted_real_gcpdiag.json")
    code, out = explain_here(capsys, sample)
    (r,) = out["payloads"]
    assert code == 0 and r["event"]["kind"] == "preemption_notice"
    assert r["verdict"]["decision"] == "unknown_target"
    assert "instance 'spot-vm-termination'" in r["verdict"]["reason"]
    assert r["targets"]["hosts"] is None
    assert r["reaction"]["kind"] == "unknown" and "--topology RUN_DIR" in r["reaction"]["reason"]
    _, late = explain_here(capsys, sample, "--now", str(2_000_000_000))
    assert late["payloads"][0]["verdict"]["decision"] == "stale"
    assert "deadline passed" in late["payloads"][0]["verdict"]["reason"]
    others = tmp_path / "topology.json"
    others.write_text(json.dumps({**TOPOLOGY, "hosts": TOPOLOGY["hosts"][1:]}))
    _, mesh = explain_here(capsys, sample, "--topology", str(others))
    assert mesh["payloads"][0]["verdict"] == {
        "decision": "stale", "reason": "instance 'spot-vm-termination' is not in the mesh"}
    from orchestrator.events.cli import main

    assert main(["explain", sample]) == 0
    text = capsys.readouterr().out
    assert "UNKNOWN_TARGET" in text and "STALE" not in text and "hosts:    unknown" in text

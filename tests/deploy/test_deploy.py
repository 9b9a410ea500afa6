"""deploy/ stays consistent: Terraform formatted, KubeRay YAML valid and matching its topology,
every referenced topic/channel/subscription defined, alerts wired to the Pub/Sub channel, no
public exposure of the Ray head, and the autoresume config in the manifest loads."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.autoresume.config import AutoresumeConfig
from orchestrator.shared.configtools import build
from policies.autoresume import IncidentKind

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TF = DEPLOY / "terraform"
KUBERAY = DEPLOY / "kuberay"
CHIPS_PER_HOST = {"ct6e-standard-4t": 4, "ct5p-hightpu-4t": 4, "ct4p-hightpu-4t": 4,
                  "ct5lp-hightpu-4t": 4}


def tf_text() -> str:
    return "\n".join(p.read_text() for p in sorted(TF.glob("*.tf")))


def tf_resources(kind: str) -> dict[str, str]:
    """name -> block body of every `resource "<kind>" "<name>" { ... }` (brace matched)."""
    text = tf_text()
    out = {}
    for m in re.finditer(rf'resource\s+"{kind}"\s+"([\w-]+)"\s*{{', text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out[m.group(1)] = text[m.end():i - 1]
    return out


def tf_default(var: str) -> str:
    m = re.search(rf'variable\s+"{var}"\s*{{[^}}]*?default\s*=\s*"?([^"\n]+)"?', tf_text(), re.S)
    assert m, f"variable {var} has no default"
    return m.group(1).strip()


def topology_chips(topology: str) -> int:
    return math.prod(int(x) for x in topology.split("x"))


def yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def worker_groups(doc: dict) -> list[dict]:
    spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
    return spec["workerGroupSpecs"]


def head_group(doc: dict) -> dict:
    spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
    return spec["headGroupSpec"]


def test_terraform_fmt():
    """`terraform fmt -check -recursive deploy/terraform` passes (no providers needed)."""
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not installed on this machine")
    res = subprocess.run(["terraform", "fmt", "-check", "-recursive", str(TF)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"unformatted files: {res.stdout} {res.stderr}"


def test_every_referenced_pubsub_resource_exists():
    """References like google_pubsub_topic.X / _subscription.X name defined resources."""
    text = tf_text()
    for kind in ("google_pubsub_topic", "google_pubsub_subscription",
                 "google_monitoring_notification_channel", "google_service_account",
                 "google_logging_project_sink", "google_storage_bucket"):
        defined = set(tf_resources(kind))
        used = set(re.findall(rf"\b{kind}\.([\w-]+)\b", text))
        assert used <= defined, f"{kind}: undefined {sorted(used - defined)}"
    assert {"events", "alerts", "dead_letters"} <= set(tf_resources("google_pubsub_topic"))


def test_subscriptions_dead_letter_to_the_dead_letter_topic():
    """Both consumer subscriptions dead-letter; the Pub/Sub agent may publish there."""
    subs = tf_resources("google_pubsub_subscription")
    for name in ("events_run", "alerts_autoresume"):
        assert "dead_letter_topic     = google_pubsub_topic.dead_letters.id" in subs[name]
    grants = tf_resources("google_pubsub_topic_iam_member")
    assert any("dead_letters" in b and "gcp-sa-pubsub" in tf_text() for b in grants.values())


def test_alert_policies_notify_the_pubsub_channel_and_carry_labels():
    """Each alert policy -> the alerts channel, a known `kind` user label, grouping by run."""
    channels = tf_resources("google_monitoring_notification_channel")
    assert any('type         = "pubsub"' in b and "google_pubsub_topic.alerts.id" in b
               for b in channels.values())
    policies = tf_resources("google_monitoring_alert_policy")
    assert set(policies) == {"heartbeat_absent", "mfu_low", "loss_not_finite"}
    known_kinds = {k.value for k in IncidentKind}
    for name, body in policies.items():
        chans = re.findall(r"notification_channels\s*=\s*\[([^\]]*)\]", body)
        assert chans and all("google_monitoring_notification_channel." in c for c in chans), name
        kind = re.search(r'kind\s*=\s*"([\w_]+)"', body)
        assert kind and kind.group(1) == name and kind.group(1) in known_kinds
        assert "group_by_fields      = local.run_group_by" in body, name
        assert '"OPENED", "CLOSED"' in body, name
    assert '"metric.label.run_id"' in tf_text() and '"resource.label.job"' in tf_text()
    assert "/heartbeat" in policies["heartbeat_absent"]
    assert tf_default("metric_prefix") == "custom.googleapis.com/tpu_orchestrator"


def test_sinks_route_to_events_topic_with_publisher_grant():
    """Logging sinks publish to the events topic as their writer identity."""
    sinks = tf_resources("google_logging_project_sink")
    assert sinks and all("google_pubsub_topic.events.id" in b for b in sinks.values())
    assert all("unique_writer_identity = true" in b for b in sinks.values())
    grants = tf_resources("google_pubsub_topic_iam_member")
    assert "writer_identity" in grants["sink_publisher"]
    locals_text = tf_text()
    for needle in ("compute.instances.preempted", "HostMaintenance", "k8s_node"):
        assert needle in locals_text


def test_iam_is_least_privilege():
    """No owner/editor, no project-level pubsub roles; exactly the roles the workloads need."""
    text = tf_text()
    assert not re.search(r'roles/(owner|editor|pubsub\.admin|pubsub\.editor)', text)
    grants = tf_resources("google_project_iam_member")
    assert set(grants) == {"nodes", "orchestrator_metric_writer"}
    assert "roles/monitoring.metricWriter" in grants["orchestrator_metric_writer"]
    assert set(re.findall(r'"(roles/[^"]+)"', grants["nodes"])) == {
        "roles/container.defaultNodeServiceAccount", "roles/artifactregistry.reader"}
    for role in ("roles/pubsub.subscriber", "roles/pubsub.publisher",
                 "roles/monitoring.metricWriter", "roles/iam.workloadIdentityUser"):
        assert role in text


def test_worker_groups_match_topology():
    """numOfHosts x google.com/tpu per pod == chips of cloud.google.com/gke-tpu-topology."""
    groups_seen = 0
    for path in (KUBERAY / "raycluster-tpu.yaml", KUBERAY / "rayjob-example.yaml"):
        for doc in yaml_docs(path):
            for group in worker_groups(doc):
                pod = group["template"]["spec"]
                sel = pod["nodeSelector"]
                assert sel["cloud.google.com/gke-tpu-accelerator"].startswith("tpu-")
                chips = topology_chips(sel["cloud.google.com/gke-tpu-topology"])
                res = pod["containers"][0]["resources"]
                per_host = int(res["limits"]["google.com/tpu"])
                assert int(res["requests"]["google.com/tpu"]) == per_host
                assert group["numOfHosts"] * per_host == chips, group["groupName"]
                groups_seen += 1
    assert groups_seen >= 3
    cluster = yaml_docs(KUBERAY / "raycluster-tpu.yaml")[0]
    assert len(worker_groups(cluster)) == 2  # multislice


def test_kuberay_matches_terraform_node_pools():
    """The YAML's slices fit the Terraform TPU node pools (topology, hosts, chips per host)."""
    topology = tf_default("tpu_topology")
    hosts = int(tf_default("tpu_hosts_per_slice"))
    per_host = CHIPS_PER_HOST[tf_default("tpu_machine_type")]
    assert hosts * per_host == topology_chips(topology)
    cluster = yaml_docs(KUBERAY / "raycluster-tpu.yaml")[0]
    for group in worker_groups(cluster):
        assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == (
            topology)
        assert group["numOfHosts"] == hosts
    assert int(tf_default("tpu_slices")) == len(worker_groups(cluster))


def test_ray_head_not_publicly_exposed():
    """Head service is ClusterIP; no LoadBalancer/NodePort/Ingress anywhere in deploy/."""
    for path in KUBERAY.glob("*.yaml"):
        for doc in yaml_docs(path):
            assert doc["kind"] not in ("Ingress", "Gateway")
            if doc["kind"] in ("RayCluster", "RayJob"):
                assert head_group(doc)["serviceType"] == "ClusterIP"
            if doc["kind"] == "Service":
                assert doc["spec"].get("type", "ClusterIP") == "ClusterIP"
        assert "LoadBalancer" not in path.read_text() and "NodePort" not in path.read_text()


def test_ray_token_auth_on_every_pod():
    """Head, workers and the RayJob submitter: RAY_AUTH_MODE=token, the token as a read-only
    file from the cluster's own Secret (RAY_AUTH_TOKEN_PATH), never as an env var value."""
    for path in (KUBERAY / "raycluster-tpu.yaml", KUBERAY / "rayjob-example.yaml"):
        for doc in yaml_docs(path):
            groups = [head_group(doc), *worker_groups(doc)]
            pods = [g["template"]["spec"] for g in groups]
            if doc["kind"] == "RayJob":
                pods.append(doc["spec"]["submitterPodTemplate"]["spec"])
            for pod in pods:
                c = pod["containers"][0]
                env = {e["name"]: e for e in c["env"]}
                assert env["RAY_AUTH_MODE"]["value"] == "token"
                assert "RAY_AUTH_TOKEN" not in env
                token_dir = env["RAY_AUTH_TOKEN_PATH"]["value"].rsplit("/", 1)[0]
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == token_dir)
                assert mount["readOnly"] is True
                vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
                assert vol["secret"]["secretName"] == f"{doc['metadata']['name']}-ray-auth-token"


def test_autoresume_manifest_config_loads_and_matches():
    """The ConfigMap's autoresume.yaml is a valid AutoresumeConfig aimed at the head service."""
    docs = {d["kind"]: d for d in yaml_docs(KUBERAY / "autoresume.yaml")}
    cfg = build(AutoresumeConfig, yaml.safe_load(docs["ConfigMap"]["data"]["autoresume.yaml"]))
    cluster = yaml_docs(KUBERAY / "raycluster-tpu.yaml")[0]
    assert f"{cluster['metadata']['name']}-head-svc" in cfg.ray.address
    assert cfg.subscription.endswith("-alerts-autoresume")
    assert cfg.ray.auth_mode == "token"
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "orchestrator.autoresume"]
    assert docs["Deployment"]["spec"]["replicas"] == 1

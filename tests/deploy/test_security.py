"""The deployed system lets no one in (issue 16's security review), checked statically.

Terraform: dedicated node service account, private nodes, authorized networks, Dataplane V2,
no RAPID channel, a maintenance window, subscriptions that never expire, one events subscription
per run, sinks scoped to this cluster, no events-topic publisher for the workloads.
KubeRay: Pod Security "restricted" on the namespace, a security context on every pod, images
pinned by digest, default-deny NetworkPolicy, no Ray client port, the token never in git.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.test_deploy import (
    DEPLOY,
    KUBERAY,
    head_group,
    tf_resources,
    tf_text,
    worker_groups,
    yaml_docs,
)


def pod_specs() -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod template in deploy/kuberay."""
    out = []
    for path in sorted(KUBERAY.glob("*.yaml")):
        for doc in yaml_docs(path):
            where = f"{path.name}:{doc['kind']}"
            if doc["kind"] in ("RayCluster", "RayJob"):
                for g in (head_group(doc), *worker_groups(doc)):
                    out.append((where, g["template"]["spec"]))
                if doc["kind"] == "RayJob":
                    out.append((where, doc["spec"]["submitterPodTemplate"]["spec"]))
            if doc["kind"] == "Deployment":
                out.append((where, doc["spec"]["template"]["spec"]))
    return out


def test_node_pools_run_as_a_dedicated_service_account():
    """Every node config names google_service_account.nodes (not the Compute default SA)."""
    text = tf_text()
    configs = re.findall(r"node_config\s*{([^}]*(?:{[^}]*}[^}]*)*)}", text)
    assert len(configs) == 3, configs  # cluster default pool, cpu pool, TPU pools
    for body in configs:
        assert "service_account = google_service_account.nodes.email" in " ".join(body.split())
    assert "nodes" in tf_resources("google_service_account")
    assert "-compute@developer.gserviceaccount.com" not in text


def test_cluster_is_private_authorized_dataplane_v2_and_upgrades_in_a_window():
    """Private nodes, authorized networks, ADVANCED_DATAPATH, REGULAR channel, a window."""
    body = tf_resources("google_container_cluster")["this"]
    assert "enable_private_nodes    = true" in body
    assert "master_authorized_networks_config" in body
    assert 'datapath_provider = "ADVANCED_DATAPATH"' in body
    assert 'channel = "RAPID"' not in body and 'channel = "REGULAR"' in body
    assert "maintenance_policy" in body and "recurring_window" in body
    assert "private_ip_google_access = true" in tf_resources(
        "google_compute_subnetwork")["nodes"]


def test_no_subscription_expires():
    """Every subscription sets expiration_policy ttl = "" (the default expires in 31 days)."""
    subs = tf_resources("google_pubsub_subscription")
    assert set(subs) == {"events_run", "alerts_autoresume", "dead_letters_inspect"}
    for name, body in subs.items():
        assert re.search(r'expiration_policy\s*{\s*ttl\s*=\s*""', body), name


def test_one_events_subscription_per_run_filtered_by_job():
    """events_run: for_each run, name <name>-events-<run>, operator events of other runs out."""
    body = tf_resources("google_pubsub_subscription")["events_run"]
    assert "for_each                   = var.runs" in body
    assert 'name                       = "${var.name}-events-${each.key}"' in body
    assert 'filter                     = "NOT attributes:job OR attributes.job' in body
    grants = tf_resources("google_pubsub_subscription_iam_member")
    assert "google_pubsub_subscription.events_run" in grants["orchestrator_events_subscriber"]


def test_workloads_cannot_publish_events():
    """No Google SA of ours may publish to the events topic; only the Logging sinks may."""
    for name, body in tf_resources("google_pubsub_topic_iam_member").items():
        if "google_pubsub_topic.events" in body:
            assert "writer_identity" in body, name
        assert "google_service_account." not in body, name


def test_log_sinks_are_scoped_to_this_cluster():
    """VM sinks name the zone and the cluster's node-name prefix; node events its name."""
    text = tf_text()
    assert 'resource.labels.zone=\\"${var.zone}\\"' in text
    assert 'protoPayload.resourceName:\\"/instances/${local.node_prefix}\\"' in text
    assert "${local.this_cluster_vms} AND" in text
    assert 'resource.labels.cluster_name=\\"${var.name}\\"' in text


@pytest.mark.parametrize("where,pod", pod_specs())
def test_every_pod_runs_restricted(where, pod):
    """Non-root, seccomp RuntimeDefault, no privilege escalation, all capabilities dropped,
    no Kubernetes API token, images pinned by digest, no Ray client port."""
    sec = pod["securityContext"]
    assert sec["runAsNonRoot"] is True and sec["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for c in pod["containers"]:
        cs = c["securityContext"]
        assert cs["allowPrivilegeEscalation"] is False and cs["capabilities"]["drop"] == ["ALL"]
        assert not cs.get("privileged", False)
        assert "@sha256:" in c["image"] and ":latest" not in c["image"], (where, c["image"])
        assert all(p["containerPort"] != 10001 for p in c.get("ports", ())), where


def test_namespace_enforces_restricted_and_network_policy_denies_by_default():
    """Pod Security restricted; default-deny ingress; the job API only for autoresume."""
    (ns,) = yaml_docs(KUBERAY / "namespace.yaml")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    policies = {d["metadata"]["name"]: d for d in yaml_docs(KUBERAY / "networkpolicy.yaml")}
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny
    api = policies["job-api-from-autoresume"]["spec"]
    assert [p["port"] for p in api["ingress"][0]["ports"]] == [8265]
    assert "10001" not in (KUBERAY / "networkpolicy.yaml").read_text().split("port 10001")[0]


def test_token_file_is_never_committed():
    """deploy/kuberay/.gitignore ignores token files; the README writes it outside the repo."""
    ignore = (KUBERAY / ".gitignore").read_text().split()
    assert "ray-token" in ignore and "*token*" in ignore
    readme = (DEPLOY / "README.md").read_text()
    assert "> ray-token" not in readme
    assert "RAY_AUTH_TOKEN_PATH" in readme

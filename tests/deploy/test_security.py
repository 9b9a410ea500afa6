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
import yaml

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
    api = policies["tpu-orchestrator-job-api"]["spec"]
    assert [p["port"] for p in api["ingress"][0]["ports"]] == [8265]
    assert "10001" not in (KUBERAY / "networkpolicy.yaml").read_text().split("port 10001")[0]


def test_token_file_is_never_committed():
    """deploy/kuberay/.gitignore ignores token files; the README writes it outside the repo."""
    ignore = (KUBERAY / ".gitignore").read_text().split()
    assert "ray-token" in ignore and "*token*" in ignore
    readme = (DEPLOY / "README.md").read_text()
    assert "> ray-token" not in readme
    assert "RAY_AUTH_TOKEN_PATH" in readme


# --- finding 11 (issue 29): one cluster per policy, token and key per cluster, egress, metrics


def ray_clusters() -> list[tuple[str, dict[str, str], dict]]:
    """(cluster name, the pod labels that select exactly its Ray pods, the RayCluster/RayJob doc).

    A RayCluster's pods carry `ray.io/cluster: <its name>`; a RayJob's cluster gets a generated
    name (`<job>-raycluster-<random>`), so its pod templates carry
    `tpu-orchestrator/ray-cluster`."""
    out = []
    for path in (KUBERAY / "raycluster-tpu.yaml", KUBERAY / "rayjob-example.yaml"):
        for doc in yaml_docs(path):
            name = doc["metadata"]["name"]
            key = ("ray.io/cluster" if doc["kind"] == "RayCluster"
                   else "tpu-orchestrator/ray-cluster")
            out.append((name, {key: name}, doc))
    return out


def network_policies() -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"] for d in yaml_docs(KUBERAY / "networkpolicy.yaml")}


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A podSelector of matchLabels only (no expressions) that pods with `labels` match."""
    assert "matchExpressions" not in selector, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def ray_pod_templates(doc: dict) -> list[dict]:
    return [g["template"] for g in (head_group(doc), *worker_groups(doc))]


def test_network_policies_name_exact_clusters_never_any_ray_cluster():
    """No selector matches "any pod with a ray.io/cluster label" (`Exists`): each cluster's Ray
    pods are admitted by, and only from, pods labelled with that cluster's own name."""
    text = (KUBERAY / "networkpolicy.yaml").read_text()
    assert "Exists" not in text and "matchExpressions" not in text
    policies = network_policies()
    for name, labels, doc in ray_clusters():
        for template in ray_pod_templates(doc):
            if doc["kind"] == "RayJob":
                assert template["metadata"]["labels"].items() >= labels.items(), name
        spec = policies[f"{name}-ingress"]
        assert spec["podSelector"] == {"matchLabels": labels}
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": labels}}]}]
    names = [n for n, _, _ in ray_clusters()]
    assert len(set(names)) == len(names) == 2


def test_job_api_admits_only_autoresume_or_the_clusters_own_submitter():
    """8265 of a cluster's head: from autoresume (the RayCluster it is configured for) or from
    that RayJob's submitter pod, never from every pod of the deployment."""
    policies = network_policies()
    submitters = {}
    for name, labels, doc in ray_clusters():
        spec = policies[f"{name}-job-api"]
        assert spec["podSelector"] == {"matchLabels": {**labels, "ray.io/node-type": "head"}}
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8265}]
        sources = [s["podSelector"]["matchLabels"] for s in rule["from"]]
        assert all(set(s) != {"app.kubernetes.io/part-of"} for s in sources), name
        if doc["kind"] == "RayJob":
            submitter = doc["spec"]["submitterPodTemplate"]["metadata"]["labels"]
            assert sources == [{"tpu-orchestrator/submitter-of": name}]
            assert submitter["tpu-orchestrator/submitter-of"] == name
            assert not any(k in submitter for k in labels), "the submitter is not a Ray pod"
            submitters[name] = sources[0]
        else:
            assert sources == [{"app": "tpu-autoresume"}]
    assert submitters


def egress_rules_of(policies: dict[str, dict], pod_labels: dict[str, str]) -> list[dict]:
    return [rule for spec in policies.values() if "Egress" in spec["policyTypes"]
            and selects(spec["podSelector"], pod_labels) for rule in spec.get("egress", [])]


GOOGLE_APIS = {"ipBlock": {"cidr": "199.36.153.8/30"}}  # private.googleapis.com (terraform dns.tf)
DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
       "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
JOB_API = [{"protocol": "TCP", "port": 8265}]


def assert_egress_is_only(rules: list[dict], allowed: list[tuple[list, list]]) -> None:
    got = [(rule["to"], rule.get("ports", [])) for rule in rules]
    assert sorted(map(repr, got)) == sorted(map(repr, allowed))


def platform_egress(*peers: tuple[dict, list]) -> list[tuple[list, list]]:
    """DNS, the GKE metadata server (Workload Identity tokens; Cloud DNS for GKE answers there
    too), Google APIs on 443, plus `peers`."""
    return [
        ([DNS], DNS_PORTS),
        ([{"ipBlock": {"cidr": "169.254.169.254/32"}}],
         [{"protocol": "TCP", "port": 80}, *DNS_PORTS]),
        ([{"ipBlock": {"cidr": "169.254.169.252/32"}}], [{"protocol": "TCP", "port": 988}]),
        ([GOOGLE_APIS], [{"protocol": "TCP", "port": 443}]),
        *[([peer], ports) for peer, ports in peers],
    ]


def test_egress_is_denied_by_default_and_allowed_per_destination():
    """Default-deny egress for the namespace; a Ray pod may reach DNS, the GKE metadata server,
    Google APIs on 443 (private.googleapis.com only) and its own cluster's pods; autoresume the
    same but its cluster's job API instead of the pods; a submitter DNS and its head's API."""
    policies = network_policies()
    assert policies["default-deny-egress"] == {"podSelector": {}, "policyTypes": ["Egress"]}
    assert "0.0.0.0/0" not in (KUBERAY / "networkpolicy.yaml").read_text()
    autoresume_head = None
    for _name, labels, doc in ray_clusters():
        for template in ray_pod_templates(doc):
            pod_labels = {**template["metadata"]["labels"], **labels}
            assert_egress_is_only(egress_rules_of(policies, pod_labels),
                                  platform_egress(({"podSelector": {"matchLabels": labels}}, [])))
        head = {"podSelector": {"matchLabels": {**labels, "ray.io/node-type": "head"}}}
        if doc["kind"] == "RayJob":
            submitter = doc["spec"]["submitterPodTemplate"]["metadata"]["labels"]
            assert_egress_is_only(egress_rules_of(policies, submitter),
                                  [([DNS], DNS_PORTS), ([head], JOB_API)])
        else:
            autoresume_head = head
    assert_egress_is_only(egress_rules_of(policies, {"app": "tpu-autoresume"}),
                          platform_egress((autoresume_head, JOB_API)))


def test_google_apis_resolve_to_the_private_range_the_egress_policy_names():
    """Terraform: *.googleapis.com -> private.googleapis.com (199.36.153.8/30) in a private zone
    of the cluster's VPC, routed through Private Google Access: 443 to that /30 is Google APIs."""
    zones = tf_resources("google_dns_managed_zone")
    assert 'dns_name   = "googleapis.com."' in zones["googleapis"]
    assert 'visibility = "private"' in zones["googleapis"]
    assert "google_compute_network.this.id" in zones["googleapis"]
    records = tf_resources("google_dns_record_set")
    assert '"199.36.153.8", "199.36.153.9", "199.36.153.10", "199.36.153.11"' in (
        records["private_googleapis"])
    assert 'name         = "*.googleapis.com."' in records["googleapis_cname"]
    assert '"private.googleapis.com."' in records["googleapis_cname"]
    route = tf_resources("google_compute_route")["private_googleapis"]
    assert 'dest_range       = "199.36.153.8/30"' in route
    assert "dns.googleapis.com" in tf_text()


def secret_volume(pod: dict, container: dict, mount_dir: str) -> tuple[dict, dict]:
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == mount_dir)
    return mount, next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]


def test_each_cluster_has_its_own_token_secret():
    """Every pod of a cluster (and its submitter) mounts `<cluster>-ray-auth-token`; autoresume
    mounts the token of the one cluster its job API address names."""
    seen = set()
    for name, _, doc in ray_clusters():
        pods = [t["spec"] for t in ray_pod_templates(doc)]
        if doc["kind"] == "RayJob":
            pods.append(doc["spec"]["submitterPodTemplate"]["spec"])
        for pod in pods:
            c = pod["containers"][0]
            env = {e["name"]: e.get("value") for e in c["env"]}
            _, secret = secret_volume(pod, c, env["RAY_AUTH_TOKEN_PATH"].rsplit("/", 1)[0])
            assert secret["secretName"] == f"{name}-ray-auth-token"
            seen.add(secret["secretName"])
    assert len(seen) == 2
    docs = {d["kind"]: d for d in yaml_docs(KUBERAY / "autoresume.yaml")}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    _, secret = secret_volume(pod, pod["containers"][0], "/etc/ray-auth")
    cfg = yaml.safe_load(docs["ConfigMap"]["data"]["autoresume.yaml"])
    cluster = secret["secretName"].removesuffix("-ray-auth-token")
    assert cfg["ray"]["address"].startswith(f"http://{cluster}-head-svc.")
    for path in KUBERAY.glob("*.yaml"):  # no Secret shared by every cluster of the namespace
        assert not re.search(r"secretName: ray-auth-token\b", path.read_text()), path.name


def test_executables_key_is_a_per_cluster_secret_mounted_read_only():
    """Head and worker pods: `<cluster>-tpu-orch-executables-key` mounted read-only, file mode
    0400, its path in TPU_ORCH_EXECUTABLES_KEY (finding 1: the key stays outside the store);
    no other pod (submitter, autoresume) gets it."""
    for name, _, doc in ray_clusters():
        for template in ray_pod_templates(doc):
            pod = template["spec"]
            c = pod["containers"][0]
            env = {e["name"]: e.get("value") for e in c["env"]}
            path = env["TPU_ORCH_EXECUTABLES_KEY"]
            mount, secret = secret_volume(pod, c, path.rsplit("/", 1)[0])
            assert mount["readOnly"] is True
            assert secret["secretName"] == f"{name}-tpu-orch-executables-key"
            assert secret["defaultMode"] == 0o400
            assert [i["path"] for i in secret.get("items", [{"path": "key"}])] == ["key"]
            assert path.rsplit("/", 1)[1] == "key"
        if doc["kind"] == "RayJob":
            assert "executables-key" not in repr(doc["spec"]["submitterPodTemplate"])
    assert "executables-key" not in (KUBERAY / "autoresume.yaml").read_text()


def test_alerts_trust_only_series_written_by_this_clusters_service_account():
    """Cloud Monitoring grants metric writes per project (no narrower resource, no IAM condition),
    so the heartbeat alerts live in a metrics project of their own where the orchestrator's
    service account is the only metric writer; never the cluster's project (whose node service
    account and any other workload may write metrics)."""
    grants = tf_resources("google_project_iam_member")
    writer = grants["orchestrator_metric_writer"]
    assert "project = var.metrics_project_id" in " ".join(writer.split())
    assert "google_service_account.orchestrator.email" in writer
    assert "var.metrics_project_id != var.project_id" in writer  # a precondition
    assert sum("roles/monitoring.metricWriter" in b for b in grants.values()) == 1
    for kind in ("google_monitoring_alert_policy", "google_monitoring_notification_channel"):
        for name, body in tf_resources(kind).items():
            assert re.search(r"^\s*project\s*=\s*var\.metrics_project_id$", body, re.M), name
    publisher = tf_resources("google_pubsub_topic_iam_member")["monitoring_notifier_publisher"]
    assert "data.google_project.metrics.number" in publisher
    docs = {d["kind"]: d for d in yaml_docs(KUBERAY / "autoresume.yaml")}
    origin = yaml.safe_load(docs["ConfigMap"]["data"]["autoresume.yaml"])["origin"]
    assert origin["project"] == "METRICS_PROJECT"  # the alerts' scoping project, not PROJECT_ID
    readme = (DEPLOY / "README.md").read_text()
    assert "metrics.cloud_monitoring.project=$METRICS_PROJECT" in readme
    assert "cannot scope metric writes" in readme

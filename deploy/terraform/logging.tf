# Cloud Logging sinks that route the platform's own signals to the events topic, where each run's
# event intake parses them (orchestrator/events). Each sink writes as its own identity, which is
# granted publisher on the events topic only.
#
# Scoped to THIS cluster: VM events only for instances whose name starts with the cluster's node
# prefix (GKE names node VMs gke-<cluster>-<pool>-...) in the TPU zone, node events only for this
# cluster. The project's other VMs never reach the runs.

locals {
  node_prefix = var.node_name_prefix != "" ? var.node_name_prefix : "gke-${var.name}-"
  this_cluster_vms = join(" AND ", [
    "resource.type=\"gce_instance\"",
    "resource.labels.zone=\"${var.zone}\"",
    "protoPayload.resourceName:\"/instances/${local.node_prefix}\"",
  ])
  event_sinks = {
    # Spot / preemptible VM reclaimed (GKE TPU nodes are GCE VMs).
    preemption = "${local.this_cluster_vms} AND protoPayload.methodName=\"compute.instances.preempted\""
    # Host maintenance: live migration, terminate-on-maintenance, host errors.
    maintenance = "${local.this_cluster_vms} AND protoPayload.methodName=(\"compute.instances.migrateOnHostMaintenance\" OR \"compute.instances.terminateOnHostMaintenance\" OR \"compute.instances.hostError\" OR \"compute.instances.upcomingMaintenance\")"
    # Kubernetes node events of this cluster (node lost, not ready, preempted, being removed).
    gke_node = join(" AND ", [
      "resource.type=\"k8s_node\"",
      "resource.labels.cluster_name=\"${var.name}\"",
      "resource.labels.location=\"${var.region}\"",
      "logName=\"projects/${var.project_id}/logs/events\"",
      "jsonPayload.reason=(\"NodeNotReady\" OR \"Preempted\" OR \"TerminatingEvictedPod\" OR \"RemovingNode\" OR \"NodeShutdown\")",
    ])
  }
}

resource "google_logging_project_sink" "events" {
  for_each               = local.event_sinks
  name                   = "${var.name}-${replace(each.key, "_", "-")}"
  destination            = "pubsub.googleapis.com/${google_pubsub_topic.events.id}"
  filter                 = each.value
  unique_writer_identity = true
}

resource "google_pubsub_topic_iam_member" "sink_publisher" {
  for_each = google_logging_project_sink.events
  topic    = google_pubsub_topic.events.id
  role     = "roles/pubsub.publisher"
  member   = each.value.writer_identity
}

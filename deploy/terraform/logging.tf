# Cloud Logging sinks that route the platform's own signals to the events topic, where the driver's
# event intake parses them (orchestrator/events). Each sink writes as its own identity, which is
# granted publisher on the events topic only.

locals {
  event_sinks = {
    # Spot / preemptible VM reclaimed (GKE TPU nodes are GCE VMs; TPU VM API events too).
    preemption = join(" OR ", [
      "(resource.type=\"gce_instance\" AND protoPayload.methodName=\"compute.instances.preempted\")",
      "(resource.type=\"tpu_worker\" AND protoPayload.methodName:\"preempted\")",
    ])
    # Host maintenance: live migration, terminate-on-maintenance, host errors.
    maintenance = join(" OR ", [
      "(resource.type=\"gce_instance\" AND protoPayload.methodName=(\"compute.instances.migrateOnHostMaintenance\" OR \"compute.instances.terminateOnHostMaintenance\" OR \"compute.instances.hostError\"))",
      "(resource.type=\"tpu_worker\" AND protoPayload.methodName:\"maintenance\")",
    ])
    # Kubernetes node events of the cluster (node lost, not ready, preempted, being removed).
    gke_node = join(" AND ", [
      "resource.type=\"k8s_node\"",
      "resource.labels.cluster_name=\"${var.name}\"",
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

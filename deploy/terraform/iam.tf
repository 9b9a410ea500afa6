# Least privilege:
#   nodes (the GKE node VMs): write logs and metrics, pull images - roles/container.
#     defaultNodeServiceAccount and Artifact Registry reader, nothing else (not the Compute
#     Engine default service account, often project Editor).
#   tpu-orchestrator (driver + host actors, via Workload Identity): pull its run's events
#     subscription, write metrics in the metrics project only, read/write the runs bucket. It may
#     NOT publish to the events topic: any Ray job could then drain every run. Operators publish
#     with their own credentials. It is the only metric writer of the metrics project, so the
#     heartbeat alerts there can only be fed (or kept quiet) by this cluster's own jobs: Cloud
#     Monitoring has no narrower grant than a project (no per-metric or per-series IAM, no IAM
#     condition on time series), and a time series records no writer an alert could filter on.
#   tpu-autoresume: pull the alerts subscription, read the runs bucket.

resource "google_service_account" "nodes" {
  account_id   = "${var.name}-nodes"
  display_name = "TPU orchestrator GKE nodes"
}

resource "google_service_account" "orchestrator" {
  account_id   = "tpu-orchestrator"
  display_name = "TPU orchestrator (Ray driver and host actors)"
}

resource "google_service_account" "autoresume" {
  account_id   = "tpu-autoresume"
  display_name = "TPU orchestrator autoresume service"
}

resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/container.defaultNodeServiceAccount",
    "roles/artifactregistry.reader",
  ])
  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_storage_bucket" "runs" {
  name                        = "${var.project_id}-${var.name}-runs"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
}

# One grant per run's own events subscription (pubsub.tf).
resource "google_pubsub_subscription_iam_member" "orchestrator_events_subscriber" {
  for_each     = google_pubsub_subscription.events_run
  subscription = each.value.id
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.orchestrator.email}"
}

resource "google_project_iam_member" "orchestrator_metric_writer" {
  project = var.metrics_project_id
  role    = "roles/monitoring.metricWriter"
  member  = "serviceAccount:${google_service_account.orchestrator.email}"
  lifecycle {
    precondition {
      condition     = var.metrics_project_id != var.project_id
      error_message = "metrics_project_id must be a project of its own, not project_id: there the node service account and other workloads may write metrics too, and could fake or silence a run's heartbeat."
    }
  }
}

resource "google_storage_bucket_iam_member" "orchestrator_runs" {
  bucket = google_storage_bucket.runs.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.orchestrator.email}"
}

resource "google_pubsub_subscription_iam_member" "autoresume_alerts_subscriber" {
  subscription = google_pubsub_subscription.alerts_autoresume.id
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${google_service_account.autoresume.email}"
}

resource "google_storage_bucket_iam_member" "autoresume_runs" {
  bucket = google_storage_bucket.runs.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.autoresume.email}"
}

# Workload Identity: the Kubernetes service accounts act as the Google service accounts.
resource "google_service_account_iam_member" "orchestrator_wi" {
  service_account_id = google_service_account.orchestrator.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/tpu-orchestrator]"
  depends_on         = [google_container_cluster.this]
}

resource "google_service_account_iam_member" "autoresume_wi" {
  service_account_id = google_service_account.autoresume.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/tpu-autoresume]"
  depends_on         = [google_container_cluster.this]
}

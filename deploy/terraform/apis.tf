locals {
  services = [
    "container.googleapis.com",
    "tpu.googleapis.com",
    "pubsub.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
    "dns.googleapis.com",
  ]
}

resource "google_project_service" "apis" {
  for_each           = toset(local.services)
  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

# The metrics project (variables.tf, metrics_project_id) holds the alert policies and receives the
# orchestrator's custom metrics.
resource "google_project_service" "metrics_monitoring" {
  project            = var.metrics_project_id
  service            = "monitoring.googleapis.com"
  disable_on_destroy = false
}

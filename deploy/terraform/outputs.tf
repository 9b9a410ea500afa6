output "events_topic" {
  value = google_pubsub_topic.events.id
}

output "events_subscriptions" {
  description = "Per run: events.pubsub.subscription = the short name (last path part)."
  value       = { for run, sub in google_pubsub_subscription.events_run : run => sub.name }
}

output "alerts_subscription" {
  description = "Put in deploy/kuberay/autoresume.yaml: subscription."
  value       = google_pubsub_subscription.alerts_autoresume.id
}

output "dead_letters_topic" {
  value = google_pubsub_topic.dead_letters.id
}

output "metrics_project" {
  description = "metrics.cloud_monitoring.project of every run, and autoresume's origin.project."
  value       = var.metrics_project_id
}

output "runs_bucket" {
  value = google_storage_bucket.runs.name
}

output "orchestrator_service_account" {
  value = google_service_account.orchestrator.email
}

output "node_service_account" {
  value = google_service_account.nodes.email
}

output "autoresume_service_account" {
  value = google_service_account.autoresume.email
}

output "get_credentials" {
  value = "gcloud container clusters get-credentials ${google_container_cluster.this.name} --region ${var.region} --project ${var.project_id}"
}

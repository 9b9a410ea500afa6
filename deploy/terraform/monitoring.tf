# Alert policies on the orchestrator's custom metrics, notifying a Pub/Sub channel (the alerts
# topic) that the autoresume service pulls.
#
# They live in the metrics project (var.metrics_project_id), and the driver writes its metrics
# there (metrics.cloud_monitoring.project): a policy sees only the series of its own metrics scope,
# and the only identity that may write series in that project is this cluster's orchestrator
# service account (iam.tf). Autoresume accepts incidents only from that scoping project
# (origin.project). Keep the project empty of other workloads and add no monitored projects to it.
#
# Contract with orchestrator/autoresume (deploy/README.md, "Alert labels"):
#   * every condition aggregates by resource.label.job (generic_task, written by the metric
#     exporter) and metric.label.run_id, so the incident's `resource.labels.job` /
#     `metric.labels.run_id` name the run - autoresume finds RUN_DIR/run.json by them;
#   * every policy carries `user_labels.kind` (heartbeat_absent, mfu_low, loss_not_finite): the
#     notification repeats them as `policy_user_labels`, and autoresume acts on the kind.

resource "google_monitoring_notification_channel" "alerts_pubsub" {
  project      = var.metrics_project_id
  display_name = "${var.name} alerts to Pub/Sub"
  type         = "pubsub"
  labels = {
    topic = google_pubsub_topic.alerts.id
  }
  depends_on = [google_project_service.apis, google_project_service.metrics_monitoring]
}

# Cloud Monitoring publishes as the notification service agent of the metrics project.
resource "google_pubsub_topic_iam_member" "monitoring_notifier_publisher" {
  topic  = google_pubsub_topic.alerts.id
  role   = "roles/pubsub.publisher"
  member = "serviceAccount:service-${data.google_project.metrics.number}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
}

locals {
  # generic_task resource label `job` (the exporter's run name) and the optional run_id metric label.
  run_group_by = ["resource.label.job", "metric.label.run_id"]
}

resource "google_monitoring_alert_policy" "heartbeat_absent" {
  project      = var.metrics_project_id
  display_name = "${var.name}: heartbeat absent"
  combiner     = "OR"
  user_labels = {
    kind = "heartbeat_absent"
    app  = "tpu-orchestrator"
  }

  conditions {
    display_name = "heartbeat metric absent"
    condition_absent {
      filter   = "metric.type=\"${var.metric_prefix}/heartbeat\" AND resource.type=\"${var.metric_resource_type}\""
      duration = var.heartbeat_absent_for
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = local.run_group_by
      }
      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close           = "1800s"
    notification_prompts = ["OPENED", "CLOSED"]
  }

  notification_channels = [google_monitoring_notification_channel.alerts_pubsub.id]

  documentation {
    content   = "The training run stopped reporting heartbeats. The autoresume service resubmits it from its latest checkpoint (deploy/README.md)."
    mime_type = "text/markdown"
  }
}

resource "google_monitoring_alert_policy" "mfu_low" {
  project      = var.metrics_project_id
  display_name = "${var.name}: MFU below threshold"
  combiner     = "OR"
  user_labels = {
    kind = "mfu_low"
    app  = "tpu-orchestrator"
  }

  conditions {
    display_name = "MFU below ${var.mfu_threshold}"
    condition_threshold {
      filter          = "metric.type=\"${var.metric_prefix}/mfu\" AND resource.type=\"${var.metric_resource_type}\""
      comparison      = "COMPARISON_LT"
      threshold_value = var.mfu_threshold
      duration        = var.mfu_duration
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_MEAN"
        cross_series_reducer = "REDUCE_MEAN"
        group_by_fields      = local.run_group_by
      }
      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close           = "3600s"
    notification_prompts = ["OPENED", "CLOSED"]
  }

  notification_channels = [google_monitoring_notification_channel.alerts_pubsub.id]

  documentation {
    content   = "Model FLOPs utilization stayed below the threshold. Autoresume does not restart on this (a human looks)."
    mime_type = "text/markdown"
  }
}

resource "google_monitoring_alert_policy" "loss_not_finite" {
  project      = var.metrics_project_id
  display_name = "${var.name}: loss not finite"
  combiner     = "OR"
  user_labels = {
    kind = "loss_not_finite"
    app  = "tpu-orchestrator"
  }

  conditions {
    display_name = "loss above ${var.loss_ceiling} (NaN/Inf are exported above it)"
    condition_threshold {
      filter          = "metric.type=\"${var.metric_prefix}/loss\" AND resource.type=\"${var.metric_resource_type}\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.loss_ceiling
      duration        = "0s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = local.run_group_by
      }
      trigger {
        count = 1
      }
    }
  }

  alert_strategy {
    auto_close           = "3600s"
    notification_prompts = ["OPENED", "CLOSED"]
  }

  notification_channels = [google_monitoring_notification_channel.alerts_pubsub.id]

  documentation {
    content   = "The training loss is not finite. Autoresume does not restart on this (resuming would replay the divergence)."
    mime_type = "text/markdown"
  }
}

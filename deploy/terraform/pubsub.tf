# Topics: `events` (preemption/maintenance/node events from Logging sinks + our own JSON events),
# `alerts` (Cloud Monitoring notifications), `dead-letters` (messages no consumer could take).

resource "google_pubsub_topic" "events" {
  name       = "${var.name}-events"
  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic" "alerts" {
  name       = "${var.name}-alerts"
  depends_on = [google_project_service.apis]
}

resource "google_pubsub_topic" "dead_letters" {
  name       = "${var.name}-dead-letters"
  depends_on = [google_project_service.apis]
}

# The driver's event intake (events.pubsub.subscription in the run config).
resource "google_pubsub_subscription" "events_driver" {
  name                       = "${var.name}-events-driver"
  topic                      = google_pubsub_topic.events.id
  ack_deadline_seconds       = 30
  message_retention_duration = "3600s"

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letters.id
    max_delivery_attempts = 10
  }

  retry_policy {
    minimum_backoff = "1s"
    maximum_backoff = "60s"
  }
}

# The autoresume service's intake.
resource "google_pubsub_subscription" "alerts_autoresume" {
  name                       = "${var.name}-alerts-autoresume"
  topic                      = google_pubsub_topic.alerts.id
  ack_deadline_seconds       = 60
  message_retention_duration = "86400s"

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letters.id
    max_delivery_attempts = 10
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }
}

# Keeps dead letters for an operator to inspect (`gcloud pubsub subscriptions pull`).
resource "google_pubsub_subscription" "dead_letters_inspect" {
  name                       = "${var.name}-dead-letters-inspect"
  topic                      = google_pubsub_topic.dead_letters.id
  message_retention_duration = "604800s"
}

# Dead-lettering is done by the Pub/Sub service agent: it must publish to the dead-letter topic and
# subscribe to (ack on) the source subscriptions.
locals {
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

resource "google_pubsub_topic_iam_member" "dead_letters_publisher" {
  topic  = google_pubsub_topic.dead_letters.id
  role   = "roles/pubsub.publisher"
  member = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "events_driver_dlq_subscriber" {
  subscription = google_pubsub_subscription.events_driver.id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "alerts_autoresume_dlq_subscriber" {
  subscription = google_pubsub_subscription.alerts_autoresume.id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

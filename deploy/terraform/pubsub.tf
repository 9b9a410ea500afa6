# Topics: `events` (preemption/maintenance/node events from Logging sinks + operator events),
# `alerts` (Cloud Monitoring notifications), `dead-letters` (messages no consumer could take).
#
# Every run has its OWN subscription to the events topic, `<name>-events-<run>` (run = run.name,
# listed in var.runs): Pub/Sub gives each subscription a copy of every message, so two runs never
# take (and ack) each other's preemption notices. The filter drops operator events addressed to
# another run (attribute `job`); platform events (no `job` attribute) reach every run, and each
# driver decides by host whether one is its own. No subscription expires when idle.

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

# events.pubsub.subscription of run R = "${var.name}-events-R" (terraform output).
resource "google_pubsub_subscription" "events_run" {
  for_each                   = var.runs
  name                       = "${var.name}-events-${each.key}"
  topic                      = google_pubsub_topic.events.id
  filter                     = "NOT attributes:job OR attributes.job = \"${each.key}\""
  ack_deadline_seconds       = 30
  message_retention_duration = "3600s"

  expiration_policy {
    ttl = "" # never expires while idle (the default is 31 days)
  }

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

  expiration_policy {
    ttl = ""
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letters.id
    max_delivery_attempts = 10
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }
}

# Keeps dead letters 7 days for an operator to inspect (`gcloud pubsub subscriptions pull
# --auto-ack`, deploy/README.md). Nobody pulls it routinely, so it must never expire.
resource "google_pubsub_subscription" "dead_letters_inspect" {
  name                       = "${var.name}-dead-letters-inspect"
  topic                      = google_pubsub_topic.dead_letters.id
  message_retention_duration = "604800s"

  expiration_policy {
    ttl = ""
  }
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

resource "google_pubsub_subscription_iam_member" "events_run_dlq_subscriber" {
  for_each     = google_pubsub_subscription.events_run
  subscription = each.value.id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "alerts_autoresume_dlq_subscriber" {
  subscription = google_pubsub_subscription.alerts_autoresume.id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}
